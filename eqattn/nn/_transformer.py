r"""An explicit transformer: the baseline for the implicit models.

`depth` untied blocks $z_{l+1} = B_l(z_l)$, each the map of [`eqattn.nn.DEQBlock`][] without the
input injection (post-norm: $u = \mathrm{RN}(z + \mathrm{MHA}(z))$,
$z' = \mathrm{RN}(u + \mathrm{MLP}(u))$), between the same embedding and read-out as
[`eqattn.nn.DEQTransformer`][].
"""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Int, Key, PRNGKeyArray, UInt32

from .._attention import Implementation
from ._block import AbstractBlock
from ._cache import GenerationCache, Step, new_cache, run_cached, run_over_cache
from ._checks import check_dims, check_dropout
from ._embedding import TokenEmbedding
from ._model import AbstractTransformer, Prediction
from ._multihead import KeyValues, MultiHeadAttention
from ._norm import Norm, check_norm
from ._readout import Pooling, ReadOut, token_io


class TransformerBlock(AbstractBlock):
    """One explicit block: attention and MLP sublayers with residuals and RN; `dropout`,
    `inference`, `causal` and `implementation` as in [`eqattn.nn.DEQBlock`][].

    **Example:**

    ```python
    import jax, eqattn

    block = eqattn.nn.TransformerBlock(16, 2, key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (10, 16))
    assert block(x).shape == (10, 16)
    ```
    """

    attention: MultiHeadAttention
    mlp_in: eqx.nn.Linear
    mlp_out: eqx.nn.Linear
    norm_first: bool = eqx.field(static=True)
    norm: str = eqx.field(static=True)
    dropout: float = eqx.field(static=True)
    inference: bool

    def __init__(
        self,
        dim,
        num_heads,
        *,
        key,
        mlp_ratio=2.0,
        norm_first=False,
        norm="layer",
        dropout=0.0,
        inference=False,
        causal=False,
        implementation: Implementation = "auto",
        dtype=None,
    ):
        check_dims(dim, num_heads)
        check_norm(norm, causal)
        check_dropout(dropout)
        hidden = max(1, int(round(mlp_ratio * dim)))
        ka, k1, k2 = jax.random.split(key, 3)
        self.attention = MultiHeadAttention(
            num_heads, dim, key=ka, causal=causal, implementation=implementation, dtype=dtype
        )
        self.mlp_in = eqx.nn.Linear(dim, hidden, key=k1, dtype=dtype)
        self.mlp_out = eqx.nn.Linear(hidden, dim, key=k2, dtype=dtype)
        self.norm_first = norm_first
        self.norm = norm
        self.dropout = dropout
        self.inference = inference

    def __call__(
        self,
        z: Float[Array, "n dim"],
        *,
        mask=None,
        key: PRNGKeyArray | None = None,
        inference: bool | None = None,
        prefix=None,
    ) -> Float[Array, "n dim"]:
        """The block on `z`; `prefix`, the `key_values` of earlier tokens' inputs to this
        block, is attended to in front of `z` (a key/value cache for generation)."""
        drop = self.dropout_masks(key, inference, z.shape[0], z.dtype)
        return self.sublayers(z, mask=mask, drop=drop, prefix=prefix)


def stack(
    keys: Key[Array, " blocks"] | UInt32[Array, "blocks 2"] | tuple[()],
    dim: int,
    num_heads: int,
    **kwargs,
) -> tuple[TransformerBlock, ...]:
    """One `TransformerBlock(dim, num_heads, key=k, **kwargs)` per key of `keys`."""
    return tuple(TransformerBlock(dim, num_heads, key=k, **kwargs) for k in keys)


def run_blocks(blocks: Sequence[TransformerBlock], h, mask, *, key=None, inference=None):
    """`blocks` one after the other on `h` (`key` split among them for dropout)."""
    keys = [None] * len(blocks) if key is None else jax.random.split(key, len(blocks))
    for block, k in zip(blocks, keys):
        h = block(h, mask=mask, key=k, inference=inference)
    return h


class Transformer(AbstractTransformer):
    """Embedding -> position embedding -> `depth` explicit blocks -> pooling -> head.

    Arguments as [`eqattn.nn.DEQTransformer`][], plus `depth`; `mlp_ratio`, `norm_first`, `norm`,
    `dropout` and `causal` configure the blocks. `model(x, *, padding_mask=None, key=None,
    inference=None)` returns logits (`key` draws the dropout masks when training;
    `eqx.nn.inference_mode(model)` turns dropout off).

    **Example:**

    ```python
    import jax, eqattn

    model = eqattn.nn.Transformer(10, 16, 2, 3, key=jax.random.key(0), vocab_size=100, max_len=32)
    tokens = jax.numpy.arange(12) % 100
    assert model(tokens).shape == (10,)  # class logits of one sequence
    ```
    """

    embedding: TokenEmbedding
    blocks: tuple[TransformerBlock, ...]
    readout: ReadOut

    def __init__(
        self,
        num_outputs: int,
        dim: int,
        num_heads: int,
        depth: int,
        *,
        key: PRNGKeyArray,
        vocab_size: int | None = None,
        in_features: int | None = None,
        max_len: int = 512,
        pooling: Pooling = "mean",
        mlp_ratio: float = 2.0,
        norm_first: bool = False,
        norm: Norm = "layer",
        dropout: float = 0.0,
        inference: bool = False,
        causal: bool = False,
        dtype=None,
    ):
        if depth < 1:
            raise ValueError(f"`depth` must be >= 1; got {depth}.")
        keys = jax.random.split(key, depth + 4)  # the embedding's three, the head's, the blocks'
        self.embedding, self.readout = token_io(
            dim,
            num_outputs,
            embedding_keys=keys[:3],
            readout_key=keys[3],
            vocab_size=vocab_size,
            in_features=in_features,
            max_len=max_len,
            pooling=pooling,
            dtype=dtype,
        )
        self.blocks = stack(
            keys[4:],
            dim,
            num_heads,
            mlp_ratio=mlp_ratio,
            norm_first=norm_first,
            norm=norm,
            dropout=dropout,
            inference=inference,
            causal=causal,
            dtype=dtype,
        )

    def apply_blocks(self, h, mask, *, key=None, inference=None):
        """The blocks one after the other (no statistics)."""
        return run_blocks(self.blocks, h, mask, key=key, inference=inference), None

    @property
    def attention_blocks(self) -> tuple[TransformerBlock, ...]:
        return self.blocks

    @eqx.filter_jit
    def predict(self, x, *, budget=None, key=None, z0=None) -> Prediction:
        logits = self(x, key=key, inference=key is None)
        return Prediction(logits, jnp.array(0), jnp.array(0.0), jnp.array(True), None)

    def prefill(self, tokens, length=None, *, budget=None):
        h, _ = self.embedding(tokens)
        kvs: list[KeyValues] = []
        z = run_cached(self.blocks, h, kvs)
        length = tokens.shape[0] if length is None else length
        cache = new_cache(kvs, self.embedding.max_len, length, z)
        return self.readout(z), cache, Step.unsolved(z.dtype)

    def extend(self, token, cache: GenerationCache, *, warm_start=True, budget=None):
        z, keys, values = run_over_cache(self.blocks, self._next(token, cache), cache)
        cache = GenerationCache(keys, values, cache.length + 1, z[0])
        return self.readout(z)[0], cache, Step.unsolved(z.dtype)

    @eqx.filter_jit
    def __call__(
        self,
        x: Int[Array, " n"] | Float[Array, "n f"],
        *,
        padding_mask: Bool[ArrayLike, " n"] | None = None,
        key: PRNGKeyArray | None = None,
        inference: bool | None = None,
    ) -> Array:
        h, padding_mask = self.embedding(x, padding_mask)
        mask = None if padding_mask is None else padding_mask[None, :]
        z, _ = self.apply_blocks(h, mask, key=key, inference=inference)
        return self.readout(z, padding_mask)
