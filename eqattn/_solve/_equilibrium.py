"""The result of a fixed-point solve."""

from __future__ import annotations

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
        "The residual |f(z) - z| stayed above the solver's tolerance within max_steps."
    )
    nonfinite = "f returned NaN or Inf (or the iterates did), and the solve stopped there."
    failed = "The solver reported a failure other than running out of steps (e.g. divergence)."


class Equilibrium(eqx.Module):
    r"""A fixed point $z^* = f(z^*, \mathrm{args})$ and how it was found.

    All fields are arrays (or an array-valued [`eqattn.RESULTS`][] item), so an `Equilibrium`
    passes through `jit`, and under `vmap` each example has its own statistics.

    **Fields:**

    - `value`: $z^*$, the iterate with the lowest residual (same structure as `z0`);
      differentiable according to the adjoint.
    - `steps`: evaluations of $f$ made (including the first, at `z0`); jaxopt's own count of
      them for a [`eqattn.JaxoptSolver`][]; Optimistix's iteration count for its solvers.
    - `residual`: $\lVert f(z^*) - z^*\rVert_2$ (`inf` if $f$ returned NaN/Inf at every iterate).
    - `relative_residual`: `residual` $/\,\lVert f(z^*)\rVert_2$.
    - `converged`: whether the solver's test passed at $z^*$: `residual <= atol + rtol * |f(z*)|`
      for eqattn's solvers and [`eqattn.JaxoptSolver`][] (`atol = tol`, `rtol = 0`); the
      solver's own test for Optimistix solvers.
    - `result`: an [`eqattn.RESULTS`][] item: `successful` exactly when `converged`, otherwise
      `max_steps_reached`, `nonfinite` or `failed`.
    - `energy_rose`: for a solve that has an energy to descend (the Hopfield layers), whether
      the energy at $z^*$ is above, by more than round-off, the energy at the first plain
      update of the start (every solver's first evaluation of $f$). Plain (concave-convex)
      updates only descend from there, so `True` means $z^*$ is not where repeated updates
      go (an extrapolating solver, or a solve stopped at its start). `False` does not prove
      the converse. `None` where no energy is defined.

    **Example:**

    ```python
    import jax.numpy as jnp, eqattn

    eq = eqattn.fixed_point(lambda z, _: jnp.cos(z), jnp.zeros(()), solver=eqattn.Picard(max_steps=3))
    assert not eq.converged and eq.steps == 3  # out of steps: reported, not hidden
    assert eq.result == eqattn.RESULTS.max_steps_reached and eq.residual > 1e-4
    ```
    """

    value: PyTree[Array]
    steps: Int[Array, ""]
    residual: Float[Array, ""]
    relative_residual: Float[Array, ""]
    converged: Bool[Array, ""]
    result: RESULTS
    energy_rose: Bool[Array, ""] | None = None
