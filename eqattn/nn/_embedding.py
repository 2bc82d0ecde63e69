"""The token embedding in front of the transformer models' blocks (explicit and implicit): an
Equinox module the models hold as a field."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Int, Key, PRNGKeyArray, UInt32

from ._tokens import per_token


class TokenEmbedding(eqx.Module):
    """Tokens to vectors: an embedding table (integer tokens `[n]`) or a linear map (real-valued
    tokens `[n, in_features]`), a learned summary token in front when `cls_token=True` (the
    models set it for `pooling="cls"`), and learned position embeddings. `embedding(x, padding_mask)` returns `(h [tokens, dim],
    padding_mask)`, the mask extended over the summary token. `key` is one PRNG key, or three
    (an array of shape `[3]`: for the table, the positions and the summary token).

    **Example:**

    ```python
    import jax, eqattn

    embed = eqattn.nn.TokenEmbedding(16, key=jax.random.key(0), vocab_size=50, max_len=8)
    h, padding = embed(jax.numpy.array([3, 1, 4]))  # token + learned position embeddings
    assert h.shape == (3, 16) and padding is None
    ```
    """

    embed: eqx.nn.Embedding | eqx.nn.Linear
    positions: Float[Array, "max_len dim"]
    cls_token: Float[Array, " dim"] | None
    max_len: int = eqx.field(static=True)

    def __init__(
        self,
        dim: int,
        *,
        key: PRNGKeyArray | Key[Array, " 3"] | UInt32[Array, "3 2"],
        vocab_size: int | None = None,
        in_features: int | None = None,
        max_len: int = 512,
        cls_token: bool = False,
        dtype=None,
    ):
        if (vocab_size is None) == (in_features is None):
            raise ValueError("give exactly one of `vocab_size` (integer tokens) and `in_features`.")
        typed = jax.dtypes.issubdtype(jnp.asarray(key).dtype, jax.dtypes.prng_key)
        keys = jnp.shape(key) if typed else jnp.shape(key)[:-1]  # raw keys end in 2 words
        ke, kp, kc = key if keys == (3,) else jax.random.split(key, 3)
        if in_features is None:
            self.embed = eqx.nn.Embedding(vocab_size, dim, key=ke, dtype=dtype)
        else:
            self.embed = eqx.nn.Linear(in_features, dim, key=ke, dtype=dtype)
        float_dtype = dtype or jnp.result_type(float)
        self.positions = 0.02 * jax.random.normal(kp, (max_len + 1, dim), float_dtype)
        self.cls_token = 0.02 * jax.random.normal(kc, (dim,), float_dtype) if cls_token else None
        self.max_len = max_len

    def __call__(
        self,
        x: Int[Array, " n"] | Float[Array, "n f"],
        padding_mask: Bool[ArrayLike, " n"] | None = None,
        *,
        offset: int | Int[Array, ""] = 0,
    ) -> tuple[Float[Array, "tokens dim"], Bool[Array, " tokens"] | None]:
        """`offset`: the position of `x`'s first token (tokens after `offset` earlier ones, as
        in generation with a cache); a traced offset is clipped to the table."""
        if isinstance(self.embed, eqx.nn.Embedding):
            if jnp.ndim(x) != 1 or not jnp.issubdtype(jnp.result_type(x), jnp.integer):
                raise ValueError(
                    f"`x` must be integer tokens of shape [n]; got "
                    f"{jnp.result_type(x)}{list(jnp.shape(x))}."
                )
        elif jnp.ndim(x) != 2 or x.shape[-1] != self.embed.in_features:
            raise ValueError(
                f"`x` must have shape [n, {self.embed.in_features}]; got shape {jnp.shape(x)}."
            )
        static_offset = isinstance(offset, int)
        if x.shape[0] + (offset if static_offset else 0) > self.max_len:
            raise ValueError(
                f"`x` has {x.shape[0]} tokens"
                + (f" after {offset} earlier ones" if static_offset and offset else "")
                + f"; this model takes at most {self.max_len}."
            )
        if isinstance(self.embed, eqx.nn.Embedding):
            h = jax.vmap(self.embed)(x)
        else:
            h = per_token(self.embed, x)
        n = h.shape[0]
        if padding_mask is not None:
            padding_mask = jnp.asarray(padding_mask)
            if padding_mask.shape != (n,) or padding_mask.dtype != jnp.bool_:
                raise ValueError(
                    f"`padding_mask` must be boolean of shape [{n}]; got "
                    f"{padding_mask.dtype}{list(padding_mask.shape)}."
                )
        if self.cls_token is not None:
            h = jnp.concatenate([self.cls_token[None], h])
            if padding_mask is not None:
                padding_mask = jnp.concatenate([jnp.ones(1, bool), padding_mask])
        if static_offset and offset == 0:
            return h + self.positions[: h.shape[0]], padding_mask
        if self.cls_token is not None:
            raise ValueError("`offset` is for models without a summary token (pooling='cls').")
        positions = jax.lax.dynamic_slice_in_dim(self.positions, offset, h.shape[0])
        return h + positions, padding_mask
