r"""How gradients go through a fixed point $z^* = f(z^*, \theta)$.

- `ImplicitAdjoint`: the implicit function theorem. The vector-Jacobian product of a cotangent
  $g$ is $(\partial f/\partial\theta)^\top u$ with $u = g + J^\top u$, $J = \partial f/\partial z$ at
  $z^*$. Exact at an exact fixed point; memory independent of the number of forward steps.
- `JacobianFree`: $u = g$ (Jacobian-free backprop; Z. Fung et al., 2022). A cheap, biased
  approximation, close when $J$ is small.
- `Phantom(steps, damping)`: backprop through `steps` damped iterations
  $z \leftarrow (1-\lambda) z + \lambda f(z)$ started at $z^*$ (phantom gradients; Z. Geng et al.,
  "On Training Implicit Models", 2021). With $\lambda = 1$ this is the truncated Neumann series
  $u = \sum_{i<k} (J^\top)^i g$, which tends to the implicit gradient as `steps` grows.
- `Unrolled`: backprop through every forward step: the reference, with memory growing with the
  number of steps.

Which transformations each supports: all support `grad`/`vjp` and `vmap`; `Phantom`,
`JacobianFree` and `Unrolled` also support forward mode (`jvp`) when $f$ does; `ImplicitAdjoint`
and `SharedInverse` are reverse mode only (custom VJPs). (Optimistix's `ImplicitAdjoint` is
forward mode, transposed; eqattn's is a reverse-mode custom VJP. Optimistix solvers passed to
`fixed_point` are differentiated by eqattn's adjoints.)

**Through an unconverged forward** (`throw=False`), every adjoint differentiates the iterate it
returned as if it were the fixed point: `ImplicitAdjoint` and `SharedInverse` apply the implicit
function theorem at that point (`ImplicitAdjoint` with eqattn's solvers, at the forward's last
evaluation, which is that point unless the iterates stopped improving), `Phantom` and
`JacobianFree` take their steps from it, and `Unrolled` differentiates the steps actually taken. None of these is the derivative of a fixed point, so
check `Equilibrium.converged` (or pass `throw=True`) before trusting such a gradient.

**Writing an adjoint.** Subclass `AbstractAdjoint` and implement
`run(fn, params, x0, *, solve, throw) -> Equilibrium`:

- `fn(x, params)`: $f$ on a flat vector $x$ (the state raveled); `params` is a pytree whose
  inexact arrays are what gradients flow to (the user's `args` and the arrays $f$ closes over).
- `x0`: the flat start (no gradient flows to it).
- `solve`: an `eqattn.ForwardSolve`; `solve(g, x0)` runs the user's solver on $x = g(x)$ within the
  step budget and returns an [`eqattn.Equilibrium`][] with the flat solution as `value`. It is not
  meant to be differentiated: call it on `lambda x: fn(x, jax.lax.stop_gradient(params))` or
  inside a `jax.custom_vjp`. `solve.solver` is the solver (for its tolerances).
- `throw`: `fixed_point`'s `throw`, for any check the adjoint makes of its own (e.g. a backward
  solve) when it has no setting of its own.

Return the `Equilibrium` with `value` replaced by a flat solution carrying the derivative the
adjoint defines; `fixed_point` unravels it and applies `throw` to the forward.
"""

from __future__ import annotations

import abc
import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
from jax import lax

from ._backends import ForwardSolve, JaxoptSolver, _static_steps, _summary, tolerances
from ._equilibrium import RESULTS, Equilibrium
from ._linear import solve_linear
from ._loop import (
    _norm,
    best_answer,
    equilibrium,
    iterate,
    iterate_fixed,
    iterate_to_last,
    iterate_unrolled,
)
from ._solvers import AbstractFixedPointSolver, Anderson, Broyden


class AbstractAdjoint(eqx.Module):
    """How [`eqattn.fixed_point`][] is differentiated (see this module's docstring for the
    protocol of `run`)."""

    @abc.abstractmethod
    def run(self, fn, params, x0, *, solve: ForwardSolve, throw: bool) -> Equilibrium:
        """Solve `x = fn(x, params)` from the flat `x0` with `solve`; return the `Equilibrium`
        whose flat `value` carries this adjoint's derivative."""


def _with_value(eq: Equilibrium, value) -> Equilibrium:
    return dataclasses.replace(eq, value=value)


def _stop(params):
    return jax.tree.map(lambda x: lax.stop_gradient(x) if eqx.is_inexact_array(x) else x, params)


def default_linear_solver(solve: ForwardSolve) -> AbstractFixedPointSolver:
    """The backward solve that matches the forward: eqattn's solver itself (its method, `rtol`,
    `atol` and `max_steps`), or for other backends `Anderson` with their tolerances."""
    if isinstance(solve.solver, AbstractFixedPointSolver):
        return solve.solver
    rtol, atol, steps = tolerances(solve.solver, solve.budget)
    if rtol + atol == 0:
        return Anderson(max_steps=steps)
    return Anderson(rtol=rtol, atol=atol, max_steps=steps)


class ImplicitAdjoint(AbstractAdjoint):
    r"""Implicit differentiation: solve $u = g + J^\top u$ at the fixed point.

    **Arguments:**

    - `linear_solver`: `None` (default): the forward's own solver with its `rtol` and
      `max_steps` (for a jaxopt or Optimistix forward, [`eqattn.Anderson`][] with their
      tolerances), so the gradient is as accurate as the solve; the forward's `atol`, an absolute
      floor in the units of $z$, is carried over relative to the solution's size,
      $\mathrm{atol}\,\lVert g\rVert / \max(\lVert f(z^*)\rVert, \mathrm{atol})$, so the
      scale of the loss does not change how accurately the backward is solved. Or a fixed-point
      solver applied to $u \mapsto g + J^\top u$ (`Picard()` is the Neumann series), or any
      Lineax solver of $(I - J^\top)u = g$ as it is (`lx.GMRES(rtol, atol)`,
      `lx.BiCGStab(...)`, `lx.Normal(lx.CG(...))`, matrix-free); a solver given here is used
      with its own tolerances (a Lineax solver with its own norm and test).
      A fixed-point solver that runs out of steps with its iterates still improving gives its
      next step (for `Picard(max_steps=k)`, the Neumann series' first $k + 1$ terms): the
      vector-Jacobian product that tested its last iterate pays for it.
    - `throw`: if the backward solve does not reach its tolerance, raise a runtime error (also
      inside `jit`). `None` (default): `fixed_point`'s (or the layer's) `throw`; with `False`
      the best-effort gradient is returned as is.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, lineax as lx, eqattn

    # z = a tanh(z) + 1: dz/da = tanh(z) / (1 - a (1 - tanh(z)^2)) by the implicit function theorem
    adjoint = eqattn.ImplicitAdjoint(linear_solver=lx.GMRES(rtol=1e-8, atol=1e-8))
    solve = lambda a: eqattn.fixed_point(
        lambda z, a: a * jnp.tanh(z) + 1.0, jnp.zeros(()), a, adjoint=adjoint
    ).value
    z, dz = solve(0.5), jax.grad(solve)(0.5)
    assert jnp.allclose(dz, jnp.tanh(z) / (1 - 0.5 * (1 - jnp.tanh(z) ** 2)), rtol=1e-3)
    ```
    """

    linear_solver: AbstractFixedPointSolver | lx.AbstractLinearSolver | None = None
    throw: bool | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        kinds = AbstractFixedPointSolver | lx.AbstractLinearSolver
        if self.linear_solver is not None and not isinstance(self.linear_solver, kinds):
            raise ValueError(
                "ImplicitAdjoint: `linear_solver` must be one of eqattn's fixed-point solvers or "
                f"a Lineax linear solver (e.g. lx.GMRES(rtol, atol)); got {self.linear_solver!r}."
            )

    def run(self, fn, params, x0, *, solve, throw):
        default = self.linear_solver is None
        linear = default_linear_solver(solve) if default else self.linear_solver
        throw = throw if self.throw is None else self.throw
        eq, x_lin = lax.stop_gradient(_forward(params, solve, fn, x0))
        # The parameters' cotangent u^T df/dtheta by JAX's own reverse mode through one
        # evaluation of f, so that under a user's vmap it is one contraction over the batch (a
        # custom VJP's would be one per example, then summed); the hook passes z* on and turns
        # its cotangent g into u, the cotangent of that evaluation.
        y = fn(x_lin, params)
        hook = _implicit_hook(y, eq.value, x_lin, _stop(params), linear, throw, default, fn)
        return _with_value(eq, hook)


_SHORT_BACKWARD = 8  # at most this many steps: `iterate_fixed`


def solve_adjoint(linear, jt, g):
    r"""Solve $u = g + J^\top u$ given $v \mapsto J^\top v$; return $u$ and whether it met the
    solver's tolerance."""
    if isinstance(linear, AbstractFixedPointSolver):
        h = lambda u: g + jt(u)  # noqa: E731
        # A truncated solve of a few steps, whose examples seldom all stop early, as a loop of
        # fixed length (under vmap its solver state is neither selected nor scattered).
        short = linear.max_steps <= _SHORT_BACKWARD
        it = (iterate_fixed if short else iterate)(linear, h, g, linear.max_steps)
        # Out of steps, the solver's next step is a better u than its last iterate, at no cost.
        return best_answer(linear, it), equilibrium(linear, it).converged
    return solve_linear(linear, lambda u: u - jt(u), g)


@eqx.filter_custom_vjp
def _forward(params, solve, fn, x0):
    """`(Equilibrium, x_lin)`: the forward solve and the point at which its gradient linearizes
    `fn`, its value (a custom VJP only so that, when differentiated, the loop leaves its last
    evaluation to be shared with that linearization; it passes no gradient itself)."""
    eq = solve(lambda x: fn(x, params), x0)
    return eq, eq.value


@_forward.def_fwd
def _forward_fwd(perturbed, params, solve, fn, x0):
    if isinstance(solve.solver, AbstractFixedPointSolver):
        # The forward's last evaluation of f is the backward's linearization (merged by XLA):
        # one evaluation fewer per gradient (at the value returned, unless the iterates stopped
        # improving).
        it, x_lin = iterate_to_last(solve.solver, lambda x: fn(x, params), x0, solve.budget)
        return (equilibrium(solve.solver, it), x_lin), None
    eq = solve(lambda x: fn(x, params), x0)
    return (eq, eq.value), None


@_forward.def_bwd
def _forward_bwd(residuals, grad_obj, perturbed, params, solve, fn, x0):
    return jax.tree.map(lambda _: None, params)


@eqx.filter_custom_vjp
def _implicit_hook(y, value, x_lin, frozen, linear, throw, relative_atol, fn):
    """`value`, with the cotangent $u = g + J^\top u$ ($J$ of `fn` at `x_lin`) for `y` when its
    own cotangent is $g$. (`value` carries the output: under `vmap` it is batched like the
    cotangent, where zeros made from `y`'s shape would not be, and JAX would sum the cotangent
    over the batch.)"""
    return value


@_implicit_hook.def_fwd
def _implicit_hook_fwd(perturbed, y, value, x_lin, frozen, linear, throw, relative_atol, fn):
    fx, vjp = eqx.filter_vjp(lambda x: fn(x, frozen), x_lin)
    return value, (fx, vjp)


@_implicit_hook.def_bwd
def _implicit_hook_bwd(
    residuals, g, perturbed, y, value, x_lin, frozen, linear, throw, relative_atol, fn
):
    fx, vjp = residuals
    if relative_atol:
        floor = linear.atol * _norm(g) / jnp.maximum(_norm(fx), linear.atol)
        linear = eqx.tree_at(lambda s: s.atol, linear, floor.astype(g.dtype))
    u, ok = solve_adjoint(linear, lambda v: vjp(v)[0], g)
    if throw:
        u = eqx.error_if(
            u,
            ~ok,
            "eqattn.fixed_point: the implicit backward solve u = g + J^T u did not reach its "
            "tolerance (give ImplicitAdjoint a linear_solver with more max_steps or another "
            "method, or pass throw=False to accept the best-effort gradient).",
        )
    return u


class SharedInverse(AbstractAdjoint):
    r"""The backward pass reuses the forward solve's inverse-Jacobian estimate (SHINE; Z. Ramzi,
    F. Mannel, S. Bai, J.-L. Starck, P. Ciuciu, T. Moreau, "SHINE: SHaring the INverse Estimate
    from the forward pass for bi-level optimization and implicit models", ICLR 2022).

    With [`eqattn.Broyden`][] as the forward solver, $B \approx (J - I)^{-1}$ is at hand at the
    fixed point, so $u = (I - J^\top)^{-1} g \approx -B^\top g$ costs no vector-Jacobian product;
    `refine` steps of $u \leftarrow g + J^\top u$ from there correct it (each costs one). Then one
    vector-Jacobian product with respect to the parameters, as in `ImplicitAdjoint`. An
    approximation: exact in the directions the forward steps explored; it makes no check of its
    own, so `throw` concerns the forward only.

    **Arguments:** `refine` ($\ge 0$).

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    A = jnp.array([[0.5, 0.1], [0.0, 0.4]])
    f = lambda z, b: A @ z + b  # z* = (I - A)^{-1} b
    solve = lambda b, adj: eqattn.fixed_point(
        f, jnp.zeros(2), b, solver=eqattn.Broyden(rtol=1e-7), adjoint=adj
    ).value.sum()
    b, exact = jnp.array([1.0, 2.0]), jnp.linalg.solve((jnp.eye(2) - A).T, jnp.ones(2))
    # an approximation from Broyden's inverse estimate, which `refine` steps sharpen
    assert jnp.allclose(jax.grad(solve)(b, eqattn.SharedInverse()), exact, rtol=0.15)
    assert jnp.allclose(jax.grad(solve)(b, eqattn.SharedInverse(refine=10)), exact, rtol=1e-3)
    ```
    """

    refine: int = eqx.field(static=True, default=0)

    def __check_init__(self):
        if self.refine < 0:
            raise ValueError(f"SharedInverse: `refine` must be >= 0; got {self.refine}.")

    def run(self, fn, params, x0, *, solve, throw):
        if not isinstance(solve.solver, Broyden):
            raise ValueError(
                "SharedInverse reuses a quasi-Newton inverse estimate: the solver must be "
                f"eqattn.Broyden; got {type(solve.solver).__name__}."
            )
        return _shared(params, solve, self, fn, x0)


def _broyden(params, solve, fn, x0):
    it = iterate(solve.solver, lambda x: fn(x, params), x0, solve.budget)
    return lax.stop_gradient((equilibrium(solve.solver, it), it.state))


@eqx.filter_custom_vjp
def _shared(params, solve, adjoint, fn, x0):
    return _broyden(params, solve, fn, x0)[0]


@_shared.def_fwd
def _shared_fwd(perturbed, params, solve, adjoint, fn, x0):
    eq, state = _broyden(params, solve, fn, x0)
    return eq, (eq.value, state)


@_shared.def_bwd
def _shared_bwd(residuals, grad_obj, perturbed, params, solve, adjoint, fn, x0):
    x_star, state = residuals
    g = grad_obj.value
    if g is None:
        return jax.tree.map(lambda _: None, params)
    u = solve.solver.inverse_adjoint(state, g)
    _, vjp = eqx.filter_vjp(fn, x_star, params)  # one linearization, as in `_implicit_bwd`
    if adjoint.refine:
        u = lax.fori_loop(0, adjoint.refine, lambda _, u: g + vjp(u)[0], u)
    return vjp(u)[1]


class Phantom(AbstractAdjoint):
    r"""Phantom gradient: backprop through `steps` damped steps $z \leftarrow z + \lambda(f(z) -
    z)$ from $z^*$. The forward value is $z^*$ unchanged.

    **Arguments:** `steps` ($k \ge 1$), `damping` ($\lambda \in (0, 1]$).

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    f = lambda z, a: a * jnp.tanh(z) + 1.0
    solve = lambda a, adj: eqattn.fixed_point(f, jnp.zeros(()), a, adjoint=adj).value
    exact = jax.grad(solve)(0.5, eqattn.ImplicitAdjoint())
    phantom = jax.grad(solve)(0.5, eqattn.Phantom(steps=20))  # 20 unrolled steps from z*
    assert jnp.allclose(phantom, exact, rtol=1e-3)
    ```
    """

    steps: int = eqx.field(static=True, default=5)
    damping: float = 1.0

    def __check_init__(self):
        if self.steps < 1 or not 0 < self.damping <= 1:
            raise ValueError(
                f"Phantom: need steps >= 1 and damping in (0, 1]; got steps={self.steps}, "
                f"damping={self.damping}."
            )

    def run(self, fn, params, x0, *, solve, throw):
        frozen = _stop(params)
        eq = lax.stop_gradient(solve(lambda x: fn(x, frozen), lax.stop_gradient(x0)))
        x_star = eq.value
        z = x_star
        for _ in range(self.steps):
            z = z + self.damping * (fn(z, params) - z)
        # value z*, derivative that of the phantom steps
        return _with_value(eq, x_star + (z - lax.stop_gradient(z)))


class JacobianFree(AbstractAdjoint):
    r"""Jacobian-free backprop: the gradient of one application of $f$ at $z^*$, i.e. $u = g$
    (the same as `Phantom(steps=1, damping=1)`).

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    # the Jacobian-free gradient drops (I - J)^{-1}: here dz/da ~ tanh(z), the exact one divided by
    # 1 - a (1 - tanh(z)^2)
    f = lambda z, a: a * jnp.tanh(z) + 1.0
    solve = lambda a: eqattn.fixed_point(f, jnp.zeros(()), a, adjoint=eqattn.JacobianFree()).value
    z, dz = solve(0.5), jax.grad(solve)(0.5)
    assert jnp.allclose(dz, jnp.tanh(z), rtol=1e-3)
    ```
    """

    def run(self, fn, params, x0, *, solve, throw):
        return Phantom(steps=1, damping=1.0).run(fn, params, x0, solve=solve, throw=throw)


class Unrolled(AbstractAdjoint):
    """Backprop through every step of the forward solve (a `lax.scan` of `solver.max_steps`
    guarded steps): the reference against which the others are checked. Memory grows with
    `max_steps`. Needs one of eqattn's own solvers.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    f = lambda z, a: a * jnp.tanh(z) + 1.0
    solve = lambda a, adj: eqattn.fixed_point(
        f, jnp.zeros(()), a, solver=eqattn.Picard(rtol=1e-7), adjoint=adj
    ).value
    # autodiff through every solver step agrees with the implicit gradient at convergence
    unrolled = jax.grad(solve)(0.5, eqattn.Unrolled())
    assert jnp.allclose(unrolled, jax.grad(solve)(0.5, eqattn.ImplicitAdjoint()), rtol=1e-4)
    ```
    """

    def run(self, fn, params, x0, *, solve, throw):
        solver = solve.solver
        if not isinstance(solver, AbstractFixedPointSolver):
            raise ValueError(
                "Unrolled differentiates eqattn's own solver loop; the solver must be "
                f"eqattn.Anderson, Picard or Broyden; got {type(solver).__name__}."
            )
        it = iterate_unrolled(solver, lambda x: fn(x, params), x0, solve.budget)
        return _with_value(equilibrium(solver, lax.stop_gradient(it)), it.best_x)


class JaxoptImplicit(AbstractAdjoint):
    """jaxopt's own implicit differentiation of a [`eqattn.JaxoptSolver`][] (`implicit_diff=True`
    with the solver's `implicit_diff_solve`): what `fixed_point` uses for a `JaxoptSolver` unless
    given another adjoint. jaxopt's backward solve reports no convergence, so `throw` concerns the
    forward only.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, jaxopt, eqattn

    solver = eqattn.JaxoptSolver(jaxopt.FixedPointIteration, tol=1e-7, maxiter=200)
    f = lambda z, a: a * jnp.tanh(z) + 1.0
    solve = lambda a: eqattn.fixed_point(
        f, jnp.zeros(()), a, solver=solver, adjoint=eqattn.JaxoptImplicit()
    ).value
    z, dz = solve(0.5), jax.grad(solve)(0.5)
    assert jnp.allclose(dz, jnp.tanh(z) / (1 - 0.5 * (1 - jnp.tanh(z) ** 2)), rtol=1e-3)
    ```
    """

    def run(self, fn, params, x0, *, solve, throw):
        solver = solve.solver
        if not isinstance(solver, JaxoptSolver):
            raise ValueError(
                f"JaxoptImplicit needs an eqattn.JaxoptSolver; got {type(solver).__name__}."
            )
        steps = _static_steps(solve.budget, solver.max_steps, "JaxoptSolver")
        x, count = solver.run(fn, params, lax.stop_gradient(x0), maxiter=steps, implicit_diff=True)
        frozen = _stop(params)
        eq = _summary(
            lambda x: fn(x, frozen), x, count, None, RESULTS.max_steps_reached, tol=solver.tol
        )
        return _with_value(lax.stop_gradient(eq), x)
