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

from jaxtyping import Array, ArrayLike, Float, Int

from ._cache import GenerationCache, Step
from ._model import AbstractTransformer


def check_language_model(model) -> None:
    """Raise unless `model` is a causal token model with one output per token."""
    if not isinstance(model, AbstractTransformer):
        raise TypeError(
            f"generation needs an eqattn.nn.DEQTransformer or Transformer; got {type(model)}."
        )
    model.check_language_model()


def prefill(
    model: AbstractTransformer,
    tokens: Int[Array, " n"],
    length: int | Int[Array, ""] | None = None,
    *,
    budget: int | Int[ArrayLike, ""] | None = None,
) -> tuple[Float[Array, "n vocab"], GenerationCache, Step]:
    """The logits of every position of `tokens` and the cache of the first `length` of them
    (default all; tokens after `length` are padding, which a causal model's earlier positions
    do not see). The implicit model solves all rows jointly (at most `budget`).

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
    return model.prefill(tokens, length, budget=budget)


def extend(
    model: AbstractTransformer,
    token: Int[Array, ""],
    cache: GenerationCache,
    *,
    warm_start: bool = True,
    budget: int | Int[ArrayLike, ""] | None = None,
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
    return model.extend(token, cache, warm_start=warm_start, budget=budget)
