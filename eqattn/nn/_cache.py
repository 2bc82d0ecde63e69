r"""The cache of generation: per block, the keys and values of the tokens so far (for the
implicit model, those of their fixed points), and what every model's `prefill` and `extend` do
with it (see [`eqattn.nn.prefill`][])."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from ._multihead import BlockCache, KeyValues


class GenerationCache(eqx.Module):
    """What `extend` needs of the tokens so far: the keys `[blocks, heads, dk, max_len]` and
    values `[blocks, heads, dv, max_len]` of every block (the implicit model's stem's blocks,
    then its cell's), positions last (one [`eqattn.nn.BlockCache`][] per block); how many tokens
    they hold (`length`; the positions after them hold zeros); and the last token's fixed point
    (the implicit model's warm start).

    **Example:**

    ```python
    import equinox as eqx, jax, jax.numpy as jnp, eqattn

    model = eqattn.nn.Transformer(
        7, 8, 2, 3, key=jax.random.key(0), vocab_size=7, max_len=10, pooling="none", causal=True
    )
    _, cache, _ = eqx.filter_jit(eqattn.nn.prefill)(model, jnp.array([1, 2, 3]))
    assert cache.keys.shape == (3, 2, 4, 10)  # 3 blocks, 2 heads, 4 features, 10 positions
    assert int(cache.length) == 3 and not cache.keys[..., 3:].any()
    ```
    """

    keys: Float[Array, "blocks heads dk max_len"]
    values: Float[Array, "blocks heads dv max_len"]
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


def run_cached(blocks, h, kvs: list[KeyValues]):
    """Explicit `blocks` on `h`, appending each block's keys and values of `h`'s tokens to
    `kvs`."""
    for block in blocks:
        kvs.append(block.key_values(h))
        h = block(h, inference=True)
    return h


def run_over_cache(blocks, h: Float[Array, "1 dim"], cache: GenerationCache):
    """Explicit `blocks` (the cache's first ones) on the new token `h` at position
    `cache.length`: each block's keys and values of its input are written into the cache, then
    its attention reads the cache up to and including them. Returns `(h, keys, values)`.

    Written before it is read, the cache is updated in place: written after the last block's
    read, which the write does not depend on, it was copied whole every token."""
    keys, values, at = cache.keys, cache.values, cache.length
    for i, block in enumerate(blocks):
        keys, values = write_rows(keys, values, [block.key_values(h)], at, i)
        h = block.over_cache(h, BlockCache(keys[i], values[i], at + 1))
    return h, keys, values


def new_cache(kvs: list[KeyValues], size: int, length, z) -> GenerationCache:
    """The cache of `length` tokens from their blocks' `kvs` (positions last, zeros after
    the first `length`, `size` in all) and their states `z` (the last real one kept as the warm
    start)."""
    in_use = jnp.arange(kvs[0].positions) < length

    def slot(x):  # [heads, m, d] -> [heads, d, size]
        x = jnp.where(in_use[:, None], x, 0)
        return jnp.pad(jnp.swapaxes(x, 1, 2), ((0, 0), (0, 0), (0, size - x.shape[1])))

    return GenerationCache(
        jnp.stack([slot(kv.keys) for kv in kvs]),
        jnp.stack([slot(kv.values) for kv in kvs]),
        jnp.asarray(length, jnp.int32),
        z[jnp.maximum(length - 1, 0)],
    )


def write_rows(keys, values, kvs: list[KeyValues], at, first: int = 0):
    """The cache's `keys` and `values` with one token's rows, `kvs` (one `KeyValues`
    `[heads, 1, d]` per block from block `first` on), at position `at`."""

    def put(slots, new):
        new = jnp.stack([jnp.swapaxes(x, 1, 2) for x in new]).astype(slots.dtype)
        start = (jnp.int32(first), jnp.int32(0), jnp.int32(0), jnp.asarray(at, jnp.int32))
        return jax.lax.dynamic_update_slice(slots, new, start)

    return put(keys, [kv.keys for kv in kvs]), put(values, [kv.values for kv in kvs])
