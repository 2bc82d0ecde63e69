"""The result of a fixed-point solve."""

from __future__ import annotations

import equinox as eqx
from jaxtyping import Array, Bool, Float, Int, PyTree


class Equilibrium(eqx.Module):
    r"""A fixed point $z^* = f(z^*, \mathrm{args})$ and how it was found.

    All fields are arrays, so an `Equilibrium` passes through `jit`, and under `vmap` each example
    has its own statistics.

    **Fields:**

    - `value`: $z^*$, the iterate with the lowest residual (same structure as `z0`);
      differentiable according to the adjoint.
    - `steps`: evaluations of $f$ made (including the first, at `z0`).
    - `residual`: $\lVert f(z^*) - z^*\rVert_2$ (`inf` if $f$ returned NaN/Inf at every iterate).
    - `relative_residual`: `residual` $/\,\lVert f(z^*)\rVert_2$.
    - `converged`: whether `residual <= atol + rtol * |f(z*)|`.
    """

    value: PyTree[Array]
    steps: Int[Array, ""]
    residual: Float[Array, ""]
    relative_residual: Float[Array, ""]
    converged: Bool[Array, ""]
