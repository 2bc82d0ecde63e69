r"""The DEQ transformer: an embedding, explicit stem blocks, one weight-tied implicit
[`eqattn.nn.DEQBlock`][] solved to its fixed point, and a read-out."""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray

from .._solve import Equilibrium
from ._cache import GenerationCache, Step, new_cache, run_cached, run_over_cache, write_rows
from ._deq_block import DEQBlock
from ._embedding import TokenEmbedding
from ._model import AbstractTransformer, Prediction
from ._multihead import BlockCache, KeyValues
from ._readout import Pooling, ReadOut, token_io
from ._transformer import TransformerBlock, run_blocks, stack

_STEM_OPTIONS = (
    "mlp_ratio",
    "norm_first",
    "norm",
    "dropout",
    "inference",
    "causal",
    "implementation",
)
"""The block's options its stem's blocks share."""


def _check_stem(stem_depth, block_kwargs) -> None:
    if isinstance(stem_depth, bool) or not isinstance(stem_depth, int) or stem_depth < 0:
        raise ValueError(f"`stem_depth` must be an int >= 0; got {stem_depth!r}.")
    if stem_depth and block_kwargs.get("sequence") is not None:
        raise ValueError("`stem_depth` > 0 does not combine with `sequence` (ring attention).")


def _check_start(z0, h):
    if z0 is not None and jnp.shape(z0) != h.shape:
        raise ValueError(
            f"`z0` must have the shape {h.shape} of the block's state (tokens, dim); got "
            f"{jnp.shape(z0)}."
        )


class DEQTransformer(AbstractTransformer):
    """Embedding -> position embedding -> one implicit [`eqattn.nn.DEQBlock`][] -> pooling -> head.

    **Arguments:**

    - `num_outputs`: classes (or outputs per token with `pooling="none"`).
    - `dim`, `num_heads`, `key`.
    - `vocab_size` for integer tokens `[n]`, or `in_features` for real-valued tokens
      `[n, in_features]` (e.g. image rows or patches); exactly one of the two.
    - `max_len`: the most tokens an input may have (learned position embeddings).
    - `pooling`: `"mean"` (masked mean over tokens), `"cls"` (a learned summary token) or
      `"none"` (one output per token, for token tasks).
    - `stem_depth`: explicit [`eqattn.nn.TransformerBlock`][]s between the embedding and the
      implicit block (default 0), configured as the block is (`mlp_ratio`, `norm_first`, `norm`,
      `dropout`, `causal`, `implementation`): $z^* = f(z^*, S(x))$ with $S$ the stem. In a
      language model the stem gives the fixed point inputs that already mix the tokens, which
      a weight-tied block otherwise composes only across iterations (the `text` benchmark).
    - Every other keyword goes to [`eqattn.nn.DEQBlock`][] (`solver`, `adjoint`, `dropout`, ...).

    `model(x, *, padding_mask=None, key=None, inference=None)` returns logits; `padding_mask [n]`
    is `True` for real tokens. `model.forward(x, ...)` also returns the block's `Equilibrium`.
    The modules: `embedding` ([`eqattn.nn.TokenEmbedding`][]), `block`, `readout`
    ([`eqattn.nn.ReadOut`][]), as [`eqattn.nn.Transformer`][] has them, and `stem`.

    **Example:**

    ```python
    import equinox as eqx, jax, eqattn

    model = eqattn.nn.DEQTransformer(10, 16, 2, key=jax.random.key(0), in_features=8, max_len=8)
    x = jax.random.normal(jax.random.key(1), (8, 8))  # 8 tokens of 8 features (a digit's rows)
    logits, eq = eqx.filter_jit(model.forward)(x)
    assert logits.shape == (10,) and eq.converged
    ```
    """

    embedding: TokenEmbedding
    stem: tuple[TransformerBlock, ...]
    block: DEQBlock
    readout: ReadOut

    def __init__(
        self,
        num_outputs: int,
        dim: int,
        num_heads: int,
        *,
        key: PRNGKeyArray,
        vocab_size: int | None = None,
        in_features: int | None = None,
        max_len: int = 512,
        pooling: Pooling = "mean",
        stem_depth: int = 0,
        dtype=None,
        **block_kwargs,
    ):
        keys = jax.random.split(key, 5)  # the embedding's three, the block's, the head's
        self.embedding, self.readout = token_io(
            dim,
            num_outputs,
            embedding_keys=keys[:3],
            readout_key=keys[4],
            vocab_size=vocab_size,
            in_features=in_features,
            max_len=max_len,
            pooling=pooling,
            dtype=dtype,
        )
        self.block = DEQBlock(dim, num_heads, key=keys[3], dtype=dtype, **block_kwargs)
        _check_stem(stem_depth, block_kwargs)
        options = {k: v for k, v in block_kwargs.items() if k in _STEM_OPTIONS}
        stem_keys = jax.random.split(jax.random.fold_in(key, 2), stem_depth) if stem_depth else ()
        self.stem = stack(stem_keys, dim, num_heads, dtype=dtype, **options)

    def inputs(self, h, mask=None, *, key=None, inference=None) -> Float[Array, "n dim"]:
        """The block's input: the embedded tokens `h` through the `stem` (themselves without
        one); `key` draws the stem's dropout masks (independent of the block's)."""
        if not self.stem:
            return h
        key = None if key is None else jax.random.fold_in(key, 1)
        return run_blocks(self.stem, h, mask, key=key, inference=inference)

    def apply_blocks(self, h, mask, *, key=None, inference=None, budget=None, z0=None):
        """The stem, then the block solved to equilibrium: `(z*, its Equilibrium)`."""
        _check_start(z0, h)
        h = self.inputs(h, mask, key=key, inference=inference)
        eq = self.block.equilibrium(
            h, mask=mask, key=key, inference=inference, z0=z0, budget=budget
        )
        return eq.value, eq

    @property
    def attention_blocks(self) -> tuple:
        return (*self.stem, self.block)

    @eqx.filter_jit
    def predict(self, x, *, budget=None, key=None, z0=None) -> Prediction:
        logits, eq = self.forward(x, key=key, inference=key is None, budget=budget, z0=z0)
        return Prediction(logits, eq.steps, eq.relative_residual, eq.converged, eq.value)

    def prefill(self, tokens, length=None, *, budget=None):
        """The stem's blocks, then all rows of the implicit block solved jointly."""
        h, _ = self.embedding(tokens)
        kvs: list[KeyValues] = []
        h = run_cached(self.stem, h, kvs)
        eq = self.block.equilibrium(h, inference=True, budget=budget)
        kvs += self.block.cache(h, eq.value)
        length = tokens.shape[0] if length is None else length
        cache = new_cache(kvs, self.embedding.max_len, length, eq.value)
        return self.readout(eq.value), cache, Step(eq.steps, eq.relative_residual, eq.converged)

    def extend(self, token, cache: GenerationCache, *, warm_start=True, budget=None):
        """The stem's blocks against their cache, then the new token's row of the implicit
        block solved against the cached fixed points."""
        s = len(self.stem)
        h, keys, values = run_over_cache(self.stem, self._next(token, cache), cache)
        # the cell's blocks read the stem's updated arrays (reading `cache`'s would copy them)
        prefix = tuple(BlockCache(k, v, cache.length) for k, v in zip(keys[s:], values[s:]))
        z0 = cache.state[None] if warm_start else None
        eq = self.block.equilibrium(h, prefix=prefix, z0=z0, inference=True, budget=budget)
        kvs = list(self.block.cache(h, eq.value, prefix=prefix))
        keys, values = write_rows(keys, values, kvs, cache.length, s)
        step = Step(eq.steps, eq.relative_residual, eq.converged)
        cache = GenerationCache(keys, values, cache.length + 1, eq.value[0])
        return self.readout(eq.value)[0], cache, step

    def forward(
        self,
        x: Int[Array, " n"] | Float[Array, "n f"],
        *,
        padding_mask: Bool[ArrayLike, " n"] | None = None,
        key: PRNGKeyArray | None = None,
        inference: bool | None = None,
        budget: int | Int[ArrayLike, ""] | None = None,
        z0: Float[Array, "tokens dim"] | None = None,
    ) -> tuple[Array, Equilibrium]:
        """Logits and the block's `Equilibrium`. `z0` warm-starts the solve (e.g. this example's
        previous fixed point, `eq.value`); `budget` caps it for this call."""
        h, padding_mask = self.embedding(x, padding_mask)
        mask = None if padding_mask is None else padding_mask[None, :]
        z, eq = self.apply_blocks(h, mask, key=key, inference=inference, budget=budget, z0=z0)
        return self.readout(z, padding_mask), eq

    @eqx.filter_jit
    def __call__(self, x, *, padding_mask=None, key=None, inference=None, budget=None, z0=None):
        """The logits alone: `forward(...)[0]`, with the same arguments."""
        return self.forward(
            x, padding_mask=padding_mask, key=key, inference=inference, budget=budget, z0=z0
        )[0]

    def trajectory(
        self,
        x: Int[Array, " n"] | Float[Array, "n f"],
        segments: Sequence[int],
        *,
        padding_mask: Bool[ArrayLike, " n"] | None = None,
        key: PRNGKeyArray | None = None,
        inference: bool | None = None,
        z0: Float[Array, "tokens dim"] | None = None,
        phantom_steps: int = 1,
        damping: float = 1.0,
    ) -> tuple[list[Array], list[Equilibrium]]:
        """The logits at the end of each piece of the block's
        [`trajectory`][eqattn.nn.DEQBlock.trajectory] (fixed-point correction), and the pieces'
        `Equilibrium`s; the last piece's logits are those of a solve capped at
        `sum(segments)` steps."""
        h, padding_mask = self.embedding(x, padding_mask)
        attn_mask = None if padding_mask is None else padding_mask[None, :]
        _check_start(z0, h)
        pieces = self.block.trajectory(
            self.inputs(h, attn_mask, key=key, inference=inference),
            segments,
            mask=attn_mask,
            key=key,
            inference=inference,
            z0=z0,
            phantom_steps=phantom_steps,
            damping=damping,
        )
        return [self.readout(eq.value, padding_mask) for eq in pieces], pieces

    def jacobian_penalty(
        self,
        x: Int[Array, " n"] | Float[Array, "n f"],
        z: Float[Array, "tokens dim"],
        *,
        probe_key: PRNGKeyArray,
        padding_mask: Bool[ArrayLike, " n"] | None = None,
        key: PRNGKeyArray | None = None,
        inference: bool | None = None,
        samples: int = 1,
    ) -> Float[Array, ""]:
        """The block's [`jacobian_penalty`][eqattn.nn.DEQBlock.jacobian_penalty] at `z` (e.g.
        `forward`'s `eq.value`) for the input `x`, with the same `padding_mask`, `key` and
        `inference` as the `forward` call that found `z`."""
        h, padding_mask = self.embedding(x, padding_mask)
        attn_mask = None if padding_mask is None else padding_mask[None, :]
        return self.block.jacobian_penalty(
            self.inputs(h, attn_mask, key=key, inference=inference),
            z,
            probe_key=probe_key,
            mask=attn_mask,
            key=key,
            inference=inference,
            samples=samples,
        )
