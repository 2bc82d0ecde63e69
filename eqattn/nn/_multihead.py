"""Multi-head attention with learnable per-head inverse temperatures, on the one core."""

from __future__ import annotations

import math
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray

from .._attention import (
    Implementation,
    attention,
    attention_over_cache,
    attention_weights,
    attention_with_lse,
    check_implementation,
    merge_heads,
    merge_partials,
    split_heads,
)
from ..parallel import SequenceSplit
from ._checks import check_sequence
from ._tokens import per_token


class KeyValues(NamedTuple):
    """Per-head projected keys `[heads, m, qk_size]` and values `[heads, m, vo_size]` of `m`
    tokens: a key/value cache ([`eqattn.nn.MultiHeadAttention.key_values`][]).

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    mha = eqattn.nn.MultiHeadAttention(2, 8, key=jax.random.key(0), causal=True)
    x = jax.random.normal(jax.random.key(1), (5, 8))
    cache = mha.key_values(x[:3])  # the first three tokens, projected once
    assert jnp.allclose(mha(x[3:], x[3:], prefix=cache), mha(x, x)[3:], atol=1e-5)
    ```
    """

    keys: Float[Array, "heads m dk"]
    values: Float[Array, "heads m dv"]

    @property
    def positions(self) -> int:
        """How many tokens' keys and values it holds (`m`)."""
        return self.keys.shape[-2]


class BlockCache(NamedTuple):
    """One block's slot of an [`eqattn.nn.GenerationCache`][]: per-head keys
    `[heads, qk_size, max_len]` and values `[heads, vo_size, max_len]`, positions last, of which
    the first `length` are in use. The rest must be finite (the cache keeps zeros there): they
    are dropped from the softmax, not copied to make them inert. Positions last, a new token's
    dot products and weighted sum run along contiguous memory. It serves as a `prefix` as
    `KeyValues` do, and is what `MultiHeadAttention.over_cache` reads.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    mha = eqattn.nn.MultiHeadAttention(2, 8, key=jax.random.key(0), causal=True)
    x = jax.random.normal(jax.random.key(1), (5, 8))
    kv = mha.key_values(x)  # [heads, 5, 4] each
    room = jnp.zeros((2, 4, 10))  # [heads, d, 10 positions]
    slots = (room.at[..., :5].set(a.swapaxes(1, 2)) for a in kv)
    cache = eqattn.nn.BlockCache(*slots, jnp.array(5))
    # the last token, its own keys and values already in the cache, as in the full pass
    assert jnp.allclose(mha.over_cache(x[4:], cache), mha(x, x)[4:], atol=1e-5)
    ```
    """

    keys: Float[Array, "heads dk max_len"]
    values: Float[Array, "heads dv max_len"]
    length: Int[Array, ""]

    @property
    def positions(self) -> int:
        """How many positions it has room for (`max_len`)."""
        return self.keys.shape[-1]


class MultiHeadAttention(eqx.Module):
    r"""$\mathrm{MHA}(u, w, v) = W_o\,[\mathrm{attention}(u W_q^h, w W_k^h, v W_v^h;\ \beta_h)]_h$.

    The constructor, the projections (`query_proj`, `key_proj`, `value_proj`, `output_proj`) and
    the size fields are those of `eqx.nn.MultiheadAttention`, in its positional order, so its
    weights and habits carry over. What eqattn adds:

    - an inverse temperature per head, learned as $\log\beta_h$ (`log_beta`), initialized to
      `beta` (default $1/\sqrt{\mathrm{qk\_size}}$, Equinox's fixed scale);
    - `values` may be omitted (they are then the keys, so `value_size` defaults to `key_size`);
    - masks broadcasting to `[n, m]`, with fully masked rows giving 0 (not NaN), and `causal`
      (query $i$ sees keys $j \le i + m - n$, with no `n x m` mask: see
      [`eqattn.attention`][]);
    - `implementation`, the attention kernel (see [`eqattn.select_implementation`][]; `"auto"`
      takes cuDNN's on a GPU for bf16/fp16 without a mask), and `sequence`, an
      [`eqattn.parallel.SequenceSplit`][] that splits the tokens over a mesh axis and attends
      with [`eqattn.parallel.ring_attention`][];
    - `output_projection=False` drops $W_o$ (the heads' outputs are concatenated; then
      `output_size` must be `num_heads * vo_size`).

    Acts on one example: `queries [n, query_size]`, `keys [m, key_size]`,
    `values [m, value_size]` -> `[n, output_size]`. No dropout on the weights (Equinox's
    `dropout_p`); the equilibrium layers drop sublayer outputs instead.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn.nn

    mha = eqattn.nn.MultiHeadAttention(4, 32, key=jax.random.key(0), causal=True)
    x = jax.random.normal(jax.random.key(1), (10, 32))  # one sequence; jax.vmap for a batch
    y = mha(x, x)
    assert y.shape == (10, 32)
    # causal: changing the last token moves no earlier output
    assert jnp.allclose(mha(x.at[-1].set(0.0), x.at[-1].set(0.0))[:-1], y[:-1], atol=1e-5)
    ```
    """

    query_proj: eqx.nn.Linear
    key_proj: eqx.nn.Linear
    value_proj: eqx.nn.Linear
    output_proj: eqx.nn.Linear | None
    log_beta: Float[Array, " heads"]
    num_heads: int = eqx.field(static=True)
    query_size: int = eqx.field(static=True)
    key_size: int = eqx.field(static=True)
    value_size: int = eqx.field(static=True)
    output_size: int = eqx.field(static=True)
    qk_size: int = eqx.field(static=True)
    vo_size: int = eqx.field(static=True)
    use_query_bias: bool = eqx.field(static=True)
    use_key_bias: bool = eqx.field(static=True)
    use_value_bias: bool = eqx.field(static=True)
    use_output_bias: bool = eqx.field(static=True)
    implementation: Implementation = eqx.field(static=True)
    sequence: SequenceSplit | None = eqx.field(static=True)
    causal: bool = eqx.field(static=True)

    def __init__(
        self,
        num_heads: int,
        query_size: int,
        key_size: int | None = None,
        value_size: int | None = None,
        output_size: int | None = None,
        qk_size: int | None = None,
        vo_size: int | None = None,
        use_query_bias: bool = False,
        use_key_bias: bool = False,
        use_value_bias: bool = False,
        use_output_bias: bool = False,
        *,
        key: PRNGKeyArray,
        beta: float | None = None,
        output_projection: bool = True,
        implementation: Implementation = "auto",
        sequence: SequenceSplit | None = None,
        causal: bool = False,
        dtype=None,
    ):
        for name, value in (("num_heads", num_heads), ("query_size", query_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be an int >= 1; got {value!r}.")
        key_size = query_size if key_size is None else key_size
        value_size = key_size if value_size is None else value_size
        qk_size = query_size // num_heads if qk_size is None else qk_size
        vo_size = query_size // num_heads if vo_size is None else vo_size
        heads_out = num_heads * vo_size
        if output_size is None:
            output_size = query_size if output_projection else heads_out
        if qk_size < 1 or vo_size < 1:
            raise ValueError(
                f"`qk_size` and `vo_size` (per head; default query_size // num_heads) must be "
                f">= 1; got qk_size={qk_size}, vo_size={vo_size} (query_size={query_size}, "
                f"num_heads={num_heads})."
            )
        if not output_projection and output_size != heads_out:
            raise ValueError(
                f"without an output projection `output_size` ({output_size}) must equal "
                f"num_heads * vo_size ({heads_out})."
            )
        kq, kk, kv, ko = jax.random.split(key, 4)
        lin = lambda i, o, b, k: eqx.nn.Linear(i, o, use_bias=b, key=k, dtype=dtype)  # noqa: E731
        self.query_proj = lin(query_size, num_heads * qk_size, use_query_bias, kq)
        self.key_proj = lin(key_size, num_heads * qk_size, use_key_bias, kk)
        self.value_proj = lin(value_size, heads_out, use_value_bias, kv)
        self.output_proj = (
            lin(heads_out, output_size, use_output_bias, ko) if output_projection else None
        )
        beta = 1 / math.sqrt(qk_size) if beta is None else beta
        if beta <= 0:
            raise ValueError(f"`beta` must be > 0; got {beta}.")
        # A concrete dtype (never weakly typed): an optimizer update would change a weak one and
        # retrace the user's jitted step.
        dtype = jax.dtypes.canonicalize_dtype(jnp.float64 if dtype is None else dtype)
        self.log_beta = jnp.full((num_heads,), math.log(beta), dtype=dtype)
        self.num_heads = num_heads
        self.query_size, self.key_size, self.value_size = query_size, key_size, value_size
        self.output_size, self.qk_size, self.vo_size = output_size, qk_size, vo_size
        self.use_query_bias, self.use_key_bias = use_query_bias, use_key_bias
        self.use_value_bias, self.use_output_bias = use_value_bias, use_output_bias
        check_implementation(implementation, need_lse=False)
        if sequence is not None and implementation == "cudnn":
            raise ValueError(
                "`sequence` (ring attention over a mesh) runs 'auto', 'xla', 'chunked' or "
                "'pallas' on each device's blocks (cuDNN gives no log-sum-exp to merge them); "
                "got implementation='cudnn'."
            )
        self.implementation = implementation
        self.sequence = check_sequence(sequence)
        if not isinstance(causal, bool):
            raise TypeError(f"`causal` must be True or False; got {causal!r}.")
        self.causal = causal

    @property
    def beta(self) -> Float[Array, " heads"]:
        return jnp.exp(self.log_beta)

    def project(self, queries, keys):
        """Per-head projected queries `[h, n, d_h]` and keys `[h, m, d_h]`."""
        q = split_heads(per_token(self.query_proj, queries), self.num_heads)
        k = split_heads(per_token(self.key_proj, keys), self.num_heads)
        return q, k

    def key_values(
        self, keys: Float[Array, "m dk"], values: Float[Array, "m dv"] | None = None
    ) -> KeyValues:
        """The per-head projected keys and values of `keys` (and `values`): what a cache of
        earlier tokens holds (see `prefix` in `__call__`)."""
        k = split_heads(per_token(self.key_proj, keys), self.num_heads)
        v = split_heads(
            per_token(self.value_proj, keys if values is None else values), self.num_heads
        )
        return KeyValues(k, v)

    def __call__(
        self,
        queries: Float[Array, "n dq"],
        keys: Float[Array, "m dk"],
        values: Float[Array, "m dv"] | None = None,
        *,
        mask: Bool[ArrayLike, "#queries #keys"] | None = None,
        prefix: KeyValues | BlockCache | None = None,
    ) -> Float[Array, "n do"]:
        """`prefix`, the [`key_values`][eqattn.nn.MultiHeadAttention.key_values] of `p`
        earlier tokens (a key/value cache), is put in front of this call's keys and values:
        the queries then attend over `p + m` keys (`mask` is then `[n, p + m]`; with `causal`,
        query $i$ sees the whole prefix and keys $j \\le i + m - n$ of this call's). A
        [`BlockCache`][eqattn.nn.BlockCache] prefix counts its `max_len` positions as `p`, of
        which the queries see the first `length`."""
        q = split_heads(per_token(self.query_proj, queries), self.num_heads)
        k, v = self.key_values(keys, values)
        if prefix is not None:
            if self.sequence is not None:
                raise ValueError("`prefix` (a key/value cache) does not combine with `sequence`.")
            out = self._with_prefix(q, k, v, mask, prefix)
        else:
            # one call decides how: the engine on this device, or the ring over `sequence`'s mesh
            attend = attention if self.sequence is None else self.sequence.attention
            out = attend(
                q,
                k,
                v,
                beta=self.beta,
                mask=mask,
                causal=self.causal,
                implementation=self.implementation,
            )
        out = merge_heads(out)
        return out if self.output_proj is None else per_token(self.output_proj, out)

    def over_cache(self, queries: Float[Array, "n dq"], cache: BlockCache) -> Float[Array, "n do"]:
        """The queries' attention over `cache` alone (their own keys and values already
        written there, as cached generation does)."""
        if self.sequence is not None:
            raise ValueError("a key/value cache does not combine with `sequence`.")
        q = split_heads(per_token(self.query_proj, queries), self.num_heads)
        out = merge_heads(self._read(q, cache)[0].astype(q.dtype))
        return out if self.output_proj is None else per_token(self.output_proj, out)

    def _read(self, q, cache: BlockCache, mask=None):
        """`(out, lse)` of the per-head queries `q` over `cache`'s positions in use (eqattn's
        cache read, whatever `implementation` says: see `eqattn._attention._decode`)."""
        k, v = cache.keys.astype(q.dtype), cache.values.astype(q.dtype)
        return attention_over_cache(q, k, v, cache.length, beta=self.beta, mask=mask)

    def _lse(self, q, k, v, mask, causal: bool):
        return attention_with_lse(
            q, k, v, beta=self.beta, mask=mask, causal=causal, implementation=self.implementation
        )

    def _with_prefix(self, q, k, v, mask, prefix: KeyValues | BlockCache):
        r"""Attention over the cached `prefix`'s keys, then this call's, without joining them:
        each part's `(out, lse)` and their exact merge,
        $\mathrm{out} = \sum_s e^{\mathrm{lse}_s - \mathrm{lse}}\,\mathrm{out}_s$. The cache is
        read where it lies, not copied with one more row at every call (a DEQ's solver step)."""
        p = prefix.positions
        if self.implementation == "cudnn" and isinstance(prefix, KeyValues):  # one call: no lse
            pk, pv = prefix.keys.astype(k.dtype), prefix.values.astype(v.dtype)
            joined = jnp.concatenate([pk, k], axis=1), jnp.concatenate([pv, v], axis=1)
            return attention(
                q, *joined, beta=self.beta, mask=mask, causal=self.causal, implementation="cudnn"
            )
        masks = (None, None)
        if mask is not None:
            mask = jnp.asarray(mask)
            mask = jnp.broadcast_to(
                mask, jnp.broadcast_shapes(mask.shape, (q.shape[1], p + k.shape[1]))
            )
            masks = (mask[..., :p], mask[..., p:])
        if isinstance(prefix, BlockCache):
            first = self._read(q, prefix, masks[0])
        else:
            pk, pv = prefix.keys.astype(k.dtype), prefix.values.astype(v.dtype)
            first = self._lse(q, pk, pv, masks[0], False)
        parts = [first, self._lse(q, k, v, masks[1], self.causal)]
        wide = jnp.promote_types(q.dtype, jnp.float32)  # merged in at least float32
        parts = [(out.astype(wide), lse) for out, lse in parts]
        return merge_partials(*parts)[0].astype(q.dtype)

    def association(self, queries, keys, *, mask=None) -> Float[Array, "heads n m"]:
        """The softmax (association) matrix per head."""
        q, k = self.project(queries, keys)
        # a fully masked row is 0
        return attention_weights(q, k, beta=self.beta, mask=mask, causal=self.causal)
