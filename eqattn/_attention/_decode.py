r"""Cached generation's read: a few new queries against a key/value cache laid out positions
last, of which a prefix is in use. Its own small path, not the engine's: the engine's inputs
are `[..., m, d]`, and a mask there makes what it hides inert by a masked copy of the keys and
values, every call; a cache's unused positions hold zeros, and with positions last the products
of one query run along contiguous memory."""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Int


def attention_over_cache(
    queries: Float[ArrayLike, "*#batch n d"],
    keys: Float[ArrayLike, "*#batch d m"],
    values: Float[ArrayLike, "*#batch dv m"],
    length: Int[ArrayLike, ""],
    *,
    beta: float | Float[ArrayLike, "*#batch"] = 1.0,
    mask: Bool[ArrayLike, "*#mask"] | None = None,
) -> tuple[Float[Array, "*batch n dv"], Float[Array, "*batch n"]]:
    r"""Softmax attention and log-normalizer of `queries` over the first `length` positions of
    a cache (and what `mask` `[..., n, m]`, if given, allows of them):
    $s_{ij} = \beta\, q_i \cdot k_j$, $\mathrm{lse}_i = \log\sum_{j} e^{s_{ij}}$,
    $\mathrm{out}_i = \sum_j e^{s_{ij} - \mathrm{lse}_i} v_j$, as
    [`eqattn.attention_with_lse`][] with keys `[..., d, m]` and values `[..., dv, m]` (positions
    last). Computed in at least float32, shifted by the row maximum; a query that sees no
    position gets `lse = -inf` and `out = 0`. What the length and the mask hide is dropped from
    the softmax, not made inert: it must be finite (a cache keeps zeros past its length).
    Plain `jax.numpy`, differentiable by autodiff."""
    queries, keys, values = map(jnp.asarray, (queries, keys, values))
    wide = jnp.promote_types(queries.dtype, jnp.float32)
    beta = jnp.asarray(beta, wide)[..., None, None]
    s = beta * jnp.einsum("...nd,...dm->...nm", queries.astype(wide), keys.astype(wide))
    seen = jnp.arange(keys.shape[-1]) < length
    seen = seen if mask is None else jnp.logical_and(mask, seen)
    s = jnp.where(seen, s, -jnp.inf)
    top = jnp.max(s, axis=-1, keepdims=True)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    e = jnp.exp(s - top)  # 0 where hidden
    total = jnp.sum(e, axis=-1, keepdims=True)
    weights = e / jnp.where(total > 0, total, 1.0)
    out = jnp.einsum("...nm,...dm->...nd", weights, values.astype(wide))
    return out.astype(queries.dtype), (jnp.log(total) + top)[..., 0]
