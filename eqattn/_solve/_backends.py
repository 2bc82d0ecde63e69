r"""The forward solve behind one interface, whoever's solver it is.

`fixed_point` and the adjoints see a solver only through `ForwardSolve`: `ForwardSolve(solver, budget)(g,
x0)` solves $x = g(x)$ on a flat vector and returns an [`eqattn.Equilibrium`][] (its `value` the
flat solution; nothing here is meant to be differentiated). Three kinds of solver are accepted:

- eqattn's own (`Anderson`, `Picard`, `Broyden`): the shared loop of `_loop.py`.
- [`eqattn.JaxoptSolver`][]: a jaxopt fixed-point class, run by jaxopt.
- Optimistix fixed-point solvers and root finders, run by `optx.fixed_point` / `optx.root_find`.

Each library is one [`SolverBackend`][] in `SOLVER_BACKENDS`, the one place a solver's kind is
decided: adding a library means adding one there, not touching the callers.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optimistix as optx
from jax import lax
from jaxtyping import Array, Int

from ._equilibrium import RESULTS, Equilibrium, choose, status
from ._loop import _norm, equilibrium, iterate
from ._solvers import AbstractFixedPointSolver


@functools.cache
def _jaxopt():
    """jaxopt, imported on first use (its import costs about a third of eqattn's, through
    scipy.optimize). It is archived upstream and warns on import; it is used only behind this
    interface."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module="jaxopt")
        warnings.filterwarnings("ignore", message=".*JAXopt is no longer maintained.*")
        import jaxopt
        import jaxopt.linear_solve
    return jaxopt


_OPTX_MAX_STEPS = 256  # optx.fixed_point's own default


def _summary(g, x, steps, ok, result, tol=None) -> Equilibrium:
    """An `Equilibrium` for a backend's answer `x`, measured as eqattn measures: one more
    evaluation of `g` gives $\\lVert g(x) - x\\rVert_2$. `ok` is the backend's verdict, or with
    `tol`, `residual <= tol`."""
    x = lax.stop_gradient(x)
    gx = g(x)
    finite = jnp.all(jnp.isfinite(gx)) & jnp.all(jnp.isfinite(x))
    residual = jnp.where(finite, _norm(gx - x), jnp.inf)
    scale = _norm(gx)
    ok = (ok if tol is None else residual <= tol) & finite
    result = status(ok, choose(finite, result, RESULTS.nonfinite))
    return Equilibrium(
        value=jnp.where(finite, x, jnp.nan),
        steps=jnp.asarray(steps, jnp.int32),
        residual=residual,
        relative_residual=residual / jnp.where(scale > 0, scale, 1),
        result=result,
    )


class JaxoptSolver(eqx.Module):
    r"""A jaxopt fixed-point solver as an eqattn solver, e.g.
    `JaxoptSolver(jaxopt.AndersonAcceleration, history_size=5, tol=1e-5, maxiter=100)` or
    `JaxoptSolver(jaxopt.FixedPointIteration, tol=1e-5)`.

    The solve is jaxopt's: `cls(fixed_point_fun=f, **options).run(z0, ...)`, stopping when its
    $\lVert f(z) - z\rVert_2 \le$ `tol` (absolute, over the whole state; under `vmap`, per
    example) or after `maxiter` iterations. With `fixed_point`'s default adjoint it is also
    differentiated by jaxopt: `implicit_diff=True`, the backward linear system solved by
    `implicit_diff_solve` (default: jaxopt's default, conjugate gradient on the normal equations
    to the relative tolerance 1e-5, tightened to `tol` when that is smaller, so a tight forward
    gets a gradient as accurate). Given an eqattn adjoint instead, jaxopt only solves and the
    adjoint differentiates.

    The returned [`eqattn.Equilibrium`][] has jaxopt's count of $f$ evaluations as `steps`;
    `residual`, `relative_residual` and `converged` (`residual <= tol`) are measured by eqattn
    at the returned point, which costs one more evaluation of $f$. jaxopt stops on the step
    $\lVert z_{k+1} - z_k\rVert$ before its last update, so the two tests can disagree by one
    step. jaxopt is no longer developed; [`eqattn.Anderson`][] is the maintained equivalent.

    **Arguments:** `cls`, a jaxopt fixed-point class (`jaxopt.AndersonAcceleration`,
    `jaxopt.FixedPointIteration`, ...); `**options`, its keyword arguments other than
    `fixed_point_fun` (`tol`, `maxiter`, `history_size`, `implicit_diff_solve`, ...).

    **Example:**

    ```python
    import jax.numpy as jnp, jaxopt, eqattn

    solver = eqattn.JaxoptSolver(jaxopt.AndersonAcceleration, tol=1e-6, maxiter=100)
    eq = eqattn.fixed_point(lambda z, _: jnp.cos(z), jnp.zeros(()), solver=solver)
    assert eq.converged and jnp.allclose(eq.value, 0.7390851, atol=1e-5)
    ```
    """

    cls: type = eqx.field(static=True)
    options: tuple[tuple[str, Any], ...] = eqx.field(static=True)

    def __init__(self, cls: type, **options):
        if not (isinstance(cls, type) and issubclass(cls, _jaxopt()._src.base.IterativeSolver)):
            raise ValueError(
                f"JaxoptSolver: `cls` must be a jaxopt fixed-point solver class such as "
                f"jaxopt.AndersonAcceleration; got {cls!r}."
            )
        for reserved in ("fixed_point_fun", "has_aux"):
            if reserved in options:
                raise ValueError(f"JaxoptSolver: `{reserved}` is set by eqattn; do not pass it.")
        self.cls = cls
        self.options = tuple(sorted(options.items()))
        try:  # let jaxopt check its own options now, not inside a trace
            self._make(lambda x: x)
        except TypeError as e:
            raise ValueError(f"JaxoptSolver: bad options for {cls.__name__}: {e}") from None
        if not self.tol > 0 or self.max_steps < 1:
            raise ValueError(
                f"JaxoptSolver: need tol > 0 and maxiter >= 1; got tol={self.tol}, "
                f"maxiter={self.max_steps}."
            )

    def _default(self, name):
        return inspect.signature(self.cls).parameters[name].default

    @property
    def tol(self) -> float:
        return dict(self.options).get("tol", self._default("tol"))

    @property
    def max_steps(self) -> int:
        return int(dict(self.options).get("maxiter", self._default("maxiter")))

    def _make(self, fun, maxiter=None, implicit_diff=True):
        options = dict(self.options)
        # jaxopt's default backward solve, to its default relative tolerance 1e-5 or to `tol`
        # where that is tighter (an absolute forward tol has no exact relative counterpart).
        options.setdefault(
            "implicit_diff_solve",
            functools.partial(_jaxopt().linear_solve.solve_normal_cg, tol=min(self.tol, 1e-5)),
        )
        if maxiter is not None:
            options["maxiter"] = maxiter
        if not implicit_diff:
            options["implicit_diff"] = False
        return self.cls(fixed_point_fun=fun, **options)

    def run(self, fn, params, x0, maxiter=None, implicit_diff=False):
        """Solve $x = fn(x, params)$ from the flat `x0`; with `implicit_diff`, jaxopt makes the
        solution differentiable with respect to the inexact arrays in `params`."""
        dynamic, static = eqx.partition(params, eqx.is_inexact_array)
        fun = lambda x, d: fn(x, eqx.combine(d, static))  # noqa: E731
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            sol = self._make(fun, maxiter, implicit_diff).run(x0, dynamic)
        steps = getattr(sol.state, "num_fun_eval", sol.state.iter_num)
        return sol.params, steps


def _optx_tolerances(solver) -> tuple[float, float]:
    inner = getattr(solver, "solver", solver)  # BestSoFar* wrap another solver
    return float(getattr(inner, "rtol", 0.0)), float(getattr(inner, "atol", 0.0))


def _static_steps(budget, default, name) -> int:
    """A Python step limit: `budget` capped by `default` (`None`: no cap; optx's default)."""
    if budget is None:
        return _OPTX_MAX_STEPS if default is None else default
    try:
        return min(int(budget), default) if default is not None else int(budget)
    except jax.errors.ConcretizationTypeError:
        raise ValueError(
            f"fixed_point: a traced `max_steps` needs one of eqattn's own solvers; {name} "
            "fixes its step limit when it is compiled. Pass a Python int."
        ) from None


class SolverBackend:
    """How eqattn runs one library's fixed-point solvers: whether it `accepts` a solver, the
    step `budget` of a call (at most the solver's own limit), the forward `solve` of $x = g(x)$
    on a flat vector as an [`eqattn.Equilibrium`][], and the solver's `tolerances`
    `(rtol, atol, max_steps)`, which a backward solve matches."""

    def accepts(self, solver) -> bool:
        raise NotImplementedError

    def budget(self, solver, max_steps) -> Any:
        # A Python int (or None: the solver's own limit): other libraries fix their step limit
        # when the program is compiled.
        return max_steps

    def solve(self, solver, g, x0, budget) -> Equilibrium:
        raise NotImplementedError

    def tolerances(self, solver, budget) -> tuple[Any, Any, int]:
        raise NotImplementedError


class _Eqattn(SolverBackend):
    """eqattn's own solvers: the shared loop of `_loop.py`."""

    def accepts(self, solver) -> bool:
        return isinstance(solver, AbstractFixedPointSolver)

    def budget(self, solver, max_steps) -> Any:
        # An int32 array: a call's budget may change without recompiling.
        budget = solver.max_steps if max_steps is None else jnp.minimum(max_steps, solver.max_steps)
        return jnp.asarray(budget, jnp.int32)

    def solve(self, solver, g, x0, budget) -> Equilibrium:
        return equilibrium(solver, iterate(solver, g, x0, budget))

    def tolerances(self, solver, budget):
        return solver.rtol, solver.atol, solver.max_steps


class _Jaxopt(SolverBackend):
    """jaxopt's fixed-point classes, wrapped in [`eqattn.JaxoptSolver`][]."""

    def accepts(self, solver) -> bool:
        return isinstance(solver, JaxoptSolver)

    def solve(self, solver, g, x0, budget) -> Equilibrium:
        steps = _static_steps(budget, solver.max_steps, "JaxoptSolver")
        x, count = solver.run(lambda x, _: g(x), None, x0, maxiter=steps)
        return _summary(g, x, count, None, RESULTS.max_steps_reached, tol=solver.tol)

    def tolerances(self, solver, budget):
        return 0.0, solver.tol, solver.max_steps


class _Optimistix(SolverBackend):
    """Optimistix's fixed-point solvers and root finders, run by `optx.fixed_point`."""

    def accepts(self, solver) -> bool:
        return isinstance(solver, optx.AbstractFixedPointSolver | optx.AbstractRootFinder)

    def solve(self, solver, g, x0, budget) -> Equilibrium:
        steps = _static_steps(budget, None, type(solver).__name__)
        sol: optx.Solution = optx.fixed_point(
            lambda y, _: g(y),
            solver,
            x0,
            max_steps=steps,
            throw=False,
            adjoint=optx.RecursiveCheckpointAdjoint(),
        )
        ok = sol.result == optx.RESULTS.successful
        reached = sol.result == optx.RESULTS.nonlinear_max_steps_reached
        result = choose(reached, RESULTS.max_steps_reached, RESULTS.failed)
        return _summary(g, sol.value, sol.stats["num_steps"], ok, result)

    def tolerances(self, solver, budget):
        rtol, atol = _optx_tolerances(solver)
        return rtol, atol, _static_steps(budget, None, type(solver).__name__)


SOLVER_BACKENDS: tuple[SolverBackend, ...] = (_Eqattn(), _Jaxopt(), _Optimistix())


Solver = (
    AbstractFixedPointSolver
    | JaxoptSolver
    | optx.AbstractFixedPointSolver
    | optx.AbstractRootFinder
)
"""What `fixed_point` and the layers take as a solver: eqattn's, jaxopt's (wrapped) or
Optimistix's."""


def solver_backend(solver) -> SolverBackend:
    """The backend that runs `solver`, or a `ValueError` naming what is accepted."""
    for backend in SOLVER_BACKENDS:
        if backend.accepts(solver):
            return backend
    raise ValueError(
        "`solver` must be one of eqattn's fixed-point solvers (eqattn.Anderson, Picard, "
        "Broyden), an eqattn.JaxoptSolver, or an Optimistix fixed-point solver or root "
        f"finder; got {solver!r}."
    )


class ForwardSolve(eqx.Module):
    r"""The forward solve of $x = g(x)$ with `solver`, at most `budget` steps, from a flat `x0`:
    `ForwardSolve(solver, budget)(g, x0)` returns an [`eqattn.Equilibrium`][] with the flat
    solution as `value` (not meant to be differentiated: adjoints decide the derivative).

    `budget` is an int32 array for eqattn's solvers (so it may change without recompiling), a
    Python int or `None` (the solver's own limit) for the others.

    **Example:**

    ```python
    import jax.numpy as jnp, eqattn

    solve = eqattn.ForwardSolve(eqattn.Picard(rtol=1e-6), budget=jnp.int32(100))
    eq = solve(jnp.cos, jnp.zeros(1))  # x = g(x) on a flat vector
    assert eq.converged and jnp.allclose(eq.value, 0.7390851, atol=1e-5)
    ```
    """

    solver: Any
    budget: Int[Array, ""] | int | None

    def __call__(self, g: Callable[[Array], Array], x0: Array) -> Equilibrium:
        return solver_backend(self.solver).solve(self.solver, g, x0, self.budget)


def tolerances(solver, budget=None) -> tuple[Any, Any, int]:
    """`(rtol, atol, max_steps)` of any accepted solver, for a backward solve to match."""
    return solver_backend(solver).tolerances(solver, budget)
