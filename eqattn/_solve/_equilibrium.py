"""The result of a fixed-point solve."""

from __future__ import annotations

from typing import Any

import equinox as eqx
from jaxtyping import Array, Bool, Float, Int, PyTree


class RESULTS(eqx.Enumeration):
    """How a fixed-point solve ended (the `result` of an [`eqattn.Equilibrium`][]).

    Compare with `==`, e.g. `eq.result == eqattn.RESULTS.successful` (an array; per example
    under `vmap`).

    **Example:**

    ```python
    import jax.numpy as jnp, eqattn

    eq = eqattn.fixed_point(lambda z, _: z + jnp.nan, jnp.zeros(()))
    assert eq.result == eqattn.RESULTS.nonfinite and jnp.isnan(eq.value)
    ```
    """

    successful = ""
    max_steps_reached = (
        "eqattn.fixed_point did not converge: the residual |f(z) - z| stayed above the solver's "
        "tolerance within its step budget."
    )
    nonfinite = (
        "eqattn.fixed_point did not converge: f returned NaN or Inf (or the iterates did), and "
        "the solve stopped there."
    )
    unsettled = (
        "eqattn.fixed_point's test passed on the whole state, but a part of it still moved by "
        "more than the tolerance of its own size (e.g. a graph layer's front that had not "
        "arrived): the layer reported it as not converged."
    )
    failed = (
        "eqattn.fixed_point did not converge: the solver reported a failure other than running "
        "out of steps (e.g. divergence)."
    )


def choose(pred, a: Any, b: Any) -> RESULTS:
    """`a` where `pred`, else `b` (per example under `vmap`). Equinox types an Enumeration's
    items as their messages' `str`; this is where they are taken as what they are."""
    return RESULTS.where(pred, a, b)


def status(ok, otherwise: Any) -> RESULTS:
    """`successful` where `ok`, else `otherwise`."""
    return choose(ok, RESULTS.successful, otherwise)


class Equilibrium(eqx.Module):
    r"""A fixed point $z^* = f(z^*, \mathrm{args})$ and how it was found.

    All fields are arrays (or an array-valued [`eqattn.RESULTS`][] item), so an `Equilibrium`
    passes through `jit`, and under `vmap` each example has its own statistics.

    **Fields:**

    - `value`: $z^*$, the iterate the stopping test rates best: the lowest residual as a
      multiple of its tolerance `atol + rtol * |f(z)|` (same structure as `z0`);
      differentiable according to the adjoint.
    - `steps`: evaluations of $f$ made (including the first, at `z0`); jaxopt's own count of
      them for a [`eqattn.JaxoptSolver`][]; Optimistix's iteration count for its solvers.
    - `residual`: $\lVert f(z^*) - z^*\rVert_2$ (`inf` if $f$ returned NaN/Inf at every iterate).
    - `relative_residual`: `residual` $/\,\lVert f(z^*)\rVert_2$.
    - `result`: an [`eqattn.RESULTS`][] item, the one status of the solve: `successful` when
      the solver's test passed at $z^*$ (`residual <= atol + rtol * |f(z*)|` for eqattn's
      solvers and [`eqattn.JaxoptSolver`][] (`atol = tol`, `rtol = 0`); the solver's own test
      for Optimistix solvers), otherwise `max_steps_reached`, `nonfinite` or `failed`.
      `converged` (a property) is `result == RESULTS.successful`.
    - `stats`: what a solve reports beyond these, by name (as Optimistix's `Solution.stats`):
      the Hopfield layers' `energy_rose`, whether the energy at $z^*$ is above, by more than
      round-off, the energy at the first plain update of the start (every solver's first
      evaluation of $f$). Plain (concave-convex) updates only descend from there, so `True`
      means $z^*$ is not where repeated updates go (an extrapolating solver, or a solve stopped
      at its start); `False` does not prove the converse.

    **Example:**

    ```python
    import jax.numpy as jnp, eqattn

    eq = eqattn.fixed_point(lambda z, _: jnp.cos(z), jnp.zeros(()), solver=eqattn.Picard(max_steps=3))
    assert not eq.converged and eq.steps == 3  # out of steps: reported, not hidden
    assert eq.result == eqattn.RESULTS.max_steps_reached and eq.residual > 1e-4
    ```
    """

    value: PyTree[Array]
    steps: Int[Array, "*batch"]
    residual: Float[Array, "*batch"]
    relative_residual: Float[Array, "*batch"]
    result: RESULTS
    stats: dict[str, Array] = eqx.field(default_factory=dict)

    @property
    def converged(self) -> Bool[Array, "*batch"]:
        """Whether the solver's test passed at the returned iterate: `result == successful`."""
        return self.result == RESULTS.successful
