r"""The cache of generation: per block, the keys and values of the tokens so far (for the
implicit model, those of their fixed points), and what every model's `prefill` and `extend` do
with it (see [`eqattn.nn.prefill`][])."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from ._multihead import KeyValues


class GenerationCache(eqx.Module):
    """What `extend` needs of the tokens so far: the keys and values per block
    (`[blocks, heads, max_len, d]`; the implicit model's stem's blocks, then its cell's), how
    many tokens they hold, and the last token's fixed point (the implicit model's warm start).

    **Example:**

    ```python
    import equinox as eqx, jax, jax.numpy as jnp, eqattn

    model = eqattn.nn.Transformer(
        7, 8, 2, 3, key=jax.random.key(0), vocab_size=7, max_len=10, pooling="none", causal=True
    )
    _, cache, _ = eqx.filter_jit(eqattn.nn.prefill)(model, jnp.array([1, 2, 3]))
    assert cache.keys.shape == (3, 2, 10, 4) and int(cache.length) == 3  # 3 blocks, 2 heads
    ```
    """

    keys: Float[Array, "blocks heads max_len dk"]
    values: Float[Array, "blocks heads max_len dv"]
    length: Int[Array, ""]
    state: Float[Array, " dim"]


class Step(eqx.Module):
    """One call's solver statistics (the implicit model; zeros and True for the explicit one):
    solver steps, the relative residual and whether the solve converged, per token.

    **Example:**

    ```python
    import equinox as eqx, jax, jax.numpy as jnp, eqattn

    model = eqattn.nn.DEQTransformer(
        7, 8, 2, key=jax.random.key(0), vocab_size=7, max_len=10, pooling="none", causal=True
    )
    _, _, step = eqx.filter_jit(eqattn.nn.prefill)(model, jnp.array([1, 2, 3]))
    assert bool(step.converged) and int(step.steps) >= 1
    ```
    """

    steps: Int[Array, ...]
    relative_residual: Float[Array, ...]
    converged: Bool[Array, ...]

    @classmethod
    def unsolved(cls, dtype) -> Step:
        """The statistics of a call that solves nothing (an explicit model's)."""
        return cls(jnp.array(0), jnp.array(0.0, dtype), jnp.array(True))


def run_cached(blocks, h, kvs: list[KeyValues], mask=None, keys=None, values=None):
    """Explicit `blocks` on `h` (against the cached `keys` and `values` of earlier tokens, if
    given), appending each block's keys and values of `h`'s tokens to `kvs`."""
    for i, block in enumerate(blocks):
        kvs.append(block.key_values(h))
        prefix = None if keys is None else KeyValues(keys[i], values[i])
        h = block(h, mask=mask, prefix=prefix, inference=True)
    return h


def new_cache(kvs: list[KeyValues], size: int, length, z) -> GenerationCache:
    """The cache of `length` tokens from their blocks' `kvs` (padded to `size` positions) and
    their states `z` (the last real one kept as the warm start)."""

    def padded(x):
        return jnp.pad(x, ((0, 0), (0, size - x.shape[1]), (0, 0)))

    return GenerationCache(
        jnp.stack([padded(kv.keys) for kv in kvs]),
        jnp.stack([padded(kv.values) for kv in kvs]),
        jnp.asarray(length, jnp.int32),
        z[jnp.maximum(length - 1, 0)],
    )


def seen(cache: GenerationCache) -> Bool[Array, "1 max_len_plus_1"]:
    """The mask of a new token over the cache's positions and itself."""
    size = cache.keys.shape[2]
    return jnp.concatenate([jnp.arange(size) < cache.length, jnp.ones(1, bool)])[None]


def write(cache: GenerationCache, kvs: list[KeyValues], state) -> GenerationCache:
    """The cache with one more token: its blocks' `kvs` at position `length`, and its state."""
    at = cache.length
    keys = jnp.stack([kv.keys for kv in kvs]).astype(cache.keys.dtype)
    values = jnp.stack([kv.values for kv in kvs]).astype(cache.values.dtype)
    return GenerationCache(
        jax.lax.dynamic_update_slice_in_dim(cache.keys, keys, at, 2),
        jax.lax.dynamic_update_slice_in_dim(cache.values, values, at, 2),
        cache.length + 1,
        state,
    )
