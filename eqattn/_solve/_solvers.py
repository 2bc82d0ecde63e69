r"""Fixed-point solvers for $x = f(x)$ on a flat vector $x$.

The iteration loop is ours rather than jaxopt's `FixedPointIteration` / `AndersonAcceleration` /
`Broyden`: those stop on an absolute, whole-pytree $\lVert x_{k+1} - x_k\rVert$ and return the
last iterate, whereas eqattn needs the relative test $\lVert f(x) - x\rVert \le \mathrm{atol} +
\mathrm{rtol}\lVert f(x)\rVert$ (per example under `vmap`), the iterate that test rates best, a stop on
NaN/Inf, and a step budget that can change between calls without recompiling. Each solver is an
`eqx.Module` with `init` / `step`, as in Optimistix; the loop (`_loop.py`) is shared. jaxopt's and
Optimistix's solvers can be used too (`_backends.py`).
"""

from __future__ import annotations

import abc
from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array

State = Any


class AbstractFixedPointSolver(eqx.Module):
    r"""A solver for $x = f(x)$. Concrete solvers carry `rtol`, `atol`, `max_steps`,
    `check_every` (how many steps the loop takes between two stopping tests) and `elementwise`
    (the stopping test: False, the whole state's $\lVert f(x) - x\rVert_2 \le \mathrm{atol} +
    \mathrm{rtol}\lVert f(x)\rVert_2$; True, every entry's $|f(x)_k - x_k| \le \mathrm{atol}
    + \mathrm{rtol}|f(x)_k|$, Optimistix's test with the max norm: for a state whose parts
    settle one after another, such as a front crossing a graph, which is small against the
    whole; its answer is then the latest finite iterate, not the best-ranked one)."""

    rtol: eqx.AbstractVar[float]
    atol: eqx.AbstractVar[float]
    max_steps: eqx.AbstractVar[int]
    check_every: eqx.AbstractVar[int]
    elementwise: eqx.AbstractVar[bool]

    @abc.abstractmethod
    def init(self, x: Array, fx: Array) -> State:
        """State after the first evaluation $f(x_0)$."""

    @abc.abstractmethod
    def step(self, x: Array, fx: Array, state: State) -> tuple[Array, State]:
        """The next iterate from the current one and its image."""

    def record(self, x: Array, fx: Array, state: State) -> State:
        """Take note of a newly evaluated pair $(x, f(x))$."""
        return state

    def _check(self):
        if not (self.rtol >= 0 and self.atol >= 0) or self.rtol + self.atol == 0:
            raise ValueError(
                f"{type(self).__name__}: `rtol` and `atol` must be >= 0 and not both 0; "
                f"got rtol={self.rtol}, atol={self.atol}."
            )
        if int(self.max_steps) < 1:
            raise ValueError(
                f"{type(self).__name__}: `max_steps` must be >= 1; got {self.max_steps}."
            )
        if int(self.check_every) < 1:
            raise ValueError(
                f"{type(self).__name__}: `check_every` must be >= 1; got {self.check_every}."
            )


def over_tolerance(solver: AbstractFixedPointSolver, residual, scale):
    """The residual as a multiple of the stopping test's tolerance `atol + rtol * scale` (<= 1:
    passed). Iterates are ranked by it, not by the absolute residual: where the state grows from
    zeros (propagation over a graph), the start's small absolute residual would rank above every
    later iterate, the converged one included."""
    tolerance = solver.atol + solver.rtol * scale
    return residual / jnp.maximum(tolerance, jnp.finfo(jnp.result_type(residual)).tiny)


class Picard(AbstractFixedPointSolver):
    r"""Damped fixed-point (Picard) iteration $x \leftarrow (1-\lambda)\,x + \lambda f(x)$.

    Converges when $f$ is a contraction. `damping` $\lambda \in (0, 1]$ (1 = plain iteration).

    `check_every` steps are taken per trip of the loop, each guarded so that an iterate stops
    changing once it has converged: the results are the same as with 1, the loop's trips (and,
    on accelerators, its round trips to the host) fall by that factor, and up to
    `check_every - 1` evaluations of $f$ are wasted at the end.

    **Example:**

    ```python
    import jax.numpy as jnp, eqattn

    # z = cos(z): a contraction near its fixed point 0.739085...
    eq = eqattn.fixed_point(lambda z, _: jnp.cos(z), jnp.zeros(()), solver=eqattn.Picard(rtol=1e-6))
    assert eq.converged and jnp.allclose(eq.value, 0.7390851, atol=1e-5)
    ```
    """

    rtol: float = 1e-4
    atol: float = 1e-6
    max_steps: int = eqx.field(static=True, default=60)
    damping: float = 1.0
    check_every: int = eqx.field(static=True, default=1)
    elementwise: bool = eqx.field(static=True, default=False)

    def __check_init__(self):
        self._check()
        if not 0 < self.damping <= 1:
            raise ValueError(f"Picard: `damping` must be in (0, 1]; got {self.damping}.")

    def init(self, x, fx):
        return None

    def step(self, x, fx, state):
        # plain iteration takes f(x) itself: x + (f(x) - x) can round a small entry beside a
        # large one away (a graph's node whose value falls by orders of magnitude)
        damped = x + self.damping * (fx - x)
        return jnp.where(self.damping == 1, fx, damped), state


def _solve_spd(h, b):
    """`h^-1 b` for a small symmetric positive definite `h [m, m]` by Gauss-Jordan elimination
    without pivoting (stable for SPD matrices), unrolled over the static `m`: each step is one
    elementwise update of the augmented matrix `[h | b]`, so the solve fuses into a few kernels
    whether or not it is batched (a LAPACK/cuSOLVER call, or an elimination on the entries as
    scalars, costs a kernel per call or per entry: on a CPU, time per kernel dominates)."""
    m = h.shape[0]
    a = jnp.concatenate([h, b[:, None]], axis=1)
    rows = jnp.arange(m)[:, None]
    for k in range(m):
        pivot = a[k] / a[k, k]
        # row k becomes the normalized pivot row; the others lose their column k
        a = jnp.where(rows == k, pivot, a - a[:, k : k + 1] * pivot)
    return a[:, m]


class Anderson(AbstractFixedPointSolver):
    r"""Anderson acceleration (type II) with a history of `history_size` iterates.

    With residuals $g_i = f(x_i) - x_i$ of the last iterates, find weights $\alpha$ minimizing
    $\lVert\sum_i \alpha_i g_i\rVert^2 + \mathrm{ridge}\cdot\max_i\lVert g_i\rVert^2\,\lVert\alpha\rVert^2$
    subject to $\sum_i\alpha_i = 1$, then $x \leftarrow \sum_i \alpha_i\,((1-\lambda)\,x_i + \lambda
    f(x_i))$ with damping $\lambda$ (D. G. Anderson, 1965; H. F. Walker and P. Ni, 2011). The ridge
    is relative to the residuals' scale, so it keeps working as they shrink.

    `check_every` steps are taken per trip of the loop, each guarded so that an iterate stops
    changing once it has converged: the results are the same as with 1, the loop's trips (and,
    on accelerators, its round trips to the host) fall by that factor, and up to
    `check_every - 1` evaluations of $f$ are wasted at the end.

    **Example:**

    ```python
    import jax.numpy as jnp, eqattn

    A = jnp.array([[0.9, 0.05], [0.0, 0.85]])
    b = jnp.array([1.0, 2.0])
    solver = eqattn.Anderson(rtol=1e-6, history_size=3)
    eq = eqattn.fixed_point(lambda z, _: A @ z + b, jnp.zeros(2), solver=solver)
    assert eq.converged and jnp.allclose(eq.value, jnp.linalg.solve(jnp.eye(2) - A, b), rtol=1e-4)
    plain = eqattn.fixed_point(lambda z, _: A @ z + b, jnp.zeros(2), solver=eqattn.Picard(rtol=1e-6))
    assert eq.steps < plain.steps  # extrapolation beats plain iteration on a slow contraction
    ```
    """

    rtol: float = 1e-4
    atol: float = 1e-6
    max_steps: int = eqx.field(static=True, default=60)
    history_size: int = eqx.field(static=True, default=5)
    ridge: float = 1e-4
    damping: float = 1.0
    check_every: int = eqx.field(static=True, default=1)
    elementwise: bool = eqx.field(static=True, default=False)

    def __check_init__(self):
        self._check()
        if self.history_size < 1:
            raise ValueError(f"Anderson: `history_size` must be >= 1; got {self.history_size}.")
        if self.ridge < 0 or not 0 < self.damping <= 1:
            raise ValueError(
                f"Anderson: need ridge >= 0 and damping in (0, 1]; got ridge={self.ridge}, "
                f"damping={self.damping}."
            )

    def init(self, x, fx):
        m = self.history_size
        ys = jnp.zeros((m,) + x.shape, x.dtype)
        gs = jnp.zeros((m,) + x.shape, x.dtype)
        gram = jnp.zeros((m, m), x.dtype)
        return self.record(x, fx, (ys, gs, gram, jnp.array(0)))

    def step(self, x, fx, state):
        # The current pair (x, f(x)) is already in the history (written by `record`).
        ys, gs, gram, count = state
        m = self.history_size
        valid = (jnp.arange(m) < count).astype(x.dtype)
        scale = jnp.max(jnp.diag(gram))
        # min a^T H a subject to sum(a) = 1 over the filled slots: a = H^-1 1 / (1^T H^-1 1), with
        # H the ridged Gram matrix of the filled slots and the identity on the empty ones (whose
        # right-hand side 0 gives them a = 0).
        h = gram * (valid[:, None] * valid[None, :]) + jnp.diag(1 - valid)
        h = h + (self.ridge * scale + jnp.finfo(x.dtype).tiny) * jnp.eye(m, dtype=x.dtype)
        # In at least float32: LAPACK has no bf16/fp16 solve, and m x m costs nothing.
        wide = jnp.promote_types(x.dtype, jnp.float32)
        w = _solve_spd(h.astype(wide), valid.astype(wide))
        alpha = (w / jnp.sum(w)).astype(x.dtype)
        return alpha @ ys, state

    def record(self, x, fx, state):
        # Ring buffers of the damped images y = x + damping (f(x) - x), from which a step is one
        # combination, and of the residuals g = f(x) - x, whose Gram matrix is updated by one row:
        # a step reads the history once (this loop is memory-bound when f is a vector-Jacobian
        # product with a large working set).
        ys, gs, gram, count = state
        slot = count % self.history_size
        g = fx - x
        ys, gs = ys.at[slot].set(x + self.damping * g), gs.at[slot].set(g)
        dots = gs @ g
        gram = gram.at[slot, :].set(dots).at[:, slot].set(dots)
        return ys, gs, gram, count + 1


class Broyden(AbstractFixedPointSolver):
    r"""Limited-memory ("good") Broyden's method on $g(x) = f(x) - x = 0$, as in deep equilibrium
    models (S. Bai, J. Z. Kolter, V. Koltun, 2019).

    An approximation $B \approx (\partial g/\partial x)^{-1}$, starting from $-I$, takes steps
    $x \leftarrow x - \lambda B g(x)$ and is updated by Sherman-Morrison from
    $s = \Delta x$, $y = \Delta g$: $B \leftarrow B + (s - By)\,s^\top B / (s^\top B y)$. The last
    `history_size` rank-one terms are kept (oldest overwritten first). An update whose
    denominator is below $\sqrt{\epsilon}\,\lVert s\rVert\,\lVert By\rVert$ is skipped, and an
    iterate whose residual, as a multiple of the stopping test's tolerance
    $\mathrm{atol} + \mathrm{rtol}\lVert f(x)\rVert$, exceeds `restart_factor` times the lowest
    seen restarts from that best iterate with $B = -I$: a tolerance below what rounding allows
    makes the iterates stall, not diverge, and a state that grows from zeros is not sent back
    to its start.

    `check_every` steps are taken per trip of the loop, each guarded so that an iterate stops
    changing once it has converged: the results are the same as with 1, the loop's trips (and,
    on accelerators, its round trips to the host) fall by that factor, and up to
    `check_every - 1` evaluations of $f$ are wasted at the end.

    **Example:**

    ```python
    import jax.numpy as jnp, eqattn

    A = jnp.array([[0.9, 0.05], [0.0, 0.85]])
    b = jnp.array([1.0, 2.0])
    eq = eqattn.fixed_point(lambda z, _: A @ z + b, jnp.zeros(2), solver=eqattn.Broyden(rtol=1e-6))
    assert eq.converged and jnp.allclose(eq.value, jnp.linalg.solve(jnp.eye(2) - A, b), rtol=1e-4)
    ```
    """

    rtol: float = 1e-4
    atol: float = 1e-6
    max_steps: int = eqx.field(static=True, default=60)
    history_size: int = eqx.field(static=True, default=20)
    damping: float = 1.0
    check_every: int = eqx.field(static=True, default=1)
    elementwise: bool = eqx.field(static=True, default=False)
    restart_factor: float = 100.0

    def __check_init__(self):
        self._check()
        if not self.restart_factor > 1:
            raise ValueError(f"Broyden: `restart_factor` must be > 1; got {self.restart_factor}.")
        if self.history_size < 1 or not 0 < self.damping <= 1:
            raise ValueError(
                "Broyden: need history_size >= 1 and damping in (0, 1]; got "
                f"history_size={self.history_size}, damping={self.damping}."
            )

    def init(self, x, fx):
        m = self.history_size
        us = jnp.zeros((m,) + x.shape, x.dtype)
        vs = jnp.zeros((m,) + x.shape, x.dtype)
        g = fx - x
        # low-rank terms, count, previous x and g, and the best pair seen (a restart point)
        return (
            us,
            vs,
            jnp.array(0),
            x,
            g,
            x,
            g,
            over_tolerance(self, jnp.linalg.norm(g), jnp.linalg.norm(fx)),
        )

    @staticmethod
    def _apply(us, vs, w):  # B w = -w + U^T (V w)
        return -w + (vs @ w) @ us

    @staticmethod
    def _apply_t(us, vs, w):  # B^T w = -w + V^T (U w)
        return -w + (us @ w) @ vs

    def inverse_adjoint(self, state, w):
        r"""$-B^\top w$: the forward solve's estimate of $(I - J^\top)^{-1} w$ (with
        $B \approx (J - I)^{-1}$), which a shared-inverse backward pass uses."""
        us, vs = state[0], state[1]
        return w - (us @ w) @ vs

    def step(self, x, fx, state):
        us, vs, count, x_prev, g_prev, x_best, g_best, best = state
        g = fx - x
        norm = over_tolerance(self, jnp.linalg.norm(g), jnp.linalg.norm(fx))
        better = norm < best
        x_best, g_best = jnp.where(better, x, x_best), jnp.where(better, g, g_best)
        best = jnp.where(better, norm, best)
        # Iterates that move far from the best one (rounding noise below a tolerance that cannot
        # be met corrupts the rank-one terms, and the iterates then diverge) restart there.
        restart = norm > self.restart_factor * best
        s, y = x - x_prev, g - g_prev
        b_y = self._apply(us, vs, y)
        denom = s @ b_y
        # Skip an update whose denominator is small relative to its factors (near-parallel s
        # and B y: the rank-one term would be huge, and rounding noise near a fixed point that
        # the tolerance cannot resolve would send the iterates away).
        floor = jnp.sqrt(jnp.finfo(x.dtype).eps) * jnp.linalg.norm(s) * jnp.linalg.norm(b_y)
        ok = jnp.any(s != 0) & (jnp.abs(denom) > jnp.maximum(floor, jnp.finfo(x.dtype).tiny))
        u = jnp.where(ok, (s - b_y) / jnp.where(ok, denom, 1), 0)
        v = jnp.where(ok, self._apply_t(us, vs, s), 0)
        # Write one row (O(n)); a skipped update rewrites the row that is there.
        slot = count % self.history_size
        us = us.at[slot].set(jnp.where(ok, u, us[slot]))
        vs = vs.at[slot].set(jnp.where(ok, v, vs[slot]))
        count = count + ok.astype(count.dtype)
        x_new = x - self.damping * self._apply(us, vs, g)
        # a restart: B = -I from the best pair
        us, vs = jnp.where(restart, 0, us), jnp.where(restart, 0, vs)
        count = jnp.where(restart, 0, count)
        x_new = jnp.where(restart, x_best + self.damping * g_best, x_new)
        x, g = jnp.where(restart, x_best, x), jnp.where(restart, g_best, g)
        return x_new, (us, vs, count, x, g, x_best, g_best, best)
