r"""`fixed_point`: find $z^* = f(z^*, \mathrm{args})$ and differentiate through it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree
from jaxtyping import ArrayLike, Int, PyTree

from ._adjoints import AbstractAdjoint, ImplicitAdjoint, JaxoptImplicit, _with_value
from ._backends import ForwardSolve, JaxoptSolver, solver_backend
from ._equilibrium import Equilibrium
from ._solvers import AbstractFixedPointSolver, Anderson


def _describe(tree) -> str:
    return str(jax.tree.map(lambda x: f"{jnp.dtype(x.dtype).name}{list(x.shape)}", tree))


def _check_structure(fn, z0, args):
    for leaf in jax.tree.leaves(z0):
        if not jnp.issubdtype(jnp.result_type(leaf), jnp.inexact):
            raise ValueError(
                f"`z0` must be a pytree of floating-point arrays; got {_describe(z0)}."
            )
    out = eqx.filter_eval_shape(fn, z0, args)  # `args` may hold any pytree (functions too)
    same = jax.tree.structure(out) == jax.tree.structure(z0) and all(
        jnp.shape(a) == jnp.shape(b) and jnp.result_type(a) == jnp.result_type(b)
        for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(z0))
    )
    if not same:
        raise ValueError(
            "`fn(z, args)` must return a pytree with the structure, shapes and dtypes of `z0`; "
            f"z0 is {_describe(z0)}, fn returned {_describe(out)}."
        )


def _settings(tree):
    """`tree` with any traced leaf cut from differentiation (`jax.lax.stop_gradient`)."""
    return jax.tree.map(
        lambda a: jax.lax.stop_gradient(a) if isinstance(a, jax.core.Tracer) else a, tree
    )


def default_adjoint(solver) -> AbstractAdjoint:
    """`fixed_point`'s adjoint when none is given: jaxopt's implicit differentiation for a
    [`eqattn.JaxoptSolver`][], else [`eqattn.ImplicitAdjoint`][]`()`."""
    return JaxoptImplicit() if isinstance(solver, JaxoptSolver) else ImplicitAdjoint()


def fixed_point(
    fn: Callable[[PyTree, PyTree], PyTree],
    z0: PyTree[ArrayLike],
    args: PyTree = None,
    *,
    solver: AbstractFixedPointSolver | JaxoptSolver | Any = None,
    adjoint: AbstractAdjoint | None = None,
    throw: bool = False,
    budget: int | Int[ArrayLike, ""] | None = None,
) -> Equilibrium:
    r"""Solve $z^* = f(z^*, \mathrm{args})$ from `z0` and make $z^*$ differentiable.

    The solver stops when $\lVert f(z) - z\rVert_2 \le \mathrm{atol} + \mathrm{rtol}\,\lVert
    f(z)\rVert_2$, after `budget` evaluations of $f$, or when $f$ returns NaN/Inf; it returns the
    iterate with the lowest residual as a multiple of that tolerance (a state that grows from
    zeros to its fixed point is answered by its converged iterate, not its small start). Under
    `jax.vmap` each example stops on its own test and gets its own statistics.

    Gradients with respect to `args` and to arrays that `fn` closes over follow `adjoint` (by
    default the implicit function theorem, solved as accurately as the forward). No gradient
    flows to `z0`: a fixed point does not depend on where the search started, so `z0` can be a
    warm start (e.g. the previous solution).

    **Arguments:**

    - `fn`: `fn(z, args) -> z'` with `z'` of the structure, shapes and dtypes of `z`.
    - `z0`: the initial guess, any pytree of floating-point arrays.
    - `args`: any pytree passed to `fn` (arrays, functions, modules, ...).
    - `solver`: eqattn's [`eqattn.Anderson`][] (default), [`eqattn.Picard`][] or
      [`eqattn.Broyden`][]; a jaxopt solver as [`eqattn.JaxoptSolver`][]; or an Optimistix
      fixed-point solver or root finder (`optx.FixedPointIteration(rtol, atol)`,
      `optx.BestSoFarFixedPoint(...)`, `optx.Newton(...)`, ...), run by `optx.fixed_point`.
    - `adjoint`: `None` (default): [`eqattn.ImplicitAdjoint`][] (whose backward solve takes this
      solver's tolerances), or jaxopt's own implicit differentiation for a `JaxoptSolver`. Else
      [`eqattn.JacobianFree`][], [`eqattn.Phantom`][], [`eqattn.SharedInverse`][] (Broyden only),
      [`eqattn.Unrolled`][] (eqattn's solvers only), or an `ImplicitAdjoint` of your choosing.
    - `throw`: raise a runtime error (inside `jit` too) if the forward solve does not converge,
      and, unless the adjoint has its own `throw`, if its backward solve does not. With
      `throw=False`, non-convergence is reported in the returned fields and a gradient is the
      adjoint's at the returned iterate (see [`eqattn.AbstractAdjoint`][]).
    - `budget`: the evaluations of $f$ this call may make, at most the solver's cap
      `solver.max_steps` (None: the cap). For eqattn's solvers it may be a traced integer, so
      changing it does not recompile; for jaxopt and Optimistix solvers it must be a Python int
      (Optimistix's default: 256).

    **Returns:** an [`eqattn.Equilibrium`][].

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    # z = cos(a z): its derivative in a by the implicit function theorem
    solve = lambda a: eqattn.fixed_point(lambda z, a: jnp.cos(a * z), jnp.zeros(()), a).value
    z = solve(1.0)
    assert jnp.allclose(z, jnp.cos(z), atol=1e-4)
    dz = jax.grad(solve)(1.0)  # dz/da = -z sin(z) / (1 + sin(z))
    assert jnp.allclose(dz, -z * jnp.sin(z) / (1 + jnp.sin(z)), atol=1e-3)
    ```
    """
    solver, adjoint = _checked(solver, adjoint)
    z0 = jax.tree.map(jnp.asarray, z0)
    _check_structure(fn, z0, args)
    steps = solver_backend(solver).budget(solver, budget)
    x0, unravel, flat_fn, params = _flattened(fn, z0, args)
    eq = adjoint.run(flat_fn, params, x0, solve=ForwardSolve(solver, steps), throw=throw)
    value = unravel(eq.value)
    if throw:  # the message of the failure's kind (RESULTS)
        value = eq.result.error_if(value, ~eq.converged)
    return _with_value(eq, value)


def _checked(solver, adjoint):
    """The solver (default Anderson) and adjoint (default: the solver's), checked, with their
    float fields made settings."""
    solver = Anderson() if solver is None else solver
    solver_backend(solver)  # checks it
    adjoint = default_adjoint(solver) if adjoint is None else adjoint
    if not isinstance(adjoint, AbstractAdjoint):
        raise ValueError(f"`adjoint` must be an eqattn adjoint; got {adjoint!r}.")
    # Settings, not parameters: `jax.grad` over a layer traces its solver's float fields
    # (tolerances, damping); they take no gradient.
    return _settings(solver), _settings(adjoint)


def _flattened(fn, z0, args):
    """`(x0, unravel, flat_fn, params)`: the problem on one flat vector, `flat_fn(x, params)`,
    with `params` holding `args` and the arrays `fn` closes over."""
    x0, unravel = ravel_pytree(z0)
    # A fixed point does not depend on where the search starts: no gradient flows to z0 (also
    # when z0 is computed from the parameters, e.g. a warm start or the input itself).
    x0 = jax.lax.stop_gradient(x0)
    # Arrays that `fn` closes over become leaves of `closed`, so they can be differentiated.
    closed = eqx.filter_closure_convert(fn, z0, args)

    # Scalar arrays travel as shape [1]: under `jax.grad` with respect to a Python float, a
    # custom VJP would receive the scalar's primal as a Python float, which Equinox's filtering
    # treats as static (no gradient: an error, or silently zero for a closed-over one).
    params = (closed, args)
    boxed = jax.tree.map(lambda a: eqx.is_inexact_array(a) and jnp.ndim(a) == 0, params)
    params = jax.tree.map(lambda a, b: a[None] if b else a, params, boxed)

    def flat_fn(x, params):
        fn_, args_ = jax.tree.map(lambda a, b: a[0] if b else a, params, boxed)
        return ravel_pytree(fn_(unravel(x), args_))[0]

    return x0, unravel, flat_fn, params
