r"""Generation with a cache, for causal token models ([`eqattn.nn.DEQTransformer`][] and
[`eqattn.nn.Transformer`][] with `pooling="none"` and `causal=True`).

The explicit model caches, per block, the keys and values of the earlier tokens' inputs to that
block: the usual key/value cache. The implicit model caches the keys and values of the earlier
tokens' **fixed points** (an equilibrium cache; for a cell of several blocks, those of each
block's input when the map is applied at the fixed points), after those of its stem's explicit
blocks, if any, as the explicit model has them. Under a causal mask token $t$'s
fixed point $z_t^* = f_t(z_{\le t}^*)$ depends on the tokens up to $t$ alone, so a new token's
row is solved by itself against the cache: each solver step costs $O(t)$ instead of
re-solving all $t$ rows. The joint solve stops on a test over all its rows, so the two agree to the solver's tolerance,
not bit for bit.

`prefill` and `extend` act on one sequence (`jax.vmap` them for a batch); the cache has room for
the model's `max_len` tokens.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from ._deq import DEQTransformer
from ._multihead import KeyValues
from ._transformer import Transformer


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


def check_language_model(model) -> None:
    """Raise unless `model` is a causal token model with one output per token."""
    if not isinstance(model, DEQTransformer | Transformer):
        raise TypeError(
            f"generation needs an eqattn.nn.DEQTransformer or Transformer; got {type(model)}."
        )
    blocks = [*model.stem, model.block] if isinstance(model, DEQTransformer) else model.blocks
    if not all(b.attention.causal for b in blocks) or model.readout.pooling != "none":
        raise ValueError(
            "generation needs a causal language model: blocks with causal=True and "
            "pooling='none' (one output per token)."
        )
    if not isinstance(model.embedding.embed, eqx.nn.Embedding):
        raise ValueError("generation needs integer tokens (a model built with `vocab_size`).")


def _explicit(blocks, h, kvs: list[KeyValues], mask=None, keys=None, values=None):
    """`blocks` on `h` (against the cached `keys` and `values` of earlier tokens, if given),
    appending each block's keys and values of `h`'s tokens to `kvs`."""
    for i, block in enumerate(blocks):
        kvs.append(block.key_values(h))
        prefix = None if keys is None else KeyValues(keys[i], values[i])
        h = block(h, mask=mask, prefix=prefix, inference=True)
    return h


def _padded(kv: KeyValues, size: int) -> KeyValues:
    pad = size - kv.keys.shape[1]
    return KeyValues(*(jnp.pad(x, ((0, 0), (0, pad), (0, 0))) for x in kv))


def prefill(
    model: DEQTransformer | Transformer,
    tokens: Int[Array, " n"],
    length: int | Int[Array, ""] | None = None,
    *,
    max_steps: int | None = None,
) -> tuple[Float[Array, "n vocab"], GenerationCache, Step]:
    """The logits of every position of `tokens` and the cache of the first `length` of them
    (default all; tokens after `length` are padding, which a causal model's earlier positions
    do not see). The implicit model solves all rows jointly (at most `max_steps`).

    **Example:**

    ```python
    import equinox as eqx, jax, jax.numpy as jnp, eqattn

    model = eqattn.nn.Transformer(
        11, 16, 2, 2, key=jax.random.key(0), vocab_size=11, max_len=12, pooling="none",
        causal=True,
    )
    tokens = jnp.array([3, 1, 4, 1, 5])
    prefill, extend = eqx.filter_jit(eqattn.nn.prefill), eqx.filter_jit(eqattn.nn.extend)
    logits, cache, _ = prefill(model, tokens[:4])
    next_logits, cache, _ = extend(model, tokens[4], cache)
    assert jnp.allclose(next_logits, model(tokens)[4], atol=1e-5)  # the cache gives the same
    ```
    """
    check_language_model(model)
    n = tokens.shape[0]
    size = model.embedding.max_len
    length = n if length is None else length
    h, _ = model.embedding(tokens)
    kvs = []
    if isinstance(model, DEQTransformer):
        h = _explicit(model.stem, h, kvs)
        eq = model.block.equilibrium(h, inference=True, max_steps=max_steps)
        z = eq.value
        kvs += model.block.cache(h, z)
        stats = Step(eq.steps, eq.relative_residual, eq.converged)
    else:
        z = _explicit(model.blocks, h, kvs)
        stats = Step(jnp.array(0), jnp.array(0.0, z.dtype), jnp.array(True))
    kvs = [_padded(kv, size) for kv in kvs]
    state = z[jnp.maximum(length - 1, 0)]
    cache = GenerationCache(
        jnp.stack([kv.keys for kv in kvs]),
        jnp.stack([kv.values for kv in kvs]),
        jnp.asarray(length, jnp.int32),
        state,
    )
    return model.readout(z), cache, stats


def _write(cache: GenerationCache, kvs: list[KeyValues], state) -> GenerationCache:
    at = cache.length
    keys = jnp.stack([kv.keys for kv in kvs])
    values = jnp.stack([kv.values for kv in kvs])
    return GenerationCache(
        jax.lax.dynamic_update_slice_in_dim(cache.keys, keys.astype(cache.keys.dtype), at, 2),
        jax.lax.dynamic_update_slice_in_dim(cache.values, values.astype(cache.values.dtype), at, 2),
        cache.length + 1,
        state,
    )


def extend(
    model: DEQTransformer | Transformer,
    token: Int[Array, ""],
    cache: GenerationCache,
    *,
    warm_start: bool = True,
    max_steps: int | None = None,
) -> tuple[Float[Array, " vocab"], GenerationCache, Step]:
    """The logits after one more token, at position `cache.length`, and the cache with it.
    The implicit model solves only the new token's row against the cache, from the previous
    token's fixed point (`warm_start`) or from zero. The cache must have room (`cache.length <
    max_len`); the caller slides its window before (see `eqattn.text.generate`).

    **Example:**

    ```python
    import equinox as eqx, jax, jax.numpy as jnp, eqattn

    model = eqattn.nn.DEQTransformer(
        7, 8, 2, key=jax.random.key(0), vocab_size=7, max_len=10, pooling="none", causal=True,
        solver=eqattn.Anderson(rtol=1e-6, max_steps=100),
    )
    tokens = jnp.array([1, 2, 3, 4])
    _, cache, _ = eqx.filter_jit(eqattn.nn.prefill)(model, tokens[:3])
    extend = eqx.filter_jit(eqattn.nn.extend)
    logits, cache, _ = extend(model, tokens[3], cache)  # one row solved, not four
    assert jnp.allclose(logits, eqx.filter_jit(model)(tokens)[3], atol=1e-4)
    ```
    """
    check_language_model(model)
    size = cache.keys.shape[2]
    h, _ = model.embedding(jnp.reshape(token, (1,)), offset=cache.length)
    seen = jnp.concatenate([jnp.arange(size) < cache.length, jnp.ones(1, bool)])[None]
    kvs = []
    if isinstance(model, DEQTransformer):
        s = len(model.stem)
        h = _explicit(model.stem, h, kvs, seen, cache.keys[:s], cache.values[:s])
        prefix = tuple(KeyValues(k, v) for k, v in zip(cache.keys[s:], cache.values[s:]))
        z0 = cache.state[None] if warm_start else None
        eq = model.block.equilibrium(
            h, mask=seen, prefix=prefix, z0=z0, inference=True, max_steps=max_steps
        )
        z = eq.value
        kvs += model.block.cache(h, z, mask=seen, prefix=prefix)
        stats = Step(eq.steps, eq.relative_residual, eq.converged)
    else:
        z = _explicit(model.blocks, h, kvs, seen, cache.keys, cache.values)
        stats = Step(jnp.array(0), jnp.array(0.0, z.dtype), jnp.array(True))
    return model.readout(z)[0], _write(cache, kvs, z[0]), stats
