"""What the explicit and the implicit transformer blocks share: attention and MLP sublayers
with residuals and renormalization, and their dropout."""

from __future__ import annotations

import equinox as eqx
import jax
from jaxtyping import Array, ArrayLike, Bool, Float, PRNGKeyArray

from ._multihead import BlockCache, KeyValues, MultiHeadAttention
from ._norm import apply_norm
from ._tokens import per_token


def _dropout_mask(key, rate, shape, dtype):
    keep = jax.random.bernoulli(key, 1 - rate, shape)
    return keep.astype(dtype) / (1 - rate)


DropoutMasks = tuple[Float[Array, "n dim"], Float[Array, "n hidden"]]


class AbstractBlock(eqx.Module):
    r"""Attention and MLP sublayers with residuals and RN. Post-norm (default):
    $u = \mathrm{RN}(z + \mathrm{MHA}(z) + c)$, $z' = \mathrm{RN}(u + \mathrm{MLP}(u))$;
    pre-norm (`norm_first`): $u = z + \mathrm{MHA}(\mathrm{RN}(z)) + c$,
    $z' = \mathrm{RN}(u + \mathrm{MLP}(\mathrm{RN}(u)))$, with $c$ an input injection (the
    implicit block's) or none (the explicit block's); an implicit block that attends to its
    input reads $\mathrm{MHA}(z + c)$ (pre-norm: $\mathrm{MHA}(\mathrm{RN}(z) + c)$). Dropout
    (inverted) on the attention output and the MLP's hidden layer."""

    attention: eqx.AbstractVar[MultiHeadAttention]
    mlp_in: eqx.AbstractVar[eqx.nn.Linear]
    mlp_out: eqx.AbstractVar[eqx.nn.Linear]
    inference: eqx.AbstractVar[bool]
    norm: eqx.AbstractVar[str]
    norm_first: eqx.AbstractVar[bool]
    dropout: eqx.AbstractVar[float]

    def sublayers(
        self,
        z: Float[Array, "n dim"],
        injection: Float[Array, "n dim"] | None = None,
        mask: Bool[ArrayLike, "#queries #keys"] | None = None,
        drop: DropoutMasks | None = None,
        prefix: KeyValues | BlockCache | None = None,
        *,
        attend: Float[Array, "n dim"] | None = None,
    ) -> Float[Array, "n dim"]:
        """One application of the block's map (see the class docstring); `prefix`, the
        `key_values` (the block's method) of earlier tokens' states, is
        attended to in front of `z`'s own tokens; `attend`, added to the attention's input
        (the implicit block's injection when it attends to its input)."""
        a_in = self._attention_input(z, attend)
        a = self.attention(a_in, a_in, mask=mask, prefix=prefix)
        return self._after_attention(z, a, injection, drop)

    def over_cache(self, z: Float[Array, "n dim"], cache: BlockCache) -> Float[Array, "n dim"]:
        """The block's map (no injection, no dropout) on new tokens `z` whose keys and values
        (`key_values(z)`) `cache` already holds: its attention reads `cache` alone."""
        a_in = self._attention_input(z)
        return self._after_attention(z, self.attention.over_cache(a_in, cache))

    def _after_attention(self, z, a, injection=None, drop=None):
        """The residual, the MLP and the renormalizations after the attention's output `a`."""
        rn = lambda u: apply_norm(self.norm, u)  # noqa: E731
        drop_attn, drop_mlp = (None, None) if drop is None else drop
        a = a if drop_attn is None else a * drop_attn
        u = z + a if injection is None else z + a + injection
        u = u if self.norm_first else rn(u)
        h = jax.nn.gelu(per_token(self.mlp_in, rn(u) if self.norm_first else u))
        h = h if drop_mlp is None else h * drop_mlp
        return rn(u + per_token(self.mlp_out, h))

    def _attention_input(self, z, attend=None):
        a_in = apply_norm(self.norm, z) if self.norm_first else z
        return a_in if attend is None else a_in + attend

    def key_values(
        self, z: Float[Array, "p dim"], attend: Float[Array, "p dim"] | None = None
    ) -> KeyValues:
        """The attention's keys and values of the states `z` of `p` tokens (and `attend`, as
        in `sublayers`): the cache that lets later tokens attend to them without recomputing
        them (`prefix` of `sublayers`)."""
        return self.attention.key_values(self._attention_input(z, attend))

    def dropout_masks(
        self, key: PRNGKeyArray | None, inference: bool | None, n: int, dtype
    ) -> DropoutMasks | None:
        """The dropout masks for `sublayers` on `n` tokens, or None: none when the rate is 0 or
        in inference mode (`inference`, or the `inference` field when that is None, as for
        `eqx.nn.Dropout`)."""
        inference = self.inference if inference is None else inference
        if self.dropout == 0 or inference:
            return None
        if key is None:
            raise ValueError(
                f"{type(self).__name__} with dropout > 0 needs `key` (or inference=True, or "
                "eqx.nn.inference_mode(model))."
            )
        k1, k2 = jax.random.split(key)
        return (
            _dropout_mask(k1, self.dropout, (n, self.mlp_in.in_features), dtype),
            _dropout_mask(k2, self.dropout, (n, self.mlp_in.out_features), dtype),
        )
