"""The read-out behind the transformer models' blocks (explicit and implicit), and the two ends
every such model is built with (`token_io`)."""

from __future__ import annotations

from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, PRNGKeyArray

from ._embedding import TokenEmbedding
from ._tokens import per_token

Pooling = Literal["mean", "cls", "none"]


class ReadOut(eqx.Module):
    """Final layer norm, pooling (`"mean"`: masked mean over tokens; `"cls"`: the summary token;
    `"none"`: every token) and a linear head. `readout(z, padding_mask)` returns
    `[num_outputs]` (or `[tokens, num_outputs]` with `"none"`).

    **Example:**

    ```python
    import jax, eqattn

    readout = eqattn.nn.ReadOut(16, 10, key=jax.random.key(0), pooling="mean")
    z = jax.random.normal(jax.random.key(1), (7, 16))
    assert readout(z).shape == (10,)
    ```
    """

    final_norm: eqx.nn.LayerNorm
    head: eqx.nn.Linear
    pooling: str = eqx.field(static=True)

    def __init__(
        self, dim: int, num_outputs: int, *, key: PRNGKeyArray, pooling="mean", dtype=None
    ):
        if pooling not in ("mean", "cls", "none"):
            raise ValueError(f"`pooling` must be 'mean', 'cls' or 'none'; got {pooling!r}.")
        self.final_norm = eqx.nn.LayerNorm(dim, dtype=dtype)
        self.head = eqx.nn.Linear(dim, num_outputs, key=key, dtype=dtype)
        self.pooling = pooling

    def __call__(
        self, z: Float[Array, "tokens dim"], padding_mask: Bool[ArrayLike, " tokens"] | None = None
    ) -> Array:
        z = jax.vmap(self.final_norm)(z)
        if self.pooling == "cls":
            z = z[0]
        elif self.pooling == "mean":
            w = jnp.ones(z.shape[0]) if padding_mask is None else jnp.asarray(padding_mask, z.dtype)
            z = (w @ z) / jnp.maximum(jnp.sum(w), 1)
        else:
            return per_token(self.head, z)
        return self.head(z)


def token_io(
    dim: int,
    num_outputs: int,
    *,
    embedding_keys,
    readout_key: PRNGKeyArray,
    vocab_size: int | None,
    in_features: int | None,
    max_len: int,
    pooling: Pooling,
    dtype,
) -> tuple[TokenEmbedding, ReadOut]:
    """The two ends every model here holds: its `TokenEmbedding` (with a summary token for
    `pooling="cls"`) and its `ReadOut`."""
    embedding = TokenEmbedding(
        dim,
        key=embedding_keys,
        vocab_size=vocab_size,
        in_features=in_features,
        max_len=max_len,
        cls_token=pooling == "cls",
        dtype=dtype,
    )
    return embedding, ReadOut(dim, num_outputs, key=readout_key, pooling=pooling, dtype=dtype)
