r"""The math of one `[rows, cols]` tile of logits, shared by the GPU (Triton) and TPU (Mosaic)
kernels.

Logits are kept in base 2, $s_2 = \log_2(e)\,\beta\, q\cdot k$, so that each weight is one `exp2`.
A logit that does not count (masked, or padding) is $-\infty$; the running maximum is replaced by
0 while it is $-\infty$, so a query with no key ends with $\ell = -\infty$, `out = 0` and zero
cotangents, never NaN.

Per-row statistics (running maximum, sum of exponentials, log-sum-exp, the backward's row term)
have shape `[rows, L]`: `L = 1` on GPUs; on TPUs `L = 128`, the value repeated along the lanes,
which is how Mosaic lays out a column best.

Backward, with $p = 2^{s_2 - \ell_2}$ recomputed per tile and the row term
$\delta_i = \bar o_i\cdot o_i - \bar\ell_i$ (the log-sum-exp's cotangent shifts FlashAttention's
$D_i$): $\bar s = p\odot(\bar o\, v^\top - \delta)$, $\bar v = p^\top \bar o$,
$\bar k = \beta\, \bar s^\top q$, $\bar q = \beta\, \bar s\, k$ and
$\bar\beta = \sum_i q_i\cdot(\bar s\, k)_i$ (the kernels accumulate $\bar s\,k$, then scale).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

LOG2E = math.log2(math.e)


def pow2(x: int, least: int = 16) -> int:
    """The least power of two >= max(x, least)."""
    return max(least, 1 << max(0, int(x) - 1).bit_length())


def dot(a, b, dtype):
    """a @ b"""
    return lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=dtype)


def dot_nt(a, b, dtype):
    """a @ b.T"""
    return lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=dtype)


def dot_tn(a, b, dtype):
    """a.T @ b, with `a` transposed in its own dtype, then cast to `b`'s (as TPUs want it)."""
    return dot(jnp.transpose(a).astype(b.dtype), b, dtype)


def rows(stat, cols: int):
    """A per-row statistic `[rows, L]` shaped to combine with a `[rows, cols]` tile."""
    lanes = stat.shape[1]
    if lanes == 1 or lanes == cols:
        return stat
    if cols < lanes:
        return stat[:, :cols]
    return jnp.tile(stat, (1, cols // lanes))


def allowed(mask_tile, shape, k_start, m_real):
    """Which logits of a tile count: the mask's tile and the keys below the real `m` (None: all
    of them)."""
    ok = None if mask_tile is None else jnp.broadcast_to(mask_tile, shape)
    if m_real is not None:
        keys = k_start + lax.broadcasted_iota(jnp.int32, shape, 1) < m_real
        ok = keys if ok is None else ok & keys
    return ok


def logits(q, k, scale, ok, dtype):
    """Base-2 logits `[rows, cols]` of a query and a key block; -inf where not `ok`."""
    s = dot_nt(q, k, dtype) * scale
    return s if ok is None else jnp.where(ok, s, -jnp.inf)


def softmax_init(block_q: int, lanes: int, dv: int | None, dtype):
    """`(row maximum, sum of exponentials, weighted sum of values)` before any key."""
    acc = None if dv is None else jnp.zeros((block_q, dv), dtype)
    return jnp.full((block_q, lanes), -jnp.inf, dtype), jnp.zeros((block_q, lanes), dtype), acc


def softmax_step(s, state, v, dtype):
    """The online softmax's state after one more block of keys with logits `s` and values `v`
    (None: no values, the log-sum-exp only)."""
    row_max, total, acc = state
    new_max = jnp.maximum(row_max, jnp.max(s, axis=1, keepdims=True))
    shift = jnp.where(new_max == -jnp.inf, 0.0, new_max)
    correction = jnp.exp2(row_max - shift)  # 0 while the row had no key: 2^(-inf - 0)
    p = jnp.exp2(s - rows(shift, s.shape[1]))
    total = correction * total + jnp.sum(p, axis=1, keepdims=True)
    if v is not None:
        acc = rows(correction, acc.shape[1]) * acc + dot(p.astype(v.dtype), v, dtype)
    return new_max, total, acc


def softmax_result(state):
    """`(out or None, lse)`: the normalized output and the natural log-sum-exp `[rows, L]`."""
    row_max, total, acc = state
    lse = (row_max + jnp.log2(total)) / LOG2E  # log2(0) = -inf for a row with no key
    if acc is None:
        return None, lse
    return acc / rows(jnp.where(total > 0, total, 1.0), acc.shape[1]), lse


def score_cotangent(q, k, v, do, scale, ok, lse2, delta, dtype):
    r"""`(p, ds)`: the recomputed weights of a tile and the cotangent of its logits,
    $\bar s = p \odot (\bar o\, v^\top - \delta)$ (`v` None: $-p\,\delta$)."""
    s = logits(q, k, scale, ok, dtype)
    cols = s.shape[1]
    p = jnp.exp2(s - rows(lse2, cols))
    if v is None:
        return p, -p * rows(delta, cols)
    return p, p * (dot_nt(do, v, dtype) - rows(delta, cols))
