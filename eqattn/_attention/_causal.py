r"""Causal attention with no `n x m` mask and no work above the diagonal.

Query $i$ of $n$ sees key $j$ of $m$ when $j \le i + (m - n)$: the causal mask aligned at the
bottom right, so with $n = m$ query $i$ sees keys $0..i$, and $n$ new queries at the end of $m$
cached keys (generation) see every key up to their own position. Queries before the first key
($n > m$) see none: `lse = -inf`, `out = 0`.

The square part, the last $s = \min(n, m)$ queries against the last $s$ keys, is cut by halving.
With $S \ge s$ the size padded to $2^L$ leaves of at most `leaf` rows: at level $l < L$ the
$2^l$ blocks of side $h = S / 2^{l+1}$ just below the diagonal (query chunk $2i + 1$ against key
chunk $2i$) are full, so they take no mask and run as one batched call of the backend; the
$2^L$ diagonal leaves run as one batched call under one small `leaf x leaf` triangle. Blocks
above the diagonal are never formed: the work is about half the dense one. Keys before the
square ($m > n$) form one more full block for every query. Partial results combine by the
online softmax's exact merge (`merge_partials`); the backward pass gives each block's shares
from the global log-sum-exp, as the core's key chunks do.

A backend here is any object with the core's `forward` / `backward` contract on flattened
inputs (`q [B, n, d]`, `k [B, m, d]`, `v [B, m, dv]`, `beta [B]`, `mask [1 or B, 1 or n, m]`):
the XLA core along a path per block or the fused Pallas kernel (`_backends`).
"""

from __future__ import annotations

import dataclasses
import functools as ft

import jax
import jax.numpy as jnp
import numpy as np

from . import _xla
from ._prepare import causal_mask


@dataclasses.dataclass(frozen=True)
class _Layout:
    """The square part's sizes: `s` real rows padded to `S = leaf * 2^levels`."""

    s: int
    levels: int
    leaf: int

    @classmethod
    def of(cls, s: int, leaf_max: int):
        levels = 0
        while -(-s // (1 << levels)) > leaf_max:
            levels += 1
        leaf = -(-s // (1 << levels))
        return cls(s, levels, -(-leaf // 8) * 8)

    @property
    def S(self) -> int:
        return self.leaf << self.levels

    def pairs(self):
        """`(chunks, query chunks, key chunks)` of each batched call: the levels' blocks below
        the diagonal, then the leaves (their own triangle)."""
        for level in range(self.levels):
            yield 2 << level, slice(1, None, 2), slice(0, None, 2)
        yield 1 << self.levels, slice(None), slice(None)


def _pad_rows(x, rows: int, value=0):
    pad = rows - x.shape[1]
    return (
        x
        if pad == 0
        else jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2), constant_values=value)
    )


def _chunks(x, chunks: int, which):
    """`[B, S, ...]` -> the chosen chunks stacked on the batch: `[B * c, S / chunks, ...]`."""
    B, S = x.shape[:2]
    y = x.reshape(B, chunks, S // chunks, *x.shape[2:])[:, which]
    return y.reshape(B * y.shape[1], *y.shape[2:])  # explicit sizes: dv may be 0


def _unchunks(x, B: int):
    """`[B * c, h, ...]` -> `[B, c, h, ...]`."""
    return x.reshape(B, x.shape[0] // B, *x.shape[1:])


def _mask_pairs(mask, B: int, chunks: int, rows, cols):
    """The `[1 or B * c, 1 or h, h]` mask of the blocks pairing query chunks `rows` with key
    chunks `cols` (None without a mask); `mask` is `[1 or B, 1 or S, S]`."""
    if mask is None:
        return None
    h = mask.shape[2] // chunks
    idx = np.arange(chunks)
    if mask.shape[1] == 1:  # key padding: the key chunks' columns
        out = jnp.moveaxis(mask.reshape(mask.shape[0], 1, chunks, h)[:, :, idx[cols]], 2, 1)
    else:  # [Bm, c, h, h]: the pairs of chunks, each block once
        grid = mask.reshape(mask.shape[0], chunks, h, chunks, h)
        out = jnp.moveaxis(grid[:, idx[rows], :, idx[cols], :], 0, 1)
    if out.shape[0] != B and out.shape[1] != 1:
        out = jnp.broadcast_to(out, (B, *out.shape[1:]))
    return out.reshape(out.shape[0] * out.shape[1], *out.shape[2:])


def _blocks(layout: _Layout, q, k, v, beta, mask):
    """Per batched call: `(chunks, rows, cols, (q, k, v, beta, mask) of its blocks)`."""
    B = q.shape[0]
    for chunks, rows, cols in layout.pairs():
        count = len(range(chunks)[rows])
        m = _mask_pairs(mask, B, chunks, rows, cols)
        if rows == slice(None):  # the leaves: their triangle, shared by every block
            h = layout.S // chunks
            tri = jnp.asarray(causal_mask(h, h))[None]
            m = tri if m is None else m & tri
        args = (
            _chunks(q, chunks, rows),
            _chunks(k, chunks, cols),
            _chunks(v, chunks, cols),
            jnp.repeat(beta, count),
            m,
        )
        yield chunks, rows, cols, args


def _square(q, k, v, mask, layout: _Layout, n: int, m: int):
    """The square part's inputs, padded to `S` (padding keys come after every real query, so no
    real query sees them; padding queries are dropped)."""
    s, S = layout.s, layout.S
    qs, ks, vs = (_pad_rows(x[:, -s:], S) for x in (q, k, v))
    if mask is not None:
        mask = mask[:, :, m - s :] if mask.shape[1] == 1 else mask[:, n - s :, m - s :]
        mask = jnp.pad(mask, [(0, 0), (0, 0 if mask.shape[1] == 1 else S - s), (0, S - s)])
    return qs, ks, vs, mask


def _prefix_mask(mask, n: int, m: int):
    return None if mask is None else mask[..., : m - n]


def forward(q, k, v, beta, mask, backend, leaf: int):
    """`(out, lse)` in the compute dtype of causal attention on flattened inputs (no VJP)."""
    B, n = q.shape[:2]
    m, dv = v.shape[1:]
    dtype = _xla.compute_dtype(q.dtype, k.dtype, v.dtype)
    s = min(n, m)
    if s == 0:
        return jnp.zeros((B, n, dv), dtype), jnp.full((B, n), -jnp.inf, dtype)
    layout = _Layout.of(s, leaf)
    qs, ks, vs, ms = _square(q, k, v, mask, layout, n, m)
    out = jnp.zeros((B, layout.S, dv), dtype)
    lse = jnp.full((B, layout.S), -jnp.inf, dtype)
    for chunks, rows, _, args in _blocks(layout, qs, ks, vs, beta, ms):
        part = backend.forward(*args)
        view = [x.reshape(B, chunks, layout.S // chunks, *x.shape[2:]) for x in (out, lse)]
        merged = _xla.merge_partials(
            (view[0][:, rows], view[1][:, rows]), tuple(_unchunks(p, B) for p in part)
        )
        out, lse = (
            x.at[:, rows].set(y).reshape(B, layout.S, *x.shape[3:]) for x, y in zip(view, merged)
        )
    out, lse = out[:, :s], lse[:, :s]
    if m > n:  # keys before the square: one full block for every query
        prefix = backend.forward(q, k[:, : m - n], v[:, : m - n], beta, _prefix_mask(mask, n, m))
        out, lse = _xla.merge_partials((out, lse), prefix)
    if n > m:  # queries before the first key see none
        out = jnp.concatenate([jnp.zeros((B, n - m, dv), dtype), out], axis=1)
        lse = jnp.concatenate([jnp.full((B, n - m), -jnp.inf, dtype), lse], axis=1)
    return out, lse


def _add(x, chunks: int, which, y):
    """`x [B, S, f]` with `y [B * c, S / chunks, f]` added to its chunks `which`."""
    B, S = x.shape[:2]
    view = x.reshape(B, chunks, S // chunks, *x.shape[2:])
    return view.at[:, which].add(_unchunks(y, B)).reshape(x.shape)


def backward(q, k, v, beta, mask, lse, delta, g_out, g_lse, dtype, backend, leaf: int):
    r"""`(dq, dk, dv, dbeta)` in `dtype` of causal attention, the weights recomputed from the
    `lse` over all keys and $\delta = \sum g_o \odot o$: the core's `backward` contract."""
    B, n = q.shape[:2]
    m = k.shape[1]
    dq, dk, dv = (jnp.zeros(x.shape, dtype) for x in (q, k, v))
    dbeta = jnp.zeros((B,), dtype)
    s = min(n, m)
    if s == 0:
        return dq, dk, dv, dbeta
    layout = _Layout.of(s, leaf)
    qs, ks, vs, ms = _square(q, k, v, mask, layout, n, m)
    rows_in = [_pad_rows(x[:, -s:], layout.S) for x in (lse, delta, g_out, g_lse)]
    grads = [jnp.zeros((B, layout.S, x.shape[2]), dtype) for x in (q, k, v)]
    for chunks, rows, cols, args in _blocks(layout, qs, ks, vs, beta, ms):
        shares = backend.backward(*args, *(_chunks(x, chunks, rows) for x in rows_in), dtype)
        grads = [_add(g, chunks, w, x) for g, w, x in zip(grads, (rows, cols, cols), shares)]
        dbeta = dbeta + shares[3].reshape(B, -1).sum(axis=1)
    dq, dk, dv = (d.at[:, -s:].add(g[:, :s]) for d, g in zip((dq, dk, dv), grads))
    if m > n:  # keys before the square
        mp = _prefix_mask(mask, n, m)
        shares = backend.backward(
            q, k[:, : m - n], v[:, : m - n], beta, mp, lse, delta, g_out, g_lse, dtype
        )
        dq = dq + shares[0]
        dk, dv = dk.at[:, : m - n].add(shares[1]), dv.at[:, : m - n].add(shares[2])
        dbeta = dbeta + shares[3]
    return dq, dk, dv, dbeta


@ft.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def attention_core(q, k, v, beta, mask, backend, leaf: int):
    """`(out, lse)` of causal attention on flattened inputs, in the dtype of `v`; the backward
    pass recomputes the weights block by block."""
    out, lse = forward(q, k, v, beta, mask, backend, leaf)
    return out.astype(v.dtype), lse.astype(v.dtype)


def _core_fwd(q, k, v, beta, mask, backend, leaf):
    out, lse = forward(q, k, v, beta, mask, backend, leaf)
    return (out.astype(v.dtype), lse.astype(v.dtype)), (q, k, v, beta, mask, out, lse)


def _core_bwd(backend, leaf, res, cotangents):
    return _xla.recomputing_backward(
        res, cotangents, ft.partial(backward, backend=backend, leaf=leaf)
    )


attention_core.defvjp(_core_fwd, _core_bwd)
