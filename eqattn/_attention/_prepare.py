r"""Prepare: checked arguments made safe to compute on and flattened, once, for every backend.

[`check_arguments`][] turns the user's arguments into arrays and checks them; [`prepare`][]
then makes what the mask (or causality) hides inert, poisons a bad traced `beta`, and flattens
everything to the backends' layout: `q [B, n, d]`, `k [B, m, d]`, `v [B, m, dv]` in their
common dtype, `beta [B]` (at least float32) and `mask [1 or B, 1 or n, m]`, broadcast here only.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._checks import check_inputs, is_concrete


def causal_mask(n: int, m: int):
    """`[n, m]`, True where query i may see key j (j <= i + m - n): for references and for the
    one dense `[n, m]` operator, `attention_weights`."""
    return np.arange(m)[None, :] <= np.arange(n)[:, None] + (m - n)


class Arguments(NamedTuple):
    """The user's arguments as arrays (`values` defaulting to `keys`), checked, and their
    broadcast batch shape."""

    queries: jax.Array
    keys: jax.Array
    values: jax.Array
    beta: jax.Array
    mask: jax.Array | None
    batch: tuple[int, ...]


def check_arguments(queries, keys, values, beta, mask) -> Arguments:
    """[`Arguments`][] from the user's, or a `ValueError` naming the argument and the shapes."""
    queries, keys = jnp.asarray(queries), jnp.asarray(keys)
    values = keys if values is None else jnp.asarray(values)
    mask = None if mask is None else jnp.asarray(mask)
    beta = jnp.asarray(beta)
    return Arguments(
        queries, keys, values, beta, mask, check_inputs(queries, keys, values, beta, mask)
    )


class Problem(NamedTuple):
    """What a backend computes on: flattened inputs (see the module), the batch shape to restore,
    `poison` (`[..., n]` or None, see [`make_masked_inert`][]) and `scale`: the user's `beta`
    where it is one concrete number (cuDNN takes it as its `scale`), else None."""

    q: jax.Array
    k: jax.Array
    v: jax.Array
    beta: jax.Array
    mask: jax.Array | None
    batch: tuple[int, ...]
    poison: jax.Array | None
    scale: jax.Array | None

    def finish(self, out, lse):
        """`(out, lse)` of the flattened problem (`lse` may be None) back in the batch shape,
        poisoned where `poison` says."""
        out = out.reshape(self.batch + out.shape[-2:])
        lse = None if lse is None else lse.reshape(self.batch + lse.shape[-1:])
        return apply_poison(out, lse, self.poison)


def prepare(args: Arguments, causal: bool = False, *, inert: bool = True) -> Problem:
    """The [`Problem`][] of checked arguments: masked entries made inert
    ([`make_masked_inert`][]; skipped with `inert=False`, for callers that do it themselves, per
    device), a traced `beta` poisoned where it is bad ([`poison_bad_beta`][]), flattened."""
    queries, keys, values, beta, mask, batch = args
    poison = None
    if (mask is not None or causal) and inert:
        queries, keys, values, poison = make_masked_inert(
            queries, keys, values, mask, len(batch), causal
        )
    scale = beta if is_concrete(beta) and beta.ndim == 0 else None
    q, k, v, b, mask = flatten(queries, keys, values, poison_bad_beta(beta), mask, batch)
    return Problem(q, k, v, b, mask, batch, poison, scale)


def make_masked_inert(queries, keys, values, mask, rank, causal: bool = False):
    """Masked entries made inert: whatever they hold (NaN, inf), the output and the gradients
    equal those of the problem without them (a masked logit is dropped, but 0 * NaN in a matmul
    is NaN).

    A mask without a query axis (key padding) is the same for every query: the keys and values
    no query may see, and the queries that may see no key, are zeroed. A per-query mask, or
    `causal`, can hide a key from some queries only: then every non-finite query, key and value
    is zeroed, and `poison` (`[..., n]` integers, else `None`) marks the queries it would have
    reached: 2 where the query itself (seeing some key) or a key it sees is not finite, so `lse`
    and `out` are NaN; 1 where only a value it sees is, so `out` is NaN (the whole row: which of
    its entries the value reaches would cost one more `n x m x dv` product). [`apply_poison`][]
    applies it.

    Returns `(queries, keys, values, poison)`."""
    rows = None if mask is None else mask if mask.ndim >= 2 else mask[None, :]

    def trim(x, tail):  # the mask may carry more leading size-1 axes than the batch has
        return x.reshape(x.shape[max(0, x.ndim - (rank + tail)) :])

    def zero(x, bad):
        return trim(zero_rows(x, bad), 2)

    if rows is not None and rows.shape[-2] == 1:
        key_unused = ~jnp.any(rows, axis=-2)  # [..., m]
        query_unused = ~jnp.any(rows, axis=-1)  # [..., 1]
        queries, keys, values = (
            zero(queries, query_unused),
            zero(keys, key_unused),
            zero(values, key_unused),
        )
        if not causal:
            return queries, keys, values, None
    n, m = queries.shape[-2], keys.shape[-2]
    if causal and (rows is None or rows.shape[-2] == 1):
        # Query i sees a prefix of the keys: what reaches it is a running maximum over them.
        bad_q, bad_k, bad_v = nonfinite_rows(queries, keys, values)
        seen = np.clip(np.arange(n) + (m - n), -1, m - 1)
        keep = jnp.ones((m,), bool) if rows is None else jnp.any(rows, axis=-2)
        has_key = (seen >= 0) & jnp.take(
            lax.cummax(keep.astype(jnp.int8), keep.ndim - 1) > 0, seen, axis=-1
        )
        code = (2 * bad_k.astype(jnp.int8)) | bad_v.astype(jnp.int8)
        reached = jnp.where(seen >= 0, jnp.take(lax.cummax(code, code.ndim - 1), seen, axis=-1), 0)
        poison = jnp.maximum(reached, 2 * (bad_q & has_key).astype(jnp.int8))
        return zero(queries, bad_q), zero(keys, bad_k), zero(values, bad_v), trim(poison, 1)
    if causal:
        rows = rows & causal_mask(n, m)
    bad_q, bad_k, bad_v = nonfinite_rows(queries, keys, values)
    return (
        zero(queries, bad_q),
        zero(keys, bad_k),
        zero(values, bad_v),
        trim(poison_codes(rows, bad_q, bad_k, bad_v), 1),
    )


def nonfinite_rows(*xs):
    """For each `x` `[..., t, f]`: `[..., t]`, True where a row holds NaN or inf."""
    return tuple(~jnp.all(jnp.isfinite(x), axis=-1) for x in xs)


def zero_rows(x, bad):
    """`x` with the rows `bad` marks set to 0."""
    return jnp.where(bad[..., None], jnp.zeros((), x.dtype), x)


def poison_codes(rows, bad_q, bad_k, bad_v):
    """[`make_masked_inert`][]'s `poison` from the mask's rows `[..., n, m]` and the non-finite
    queries `[..., n]`, keys and values `[..., m]`: one reduction over the rows."""
    code = (2 * bad_k.astype(jnp.int8)) | bad_v.astype(jnp.int8)  # [..., m]
    reached = jnp.max(jnp.where(rows, code[..., None, :], jnp.int8(0)), axis=-1)
    return jnp.maximum(reached, 2 * (bad_q & jnp.any(rows, axis=-1)).astype(jnp.int8))


def apply_poison(out, lse, poison):
    """`out` and `lse` (or `None`) with NaN where `poison` says (see [`make_masked_inert`][])."""
    if poison is None:
        return out, lse
    out = jnp.where(poison[..., None] > 0, jnp.array(jnp.nan, out.dtype), out)
    return out, None if lse is None else jnp.where(poison > 1, jnp.array(jnp.nan, lse.dtype), lse)


def poison_bad_beta(beta):
    """`beta`, or NaN where a traced `beta` is not finite and > 0 (a concrete one is checked
    eagerly, by `check_arguments`): the output is then NaN, loudly wrong rather than plausibly.

    Not a runtime error (`eqx.error_if`): its host callback cannot be exported (`jax.export` of
    attention with a traced `beta` failed for CPU and for CUDA); in a program over several
    devices, an error raised on one leaves the others waiting at their next collective until
    XLA aborts the process (seen on CPU devices, after 40 s); and on GPUs XLA reads a
    conditional's predicate on the host, a sync per call, inside solver loops too. A caller who
    wants the error wraps its own `beta` in `eqx.error_if`."""
    if is_concrete(beta):
        return beta
    return jnp.where(jnp.isfinite(beta) & (beta > 0), beta, jnp.array(jnp.nan, beta.dtype))


def flatten(queries, keys, values, beta, mask, batch):
    """Checked inputs as the core takes them: `q [B, n, d]`, `k [B, m, d]`, `v [B, m, dv]` in their
    common dtype, `beta [B]` (at least float32) and `mask [1 or B, 1 or n, m]`."""
    (n, d), (m, dv) = queries.shape[-2:], values.shape[-2:]
    dtype = jnp.result_type(queries, keys, values)
    B = int(np.prod(batch, dtype=np.int64))

    def flat(x, tail):
        return jnp.broadcast_to(x.astype(dtype), batch + tail).reshape((B,) + tail)

    q, k, v = flat(queries, (n, d)), flat(keys, (m, d)), flat(values, (m, dv))
    b = jnp.broadcast_to(beta.astype(jnp.promote_types(dtype, jnp.float32)), batch).reshape(B)
    if mask is not None:
        # Broadcast along m only; keep a mask shared over the batch (or over queries) un-copied.
        mask_batch, mask_n = mask.shape[:-2], mask.shape[-2] if mask.ndim >= 2 else 1
        if any(s != 1 for s in mask_batch):
            mask = jnp.broadcast_to(mask, batch + (mask_n, m)).reshape(B, mask_n, m)
        else:  # leading axes all of size 1 (or none)
            rows = mask.reshape(mask.shape[-2:]) if mask.ndim >= 2 else mask
            mask = jnp.broadcast_to(rows, (mask_n, m)).reshape(1, mask_n, m)
    return q, k, v, b, mask
