"""Multi-head attention with learnable per-head inverse temperatures, on the one core."""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, PRNGKeyArray

from .._attention import attention, attention_weights, merge_heads, split_heads
from .._core import Implementation, check_implementation
from ..parallel._ring import SequenceSplit, ring_attention


def check_dims(dim: int, num_heads: int, name: str = "dim") -> int:
    if dim < 1 or num_heads < 1 or dim % num_heads:
        raise ValueError(
            f"`num_heads` must divide `{name}`; got {name}={dim}, num_heads={num_heads}."
        )
    return dim // num_heads


def check_tokens(x, dim: int, name: str = "x"):
    if jnp.ndim(x) != 2 or x.shape[-1] != dim:
        raise ValueError(
            f"`{name}` must have shape [tokens, {dim}] (one example; use jax.vmap for a batch); "
            f"got shape {jnp.shape(x)}."
        )


def check_mask(mask, n: int, m: int, name: str = "mask"):
    if mask is None:
        return None
    mask = jnp.asarray(mask)
    try:
        ok = jnp.broadcast_shapes(mask.shape, (n, m)) == (n, m) and mask.dtype == jnp.bool_
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"`{name}` must be boolean and broadcast to [{n}, {m}] (queries x keys); got "
            f"{mask.dtype}{list(mask.shape)}."
        )
    return mask


def check_sequence(sequence, implementation: str = "auto"):
    if sequence is not None and not isinstance(sequence, SequenceSplit):
        raise TypeError(
            f"`sequence` must be an eqattn.parallel.SequenceSplit or None; got "
            f"{type(sequence).__name__}."
        )
    if sequence is not None and implementation != "auto":
        raise ValueError(
            f"`sequence` (ring attention over a mesh) and `implementation={implementation!r}` "
            "exclude each other: ring attention runs the core on each device's blocks."
        )
    return sequence


def shard_tokens(sequence, x):
    """`x [..., tokens, dim]` sharded along its tokens as `sequence` says (None: as it is)."""
    return x if sequence is None else sequence.constrain(x)


class MultiHeadAttention(eqx.Module):
    r"""$\mathrm{MHA}(u, w) = W_o\,[\mathrm{attention}(u W_q^h, w W_k^h, w W_v^h;\ \beta_h)]_h$.

    The inverse temperatures are learned as $\log\beta_h$, initialized to $1/\sqrt{d_h}$.
    `implementation` chooses the attention kernel (see [`eqattn.select_implementation`][]; `"auto"`
    takes cuDNN's on a GPU for bf16/fp16 without a mask). `sequence`, an
    [`eqattn.parallel.SequenceSplit`][], splits the tokens over a mesh axis and attends with
    [`eqattn.parallel.ring_attention`][] instead.
    Acts on one example: `queries [n, query_dim]`, `keys [m, key_dim]` -> `[n, out_dim]`.
    """

    query_proj: eqx.nn.Linear
    key_proj: eqx.nn.Linear
    value_proj: eqx.nn.Linear
    output_proj: eqx.nn.Linear | None
    log_beta: Float[Array, " heads"]
    num_heads: int = eqx.field(static=True)
    implementation: str = eqx.field(static=True)
    sequence: SequenceSplit | None = eqx.field(static=True)

    def __init__(
        self,
        query_dim: int,
        num_heads: int,
        *,
        key: PRNGKeyArray,
        key_dim: int | None = None,
        hidden_dim: int | None = None,
        value_dim: int | None = None,
        out_dim: int | None = None,
        output_projection: bool = True,
        use_bias: bool = False,
        beta: float | None = None,
        implementation: Implementation = "auto",
        sequence: SequenceSplit | None = None,
        dtype=None,
    ):
        key_dim = query_dim if key_dim is None else key_dim
        hidden_dim = query_dim if hidden_dim is None else hidden_dim
        value_dim = hidden_dim if value_dim is None else value_dim
        out_dim = query_dim if out_dim is None else out_dim
        head_dim = check_dims(hidden_dim, num_heads, "hidden_dim")
        check_dims(value_dim, num_heads, "value_dim")
        kq, kk, kv, ko = jax.random.split(key, 4)
        lin = lambda i, o, k: eqx.nn.Linear(i, o, use_bias=use_bias, key=k, dtype=dtype)  # noqa: E731
        self.query_proj = lin(query_dim, hidden_dim, kq)
        self.key_proj = lin(key_dim, hidden_dim, kk)
        self.value_proj = lin(key_dim, value_dim, kv)
        self.output_proj = lin(value_dim, out_dim, ko) if output_projection else None
        if not output_projection and value_dim != out_dim:
            raise ValueError(
                f"without an output projection `value_dim` ({value_dim}) must equal `out_dim` ({out_dim})."
            )
        beta = 1 / math.sqrt(head_dim) if beta is None else beta
        if beta <= 0:
            raise ValueError(f"`beta` must be > 0; got {beta}.")
        self.log_beta = jnp.full((num_heads,), math.log(beta), dtype=dtype)
        self.num_heads = num_heads
        check_implementation(implementation, need_lse=False)
        self.implementation = implementation
        self.sequence = check_sequence(sequence, implementation)

    @property
    def beta(self) -> Float[Array, " heads"]:
        return jnp.exp(self.log_beta)

    def project(self, queries, keys):
        """Per-head projected queries `[h, n, d_h]` and keys `[h, m, d_h]`."""
        q = split_heads(jax.vmap(self.query_proj)(queries), self.num_heads)
        k = split_heads(jax.vmap(self.key_proj)(keys), self.num_heads)
        return q, k

    def __call__(
        self,
        queries: Float[Array, "n dq"],
        keys: Float[Array, "m dk"],
        values: Float[Array, "m dk"] | None = None,
        *,
        mask: Bool[Array, "n m"] | None = None,
    ) -> Float[Array, "n do"]:
        q, k = self.project(queries, keys)
        v = split_heads(
            jax.vmap(self.value_proj)(keys if values is None else values), self.num_heads
        )
        if self.sequence is None:
            out = attention(q, k, v, beta=self.beta, mask=mask, implementation=self.implementation)
        else:
            split = self.sequence
            out = ring_attention(
                q, k, v, mesh=split.mesh, axis=split.axis, beta=self.beta, mask=mask
            )
        out = merge_heads(out)
        return out if self.output_proj is None else jax.vmap(self.output_proj)(out)

    def association(self, queries, keys, *, mask=None) -> Float[Array, "heads n m"]:
        """The softmax (association) matrix per head."""
        q, k = self.project(queries, keys)
        return attention_weights(q, k, beta=self.beta, mask=mask)  # a fully masked row is 0
