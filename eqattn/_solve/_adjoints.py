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

Which transformations each supports: all four support `grad`/`vjp` and `vmap`; `Phantom`,
`JacobianFree` and `Unrolled` also support forward mode (`jvp`) when $f$ does; `ImplicitAdjoint` is
reverse mode only (a custom VJP).
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax

from ._linear import AbstractKrylov
from ._solvers import (
    AbstractFixedPointSolver,
    Anderson,
    Broyden,
    Iteration,
    iterate,
    iterate_unrolled,
)


class AbstractAdjoint(eqx.Module):
    """How `eqattn.fixed_point` is differentiated."""

    @abc.abstractmethod
    def run(self, solver, fn, params, x0, budget) -> tuple[jax.Array, Iteration]:
        """Solve `x = fn(x, params)` from `x0`; return the (differentiable) solution and stats."""


def _stop(params):
    return jax.tree.map(lambda x: lax.stop_gradient(x) if eqx.is_inexact_array(x) else x, params)


class ImplicitAdjoint(AbstractAdjoint):
    r"""Implicit differentiation: solve $u = g + J^\top u$ at the fixed point.

    **Arguments:**

    - `linear_solver`: a fixed-point solver applied to $u \mapsto g + J^\top u$ (default
      `Anderson(rtol=1e-5, atol=0, max_steps=100)`; `Picard()` is the Neumann series;
      `Broyden()`), or a Krylov method on $(I - J^\top)u = g$: `GMRES()`, `BiCGStab()`,
      `NormalCG()`. Its `rtol`, `atol` and `max_steps` are the backward solve's; tighten `rtol`
      for float64 work that needs more than ~5 correct digits.
    - `throw`: if the backward solve does not reach its tolerance, raise a runtime error (also
      inside `jit`). With `throw=False` the best-effort gradient is returned as is.
    """

    linear_solver: AbstractFixedPointSolver | AbstractKrylov = eqx.field(
        default_factory=lambda: Anderson(rtol=1e-5, atol=0.0, max_steps=100)
    )
    throw: bool = eqx.field(static=True, default=True)

    def run(self, solver, fn, params, x0, budget):
        return _implicit(params, solver, self, fn, x0, budget)

    def solve_adjoint(self, jt, g):
        r"""Solve $u = g + J^\top u$ given $v \mapsto J^\top v$; return $u$ and whether it met the
        tolerance."""
        ls = self.linear_solver
        if isinstance(ls, AbstractFixedPointSolver):
            it = iterate(ls, lambda u: g + jt(u), g, ls.max_steps)
            u = it.best_x
            ok = it.best_residual <= ls.atol + ls.rtol * it.best_scale
        else:
            u = ls.solve(lambda u: u - jt(u), g)
            r = jnp.linalg.norm(u - jt(u) - g)
            ok = r <= ls.atol + ls.rtol * jnp.linalg.norm(g)
        return u, ok & jnp.all(jnp.isfinite(u))


def _solve(params, solver, fn, x0, budget):
    """The forward solve of the custom-VJP adjoints: the best iterate, and the statistics."""
    it = iterate(solver, lambda x: fn(x, params), x0, budget)
    return it.best_x, lax.stop_gradient(it)


@eqx.filter_custom_vjp
def _implicit(params, solver, adjoint, fn, x0, budget):
    return _solve(params, solver, fn, x0, budget)


@_implicit.def_fwd
def _implicit_fwd(perturbed, params, solver, adjoint, fn, x0, budget):
    x_star, it = _implicit(params, solver, adjoint, fn, x0, budget)
    return (x_star, it), x_star


@_implicit.def_bwd
def _implicit_bwd(x_star, grad_obj, perturbed, params, solver, adjoint, fn, x0, budget):
    g = grad_obj[0]
    if g is None:
        return jax.tree.map(lambda _: None, params)
    _, jt = jax.vjp(lambda x: fn(x, params), x_star)
    u, ok = adjoint.solve_adjoint(lambda v: jt(v)[0], g)
    _, vjp_params = eqx.filter_vjp(lambda p: fn(x_star, p), params)
    (grads,) = vjp_params(u)
    if adjoint.throw:
        grads = eqx.error_if(
            grads,
            ~ok,
            "eqattn.fixed_point: the implicit backward solve u = g + J^T u did not reach its "
            "tolerance (increase ImplicitAdjoint(linear_solver=...).max_steps, try another "
            "linear_solver, or pass throw=False to accept the best-effort gradient).",
        )
    return grads


class SharedInverse(AbstractAdjoint):
    r"""The backward pass reuses the forward solve's inverse-Jacobian estimate (SHINE; Z. Ramzi,
    F. Mannel, S. Bai, J.-L. Starck, P. Ciuciu, T. Moreau, "SHINE: SHaring the INverse Estimate
    from the forward pass for bi-level optimization and implicit models", ICLR 2022).

    With [`eqattn.Broyden`][] as the forward solver, $B \approx (J - I)^{-1}$ is at hand at the
    fixed point, so $u = (I - J^\top)^{-1} g \approx -B^\top g$ costs no vector-Jacobian product;
    `refine` steps of $u \leftarrow g + J^\top u$ from there correct it (each costs one). Then one
    vector-Jacobian product with respect to the parameters, as in `ImplicitAdjoint`. An
    approximation: exact in the directions the forward steps explored.

    **Arguments:** `refine` ($\ge 0$).
    """

    refine: int = eqx.field(static=True, default=0)

    def __check_init__(self):
        if self.refine < 0:
            raise ValueError(f"SharedInverse: `refine` must be >= 0; got {self.refine}.")

    def run(self, solver, fn, params, x0, budget):
        if not isinstance(solver, Broyden):
            raise ValueError(
                "SharedInverse reuses a quasi-Newton inverse estimate: the solver must be "
                f"eqattn.Broyden; got {type(solver).__name__}."
            )
        return _shared(params, solver, self, fn, x0, budget)


@eqx.filter_custom_vjp
def _shared(params, solver, adjoint, fn, x0, budget):
    return _solve(params, solver, fn, x0, budget)


@_shared.def_fwd
def _shared_fwd(perturbed, params, solver, adjoint, fn, x0, budget):
    x_star, it = _shared(params, solver, adjoint, fn, x0, budget)
    return (x_star, it), (x_star, it.state)


@_shared.def_bwd
def _shared_bwd(residuals, grad_obj, perturbed, params, solver, adjoint, fn, x0, budget):
    x_star, state = residuals
    g = grad_obj[0]
    if g is None:
        return jax.tree.map(lambda _: None, params)
    u = solver.inverse_adjoint(state, g)
    if adjoint.refine:
        _, jt = jax.vjp(lambda x: fn(x, params), x_star)
        u = lax.fori_loop(0, adjoint.refine, lambda _, u: g + jt(u)[0], u)
    _, vjp_params = eqx.filter_vjp(lambda p: fn(x_star, p), params)
    return vjp_params(u)[0]


class Phantom(AbstractAdjoint):
    r"""Phantom gradient: backprop through `steps` damped steps $z \leftarrow z + \lambda(f(z) -
    z)$ from $z^*$. The forward value is $z^*$ unchanged.

    **Arguments:** `steps` ($k \ge 1$), `damping` ($\lambda \in (0, 1]$).
    """

    steps: int = eqx.field(static=True, default=5)
    damping: float = 1.0

    def __check_init__(self):
        if self.steps < 1 or not 0 < self.damping <= 1:
            raise ValueError(
                f"Phantom: need steps >= 1 and damping in (0, 1]; got steps={self.steps}, "
                f"damping={self.damping}."
            )

    def run(self, solver, fn, params, x0, budget):
        frozen = _stop(params)
        it = iterate(solver, lambda x: fn(x, frozen), lax.stop_gradient(x0), budget)
        x_star = lax.stop_gradient(it.best_x)
        z = x_star
        for _ in range(self.steps):
            z = z + self.damping * (fn(z, params) - z)
        # value z*, derivative that of the phantom steps
        return x_star + (z - lax.stop_gradient(z)), it


class JacobianFree(AbstractAdjoint):
    r"""Jacobian-free backprop: the gradient of one application of $f$ at $z^*$, i.e. $u = g$
    (the same as `Phantom(steps=1, damping=1)`)."""

    def run(self, solver, fn, params, x0, budget):
        return Phantom(steps=1, damping=1.0).run(solver, fn, params, x0, budget)


class Unrolled(AbstractAdjoint):
    """Backprop through every step of the forward solve (a `lax.scan` of `solver.max_steps`
    guarded steps): the reference against which the others are checked. Memory grows with
    `max_steps`."""

    def run(self, solver, fn, params, x0, budget):
        it = iterate_unrolled(solver, lambda x: fn(x, params), x0, budget)
        return it.best_x, jax.tree.map(lax.stop_gradient, it)
