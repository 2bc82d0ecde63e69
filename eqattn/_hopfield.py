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
from jaxtyping import Array, ArrayLike, Float

from ._attention import attention, log_normalizer


def _check(state, patterns):
    state, patterns = jnp.asarray(state), jnp.asarray(patterns)
    if state.ndim < 1 or patterns.ndim < 2 or state.shape[-1] != patterns.shape[-1]:
        raise ValueError(
            "`state` must have shape [..., d] and `patterns` shape [..., m, d] with the same d; "
            f"got state {state.shape}, patterns {patterns.shape}."
        )
    return state, patterns


def hopfield_energy(
    state: Float[ArrayLike, "*#batch d"],
    patterns: Float[ArrayLike, "*#batch m d"],
    *,
    beta: float | Float[ArrayLike, "*#batch"] = 1.0,
) -> Float[Array, "*batch"]:
    r"""The modern Hopfield energy $E(\xi)$ above (non-negative; 0 only at a stored pattern of
    maximal norm in the limit $\beta\to\infty$).

    **Arguments:**

    - `state`: `[..., d]`, the state pattern $\xi$.
    - `patterns`: `[..., m, d]`, the stored patterns $x_i$ as rows.
    - `beta`: inverse temperature $\beta > 0$, a number or an array broadcasting to `[...]`.

    **Returns:** `[...]`.
    """
    state, patterns = _check(state, patterns)
    beta_ = jnp.asarray(beta)
    lse = log_normalizer(state[..., None, :], patterns, beta=beta)[..., 0]
    m = patterns.shape[-2]
    max_norm_sq = jnp.max(jnp.sum(patterns * patterns, axis=-1), axis=-1)
    return (
        -lse / beta_
        + 0.5 * jnp.sum(state * state, axis=-1)
        + jnp.log(m) / beta_
        + 0.5 * max_norm_sq
    )


def hopfield_update(
    state: Float[ArrayLike, "*#batch d"],
    patterns: Float[ArrayLike, "*#batch m d"],
    *,
    beta: float | Float[ArrayLike, "*#batch"] = 1.0,
) -> Float[Array, "*batch d"]:
    r"""One Hopfield update $\xi \leftarrow X\,\mathrm{softmax}(\beta X^\top\xi)$, which never
    increases [`eqattn.hopfield_energy`][]. Arguments as there.

    **Returns:** `[..., d]`.
    """
    state, patterns = _check(state, patterns)
    return attention(state[..., None, :], patterns, beta=beta)[..., 0, :]
