r"""The one loop of eqattn's fixed-point solvers: an `Iteration` carry, one step (`first`, then
`advance`), and the drivers of it, each for a stated reason; `equilibrium` summarises a finished
loop and `best_answer` is its answer when nothing is differentiated through it."""

from __future__ import annotations

import dataclasses
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Bool, Float, Int

from ._equilibrium import RESULTS, Equilibrium, choose, status
from ._solvers import AbstractFixedPointSolver, over_tolerance


class Iteration(eqx.Module):
    """The loop's carry."""

    step: Int[Array, ""]
    x: Array
    fx: Array
    state: Any
    best_x: Array
    best_residual: Float[Array, ""]
    best_scale: Float[Array, ""]
    best_multiple: Float[Array, ""]  # the best iterate's residual as a multiple of its tolerance
    done: Bool[Array, ""]
    nonfinite: Bool[Array, ""]  # f(x) or x was not finite at the last step
    last_is_best: Bool[Array, ""]  # the last iterate ranks best (fx is its image)


def _norm(x):
    return jnp.sqrt(jnp.sum(x * x))


def measure(solver: AbstractFixedPointSolver, x, fx):
    r"""`(residual, scale, multiple)`: $\lVert f(x) - x\rVert_2$, $\lVert f(x)\rVert_2$, and
    the residual as a multiple of the stopping test's tolerance (<= 1: passed; `inf` where
    anything is not finite): of `atol + rtol * scale`, or with `solver.elementwise` the largest
    entry's $|f(x)_k - x_k|$ over its own `atol + rtol |f(x)_k|`. Iterates are ranked by it
    (with `elementwise`, the latest finite one is the best)."""
    finite = jnp.all(jnp.isfinite(fx)) & jnp.all(jnp.isfinite(x))
    residual, scale = _norm(fx - x), _norm(fx)
    if solver.elementwise:
        tolerance = solver.atol + solver.rtol * jnp.abs(fx)
        tiny = jnp.finfo(jnp.result_type(fx)).tiny
        multiple = jnp.max(jnp.abs(fx - x) / jnp.maximum(tolerance, tiny), initial=0.0)
    else:
        multiple = over_tolerance(solver, residual, scale)
    bad = jnp.array(jnp.inf, residual.dtype)
    return jnp.where(finite, residual, bad), scale, jnp.where(finite, multiple, bad)


def first(solver, fn, x0) -> Iteration:
    fx = fn(x0)
    finite = jnp.all(jnp.isfinite(fx))
    residual, scale, multiple = measure(solver, x0, fx)
    return Iteration(
        step=jnp.array(1),
        x=x0,
        fx=fx,
        state=solver.init(x0, fx),
        best_x=x0,
        best_residual=residual,
        best_scale=scale,
        best_multiple=multiple,
        done=(multiple <= 1) | ~finite,
        nonfinite=~finite,
        last_is_best=jnp.array(True),
    )


def advance(solver, fn, it: Iteration) -> Iteration:
    """One solver step and one evaluation of f; keeps the best iterate (`over_tolerance`)."""
    x, state = solver.step(it.x, it.fx, it.state)
    return tested(solver, it, x, state, fn(x))


def tested(solver, it: Iteration, x, state, fx) -> Iteration:
    """The loop's carry after the step to `x` (solver state `state`), given its image `fx`."""
    finite = jnp.all(jnp.isfinite(fx)) & jnp.all(jnp.isfinite(x))
    residual, scale, multiple = measure(solver, x, fx)
    passed = (multiple <= 1) & finite
    # with the elementwise test, parts of the state settle one after another (a front crossing
    # a graph): the latest finite iterate has the most settled, whatever its largest entry says
    better = finite if solver.elementwise else multiple < it.best_multiple
    return Iteration(
        step=it.step + 1,
        x=x,
        fx=fx,
        state=solver.record(x, fx, state),
        best_x=jnp.where(better, x, it.best_x),
        best_residual=jnp.where(better, residual, it.best_residual),
        best_scale=jnp.where(better, scale, it.best_scale),
        best_multiple=jnp.where(better, multiple, it.best_multiple),
        done=passed | ~finite,
        nonfinite=~finite,
        last_is_best=better,
    )


def best_answer(solver: AbstractFixedPointSolver, it: Iteration) -> Array:
    """A finished loop's best answer when nothing is differentiated through it: for a solve
    that ran out of steps with its iterates still improving (the last ranks best), the solver's
    next step from there, which the evaluation of $f$ that tested the
    last iterate already paid for (one more evaluation would have tested it; for Picard it is
    $f(x)$); otherwise (converged, non-finite, stalled) the best-ranked iterate. The
    implicit adjoint's backward solve returns it."""
    extrapolate = it.last_is_best & ~it.done
    return jnp.where(extrapolate, solver.step(it.x, it.fx, it.state)[0], it.best_x)


def equilibrium(solver: AbstractFixedPointSolver, it: Iteration) -> Equilibrium:
    """The public summary of a finished loop (`value` is the flat best iterate)."""
    ok = (it.best_multiple <= 1) & jnp.isfinite(it.best_residual)
    scale = jnp.where(it.best_scale > 0, it.best_scale, 1)
    result = status(ok, choose(it.nonfinite, RESULTS.nonfinite, RESULTS.max_steps_reached))
    # No finite evaluation of f at all (e.g. NaN in the input): the answer is NaN, not z0.
    value = jnp.where(jnp.isfinite(it.best_residual), it.best_x, jnp.nan)
    return Equilibrium(
        value=value,
        steps=it.step,
        residual=it.best_residual,
        relative_residual=it.best_residual / scale,
        result=result,
    )


def _going(it: Iteration, budget):
    return ~it.done & (it.step < budget)


# One step (`first`, then `advance`), four drivers of it, each for a reason it states: `iterate`
# (a while loop that stops early: the forward solve), `iterate_fixed` (a fixed-length loop:
# short backward solves under vmap, where the while loop's selects cost more), `iterate_to_last`
# (`iterate` plus the evaluation a gradient's linearization shares) and `iterate_unrolled` (a
# scan, for reverse-mode autodiff through the steps: `Unrolled`).


def iterate(solver: AbstractFixedPointSolver, fn, x0, budget) -> Iteration:
    """Run to convergence, NaN/Inf, or `budget` evaluations of `fn` (a `lax.while_loop` taking
    `solver.check_every` guarded steps per trip)."""

    def trip(it):
        it = advance(solver, fn, it)  # the loop's test said this one is needed
        for _ in range(solver.check_every - 1):
            # Selected, not branched on: a branch would need the predicate on the host.
            go = _going(it, budget)
            it = jax.tree.map(lambda a, b: jnp.where(go, a, b), advance(solver, fn, it), it)
        return it

    return lax.while_loop(lambda it: _going(it, budget), trip, first(solver, fn, x0))


def iterate_fixed(solver: AbstractFixedPointSolver, fn, x0, budget: int) -> Iteration:
    """As `iterate` for a static `budget`, as a loop of exactly `budget - 1` guarded steps (no
    early exit). The guard (`jnp.where` on the loop's test, per example under `vmap`) leaves out
    the solver's state: only iterates still going read it (a stopped one's answer is its
    best-ranked iterate, which `best_answer` and `equilibrium` return). So under `vmap` the
    state is not selected at every step (as `iterate`'s `while_loop` selects all of its carry),
    and the state's own step count stays unbatched: Anderson's history is written in place, not
    scattered.
    For short solves whose examples rarely all stop early (a truncated backward solve)."""

    def body(_, it):
        new = advance(solver, fn, it)
        go = _going(it, budget)
        kept = jax.tree.map(
            lambda a, b: jnp.where(go, a, b),
            dataclasses.replace(new, state=None),
            dataclasses.replace(it, state=None),
        )
        return dataclasses.replace(kept, state=new.state)

    it = first(solver, fn, x0)
    return lax.fori_loop(0, budget - 1, body, it)


def iterate_to_last(solver: AbstractFixedPointSolver, fn, x0, budget) -> tuple[Iteration, Array]:
    """As `iterate`, with the last evaluation of `fn` made after the loop, at a point returned
    with the loop: `(it, x_lin)`. A gradient then linearizes `fn` at `x_lin` by evaluating it
    there again, which XLA merges with this evaluation (the same operations on the same
    operands), so the linearization costs no evaluation of its own. `x_lin` is the last iterate
    if the budget allowed that evaluation as a step (the best-ranked iterate, which the
    loop returns, unless the iterates stopped improving), else (the solve had stopped, e.g.
    converged) the iterate the loop returns; the evaluation then only serves the
    linearization."""
    it = iterate(solver, fn, x0, budget - 1)
    go = _going(it, budget)
    x_next, state = solver.step(it.x, it.fx, it.state)
    x_lin = jnp.where(go, x_next, it.best_x)
    stepped = tested(solver, it, x_lin, state, fn(x_lin))
    return jax.tree.map(lambda a, b: jnp.where(go, a, b), stepped, it), x_lin


def iterate_unrolled(solver: AbstractFixedPointSolver, fn, x0, budget) -> Iteration:
    """As `iterate`, as a `lax.scan` of `solver.max_steps` guarded steps, so reverse-mode autodiff
    can go through every step."""
    it = first(solver, fn, x0)

    def body(it, _):
        return lax.cond(
            _going(it, budget), lambda it: advance(solver, fn, it), lambda it: it, it
        ), None

    return lax.scan(body, it, length=solver.max_steps - 1)[0]
