r"""The modern Hopfield energy and its attention update.

For stored patterns $X = (x_1, \dots, x_m)$, a state $\xi$ and $M = \max_i \lVert x_i\rVert$,

$$E(\xi) = -\tfrac1\beta \log\sum_i e^{\beta x_i\cdot\xi} + \tfrac12 \xi\cdot\xi
           + \tfrac1\beta \log m + \tfrac12 M^2 \;\ge 0,$$

and the update $\xi \leftarrow X\,\mathrm{softmax}(\beta X^\top \xi)$ (attention of $\xi$ over the
patterns) is the concave-convex procedure step: $E$ never increases (H. Ramsauer et al., "Hopfield
Networks is All You Need", arXiv:2008.02217, 2020). Since $\nabla E(\xi) = \xi - \mathrm{update}(\xi)$,
its fixed points are the stationary points of $E$.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from ._attention import attention, log_normalizer


def _check(state, patterns, mask) -> tuple[Array, Array, Array | None]:
    state, patterns = jnp.asarray(state), jnp.asarray(patterns)
    if state.ndim < 1 or patterns.ndim < 2 or state.shape[-1] != patterns.shape[-1]:
        raise ValueError(
            "`state` must have shape [..., d] and `patterns` shape [..., m, d] with the same d; "
            f"got state {state.shape}, patterns {patterns.shape}."
        )
    if mask is None:
        return state, patterns, None
    mask = jnp.asarray(mask)
    m = patterns.shape[-2]
    batch = jnp.broadcast_shapes(state.shape[:-1], patterns.shape[:-2])
    ok = mask.dtype == jnp.bool_ and mask.ndim >= 1 and mask.shape[-1] in (1, m)
    try:
        ok = ok and jnp.broadcast_shapes(batch, mask.shape[:-1]) == batch
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"`mask` must be boolean with shape [..., m] broadcasting to the batch {batch} "
            f"with m = {m} stored patterns; got {mask.dtype} {mask.shape}."
        )
    return state, patterns, mask


def hopfield_energy(
    state: Float[ArrayLike, "*#batch d"],
    patterns: Float[ArrayLike, "*#batch m d"],
    *,
    beta: float | Float[ArrayLike, "*#batch"] = 1.0,
    mask: Bool[ArrayLike, "*#batch m"] | None = None,
) -> Float[Array, "*batch"]:
    r"""The modern Hopfield energy $E(\xi)$ above (non-negative; 0 only at a stored pattern of
    maximal norm in the limit $\beta\to\infty$).

    **Arguments:**

    - `state`: `[..., d]`, the state pattern $\xi$.
    - `patterns`: `[..., m, d]`, the stored patterns $x_i$ as rows.
    - `beta`: inverse temperature $\beta > 0$, a number or an array broadcasting to `[...]`.
    - `mask`: `[..., m]`, `True` for the stored patterns that take part (e.g. `False` for
      padding); broadcasts against the batch. The energy equals that of the kept patterns alone
      ($m$ and $M$ counting only those). With every pattern masked it is NaN (there is no
      memory).

    **Returns:** `[...]`.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    X = jax.random.normal(jax.random.key(0), (5, 3))  # 5 stored patterns
    xi = jnp.array([0.3, -1.0, 0.5])
    E = eqattn.hopfield_energy(xi, X, beta=4.0)
    M2 = jnp.max(jnp.sum(X**2, axis=-1))
    ref = -jax.nn.logsumexp(4.0 * X @ xi) / 4.0 + xi @ xi / 2 + jnp.log(5.0) / 4.0 + M2 / 2
    assert E >= 0 and jnp.allclose(E, ref, atol=1e-5)
    ```
    """
    state, patterns, mask = _check(state, patterns, mask)
    if mask is not None:
        # The core already ignores masked keys; the norms below must too (NaN or Inf in a
        # masked pattern reaches neither the energy nor its gradients).
        patterns = jnp.where(mask[..., None], patterns, 0)
    beta_ = jnp.asarray(beta)
    core_mask = None if mask is None else mask[..., None, :]
    lse = log_normalizer(state[..., None, :], patterns, beta=beta, mask=core_mask)[..., 0]
    norms_sq = jnp.sum(patterns * patterns, axis=-1)  # masked patterns are zero here
    m = patterns.shape[-2] if mask is None else jnp.sum(mask, axis=-1)
    return (
        -lse / beta_
        + 0.5 * jnp.sum(state * state, axis=-1)
        + jnp.log(m) / beta_
        + 0.5 * jnp.max(norms_sq, axis=-1)
    )


def hopfield_update(
    state: Float[ArrayLike, "*#batch d"],
    patterns: Float[ArrayLike, "*#batch m d"],
    *,
    beta: float | Float[ArrayLike, "*#batch"] = 1.0,
    mask: Bool[ArrayLike, "*#batch m"] | None = None,
) -> Float[Array, "*batch d"]:
    r"""One Hopfield update $\xi \leftarrow X\,\mathrm{softmax}(\beta X^\top\xi)$, which never
    increases [`eqattn.hopfield_energy`][]. Arguments as there; a masked pattern is dropped from
    the softmax, and with every pattern masked the update is 0 (as
    [`eqattn.attention`][] gives for a fully masked row).

    **Returns:** `[..., d]`.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    X = jax.random.normal(jax.random.key(0), (5, 3))
    xi = jnp.array([0.3, -1.0, 0.5])
    new = eqattn.hopfield_update(xi, X, beta=4.0)
    assert jnp.allclose(new, jax.nn.softmax(4.0 * X @ xi) @ X, atol=1e-6)
    # a step of the concave-convex procedure: the energy does not rise
    assert eqattn.hopfield_energy(new, X, beta=4.0) <= eqattn.hopfield_energy(xi, X, beta=4.0)
    ```
    """
    state, patterns, mask = _check(state, patterns, mask)
    core_mask = None if mask is None else mask[..., None, :]
    return attention(state[..., None, :], patterns, beta=beta, mask=core_mask)[..., 0, :]
