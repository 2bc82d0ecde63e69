r"""Ring attention: queries, keys and values all split along the sequence over a mesh axis.

Each of the $P$ devices keeps its block of $n/P$ queries and passes its block of $m/P$ keys and
values to the next device, $P$ times around the ring (`jax.lax.ppermute`), so that every query
block meets every key block once. Each meeting gives the block's `(out, lse)` from the core's
`forward`, merged into the query block's running pair by the online softmax's merge
(`merge_partials`):

$$\mathrm{lse} = \log\left(e^{\mathrm{lse}_a} + e^{\mathrm{lse}_b}\right), \qquad
  \mathrm{out} = e^{\mathrm{lse}_a - \mathrm{lse}}\,\mathrm{out}_a
               + e^{\mathrm{lse}_b - \mathrm{lse}}\,\mathrm{out}_b .$$

The backward pass (a custom VJP) sends the query blocks around the ring, each with its rows'
statistics (`lse`, $\delta$), the output's cotangent and the accumulator of its gradient
`dq`: a device adds the shares of the block in hand against its own keys (weights recomputed
from the saved global `lse`, as in the one-device core) to that `dq` and to its own `dk`, `dv`,
and passes the block on; after $P$ moves every `dq` is home, complete. With $n = m$ this moves
fewer bytes than sending the keys and values with `dk`, `dv` (with bfloat16 inputs and float32
accumulators, $6d + 2d_v$ bytes a row against $6d + 6d_v$), and a block in flight is held
twice (sent and received). A mask with a row per query is redistributed once (an all-to-all:
each device gets every query's columns of its own keys), so no mask travels. A device holds
its own blocks, one block in flight and its outputs: $O((n + m) d / P)$ memory, forward and
backward. The output and its cotangent stay in the inputs' dtype; statistics and
accumulators are at least float32.

Causal attention (query $i$ sees keys $j \le i$) splits the sequence into $2P$ chunks and gives
device $i$ chunks $i$ and $2P - 1 - i$ (the "zig-zag" order): every device then has the same
number of chunk pairs to compute at every ring step (two, three on its own block) and skips the
pairs that causality masks entirely. A contiguous split would leave device 0 idle for all
but one step and give device $P - 1$ all the work; a striped split balances the work too but
masks half of every block, so it can skip none. Pairs on the diagonal are the one-device causal
attention of the engine (its `blockwise.forward` with `diag`: halved down to `chunk_size`, default
512, queries),
so no large causal mask is ever formed. The skip is a `lax.switch` per chunk pair (measured on
CPU devices only).
"""

from __future__ import annotations

import dataclasses
import functools as ft

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._attention import blockwise
from ._sequence import varying


@dataclasses.dataclass(frozen=True)
class Ring:
    """The static description of one ring computation (per device)."""

    axis: str
    size: int  # devices on the ring
    causal: bool
    split_mask: bool  # the mask has a row per query, split over the devices with them
    # What computes each pair of blocks (the engine's core or its fused kernel, whose forward
    # and backward keep no block of logits); a diagonal pair (queries and keys at the same
    # positions) by the engine's causal blocks, halved down to `blocks.leaf` queries.
    blocks: blockwise.Blocks


def zigzag_order(n: int, size: int) -> np.ndarray:
    """Positions in the order the devices hold them: device i gets chunks i and 2P - 1 - i."""
    chunks = np.arange(n).reshape(2 * size, n // (2 * size))
    return np.concatenate([np.concatenate([chunks[i], chunks[-1 - i]]) for i in range(size)])


def _chunk_home(c: int, size: int) -> int:
    """The device of chunk `c` of 2P in the zig-zag layout."""
    return c if c < size else 2 * size - 1 - c


def to_zigzag(ring: Ring, x):
    """Per device: from its contiguous block (chunks 2i, 2i + 1 along axis 1) to its zig-zag
    chunks (i, 2P - 1 - i). Each of the two halves goes to one device (two `ppermute`s, no
    gather): chunk j, the one device j keeps in front, comes from the first halves when j is
    even and from the second halves when it is odd; the back chunk 2P - 1 - j from the other."""
    size, c = ring.size, x.shape[1] // 2
    first = lax.ppermute(x[:, :c], ring.axis, [(i, _chunk_home(2 * i, size)) for i in range(size)])
    second = lax.ppermute(
        x[:, c:], ring.axis, [(i, _chunk_home(2 * i + 1, size)) for i in range(size)]
    )
    even = lax.axis_index(ring.axis) % 2 == 0
    front, back = jnp.where(even, first, second), jnp.where(even, second, first)
    return jnp.concatenate([front, back], axis=1)


def from_zigzag(ring: Ring, x):
    """Inverse of `to_zigzag`."""
    size, c = ring.size, x.shape[1] // 2
    even = lax.axis_index(ring.axis) % 2 == 0
    front, back = x[:, :c], x[:, c:]
    first, second = jnp.where(even, front, back), jnp.where(even, back, front)
    first = lax.ppermute(first, ring.axis, [(_chunk_home(2 * i, size), i) for i in range(size)])
    second = lax.ppermute(
        second, ring.axis, [(_chunk_home(2 * i + 1, size), i) for i in range(size)]
    )
    return jnp.concatenate([first, second], axis=1)


def _pairs(ring: Ring, me, src, nl: int, ml: int):
    """The (query rows, key rows, key columns of the full mask, chunk indices) this device
    computes when it holds the key block of device `src`. Without causality one pair: all
    local queries with all keys in hand. With it, the four pairs of chunks (half blocks)."""
    if not ring.causal:
        return [(slice(0, nl), slice(0, ml), src * ml, None)]
    c, last = nl // 2, 2 * ring.size - 1
    q_chunks = [(slice(0, c), me), (slice(c, nl), last - me)]
    k_chunks = [(slice(0, c), src, 0), (slice(c, ml), last - src, c)]
    return [
        (rows, keys, src * ml + offset, (qi, ki))
        for rows, qi in q_chunks
        for keys, ki, offset in k_chunks
    ]


def _pair_mask(msk, rows, col, width):
    """The user's mask of one pair (None without one): the rows of the local queries, `width`
    columns from `col` of the full key axis."""
    if msk is None:
        return None
    sub = msk if msk.shape[1] == 1 else msk[:, rows]
    return lax.dynamic_slice_in_dim(sub, col, width, axis=-1)


def _pair_forward(ring, q, k, v, b, mask, diag: bool):
    """`(out, lse)` of the queries against the keys; with `diag`, query i and key i are at the
    same position and a key after the query is hidden."""
    return blockwise.forward(ring.blocks, q, k, v, b, mask, diag)


def _pair_backward(ring, q, k, v, b, mask, rows_in, dtype, diag: bool):
    """`(dq, dk, dv, dbeta)` shares of one pair (as `_pair_forward`); `rows_in` = the queries'
    `(lse, delta, g_out, g_lse)`."""
    return blockwise.backward(ring.blocks, q, k, v, b, mask, rows_in, dtype, diag)


def _relation(chunks):
    """0: the key chunk is after the query chunk (skip), 1: before it (full), 2: the same."""
    qi, ki = chunks
    return jnp.where(ki < qi, 1, jnp.where(ki == qi, 2, 0))


def _block_forward(ring, me, src, q, k, v, b, msk, acc):
    """Merge this device's queries' pairs with the key block of device `src` into `acc`."""
    nl, ml = q.shape[1], k.shape[1]
    out, lse = acc
    dtype = out.dtype
    for rows, keys, col, chunks in _pairs(ring, me, src, nl, ml):
        qx, ky, vy = q[:, rows], k[:, keys], v[:, keys]
        mask = _pair_mask(msk, rows, col, ky.shape[1])

        def pair(diag, qx=qx, ky=ky, vy=vy, mask=mask):
            return _pair_forward(ring, qx, ky, vy, b, mask, diag)

        if chunks is None:
            new = pair(False)
        else:
            empty = (
                varying(jnp.zeros(out[:, rows].shape, dtype), ring.axis),
                varying(jnp.full(lse[:, rows].shape, -jnp.inf, dtype), ring.axis),
            )
            branches = [lambda empty=empty: empty, lambda: pair(False), lambda: pair(True)]
            new = lax.switch(_relation(chunks), branches)
        o, s = blockwise.merge((out[:, rows], lse[:, rows]), new)
        out, lse = out.at[:, rows].set(o), lse.at[:, rows].set(s)
    return out, lse


def _shift(ring: Ring, *xs):
    """Every device sends `xs` to the next device on the ring."""
    perm = [(j, (j + 1) % ring.size) for j in range(ring.size)]
    return lax.ppermute(xs, ring.axis, perm)


def _ring_forward(ring: Ring, q, k, v, b, msk):
    dtype = blockwise.compute_dtype(q.dtype, k.dtype, v.dtype)
    me = lax.axis_index(ring.axis)
    b = b.astype(dtype)
    acc = (
        varying(jnp.zeros(q.shape[:-1] + v.shape[-1:], dtype), ring.axis),
        varying(jnp.full(q.shape[:-1], -jnp.inf, dtype), ring.axis),
    )

    def body(t, carry):
        acc, k, v = carry
        sent = _shift(ring, k, v)  # on its way while this block is computed
        acc = _block_forward(ring, me, (me - t) % ring.size, q, k, v, b, msk, acc)
        return (acc, *sent)

    acc, k, v = lax.fori_loop(0, ring.size - 1, body, (acc, k, v))
    out, lse = _block_forward(ring, me, (me + 1) % ring.size, q, k, v, b, msk, acc)
    return out.astype(v.dtype), lse


def _keys_mask(ring: Ring, msk, ml: int):
    """The user's mask for this device's keys, per query block: `mask(owner)` gives the mask
    `[1 or B, 1 or n/P, m/P]` of device `owner`'s queries against them (None without a mask).
    A mask split with the queries is redistributed once by an all-to-all (every device sends
    each other device its rows' columns of that device's keys), so no mask travels."""
    if msk is None:
        return lambda owner: None
    me = lax.axis_index(ring.axis)
    if not ring.split_mask:
        cols = lax.dynamic_slice_in_dim(msk, me * ml, ml, axis=-1)
        return lambda owner: cols
    nl = msk.shape[1]
    cols = lax.all_to_all(msk, ring.axis, split_axis=2, concat_axis=1, tiled=True)
    return lambda owner: lax.dynamic_slice_in_dim(cols, owner * nl, nl, axis=1)


def _block_backward(ring, owner, local, rows_in, grads):
    """Add the gradient shares of device `owner`'s queries (in hand, with their rows'
    `(q, lse, delta, g_out, g_lse)`) against this device's keys: to the queries' `dq` (which
    travels with them) and to this device's `dk`, `dv`."""
    k, v, b, keys_mask, dtype = local
    q, lse, delta, g_out, g_lse = rows_in
    dq, dbeta, dk, dv = grads
    me = lax.axis_index(ring.axis)
    nl, ml = q.shape[1], k.shape[1]
    msk = keys_mask(owner)
    for rows, keys, col, chunks in _pairs(ring, owner, me, nl, ml):
        qx, ky, vy = q[:, rows], k[:, keys], v[:, keys]
        mask = _pair_mask(msk, rows, col - me * ml, ky.shape[1])
        rows_x = tuple(x[:, rows] for x in (lse, delta, g_out, g_lse))

        def pair(diag, qx=qx, ky=ky, vy=vy, mask=mask, rows_x=rows_x):
            return _pair_backward(ring, qx, ky, vy, b, mask, rows_x, dtype, diag)

        if chunks is None:
            d = pair(False)
        else:
            zeros = tuple(varying(jnp.zeros(x.shape, dtype), ring.axis) for x in (qx, ky, vy, b))
            branches = [lambda zeros=zeros: zeros, lambda: pair(False), lambda: pair(True)]
            d = lax.switch(_relation(chunks), branches)
        dq = dq.at[:, rows].add(d[0])
        dk, dv = dk.at[:, keys].add(d[1]), dv.at[:, keys].add(d[2])
        dbeta = dbeta + d[3]
    return dq, dbeta, dk, dv


def _ring_backward(ring: Ring, residuals, cotangents):
    q, k, v, b, msk, out, lse = residuals
    dtype = lse.dtype
    g_out, g_lse = cotangents  # g_out in the dtype of the values, as `out`
    delta = jnp.sum(g_out.astype(dtype) * out.astype(dtype), axis=-1)
    me = lax.axis_index(ring.axis)
    local = (k, v, b.astype(dtype), _keys_mask(ring, msk, k.shape[1]), dtype)
    rows_in = (q, lse, delta, g_out, g_lse.astype(dtype))
    grads = tuple(varying(jnp.zeros(x.shape, dtype), ring.axis) for x in (q, b, k, v))

    def body(t, carry):
        rows_in, grads = carry
        sent = _shift(ring, *rows_in)  # on its way while this block is computed
        dq, dbeta, dk, dv = _block_backward(ring, (me - t) % ring.size, local, rows_in, grads)
        (dq,) = _shift(ring, dq)  # then its gradient, with this device's share
        return sent, (dq, dbeta, dk, dv)

    rows_in, grads = lax.fori_loop(0, ring.size - 1, body, (rows_in, grads))
    dq, dbeta, dk, dv = _block_backward(ring, (me + 1) % ring.size, local, rows_in, grads)
    (dq,) = _shift(ring, dq)  # home: each query block's gradient, complete
    return (
        dq.astype(q.dtype),
        dk.astype(k.dtype),
        dv.astype(v.dtype),
        dbeta.astype(residuals[3].dtype),
        None,
    )


def make_inert_per_device(ring: Ring, q, k, v, msk, m: int):
    """The engine's `make_masked_inert` per device, in the contiguous layout,
    where a query may see a key only some others see (a per-query `msk` `[1 or B, n/P, m]`, or
    causality): the non-finite queries, keys and values are zeroed, and `poison` `[B, n/P]`
    marks the queries one of them reaches. Every device learns which keys and values are
    non-finite by one all-reduce of `m` integers per batch element; with causality alone, by
    prefix maxima over them, so no `n/P x m` array is formed."""
    me = lax.axis_index(ring.axis)
    nl, ml = q.shape[1], k.shape[1]
    rows = me * nl + jnp.arange(nl)  # the sequence positions of this device's queries
    (q, k, v), (bad_q, bad_k, bad_v) = blockwise.inert_rows(q, k, v)
    flags = jnp.zeros((bad_k.shape[0], m), jnp.int32)
    flags = flags.at[:, me * ml + jnp.arange(ml)].set(2 * bad_k + bad_v)
    flags = lax.psum(flags, ring.axis)  # [B, m], in sequence order: 2 key, 1 value, 3 both
    bad_keys, bad_values = flags >= 2, flags % 2 == 1
    if msk is not None and msk.shape[1] == nl:  # per-query rows
        seen = msk
        if ring.causal:
            seen = seen & (jnp.arange(m)[None, :] <= rows[:, None])
        poison = blockwise.poison_codes(seen, bad_q, bad_keys, bad_values)
    else:  # causality with key padding (its unseen keys are zero already) or no mask
        codes = (2 * bad_keys + bad_values).astype(jnp.int8)
        reached = lax.cummax(codes, axis=1)[:, rows]
        sees = True if msk is None else (jnp.cumsum(msk[:, 0], axis=-1) > 0)[:, rows]
        poison = jnp.maximum(reached, 2 * (bad_q & sees).astype(jnp.int8))
    return q, k, v, poison


@ft.partial(jax.custom_vjp, nondiff_argnums=(0,))
def ring_core(ring: Ring, q, k, v, b, msk):
    """Per device: `(out, lse)` of its queries against all keys, `out` in the dtype of the
    values, `lse` in the compute dtype (at least float32)."""
    return _ring_forward(ring, q, k, v, b, msk)


def _ring_core_fwd(ring, q, k, v, b, msk):
    out, lse = _ring_forward(ring, q, k, v, b, msk)
    return (out, lse), (q, k, v, b, msk, out, lse)


ring_core.defvjp(_ring_core_fwd, _ring_backward)
