r"""The same kernels for TPUs, lowered through Mosaic.

The GPU kernels loop over blocks inside a program; on a TPU the loop is the grid's last axis
(sequential, "arbitrary"), Pallas pipelines the blocks into VMEM, and the running statistics and
accumulators live in VMEM scratch between grid steps (the layout of jax's own TPU flash
attention). Grids: forward and `dq` over (batch element, query block, key block), `dk, dv` over
(batch element, key block, query block).

TPU layouts: blocks from `default_blocks`'s table (or the whole, smaller, padded size); per-row
statistics, inside a kernel, as `[rows, 128]` with the value repeated along the lanes (how Mosaic
lays out a column best); in memory lane-dense, `[B, 1, N]`: the log-sum-exp
comes out, the backward's row vectors go in, and `d beta`'s shares come out so, converted at the
kernels' edges by `_to_row` and `_to_column` (1/128 of the memory the repeated layout
took, `[B, N, 128]` float32, in a ring of long sequences: see `benchmarks/results/ring-*`);
`beta` in SMEM. The tile math is `_tile`'s, the same as on GPUs.
"""

from __future__ import annotations

import dataclasses
import functools as ft

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from . import _tile

LANES = 128


@dataclasses.dataclass(frozen=True)
class Blocks:
    """Tile sizes: multiples of 128, or the whole padded size when that is smaller."""

    block_q: int = 128
    block_k: int = 128

    @property
    def multiples(self) -> tuple[int, int]:
        """What the numbers of queries and keys are padded to."""
        return self.block_q, self.block_k


# Blocks per (dtype, padded head size D), chosen by `python -m benchmarks compile --sweep
# --target v5e` (results in `benchmarks/results/compile-sweep-v5e.json`): of the blocks of
# 128, 256 and 512 queries and keys compiled by Mosaic for a v5e, the largest (queries x keys)
# whose every kernel needs at most a quarter of the scoped VMEM of the generations with the
# least (16 MiB: v4, v5e), so one table serves every generation and leaves room for XLA's own
# scoped buffers. Compiling tells VMEM, not speed: these blocks are not timed.
_TABLE = {("float32", 256): Blocks(512, 256), ("bfloat16", 256): Blocks(256, 512)}
_LARGEST = Blocks(512, 512)


def default_blocks(n: int, m: int, d: int, dv: int, dtype, *, compiled: bool = True) -> Blocks:
    """The table's blocks for these sizes, or the whole (padded) sizes below them."""
    del compiled  # every configuration has blocks within VMEM
    width = _tile.pow2(max(d, dv))
    blocks = _TABLE.get((jnp.dtype(dtype).name, width), _LARGEST)
    return Blocks(min(blocks.block_q, _tile.pow2(n)), min(blocks.block_k, _tile.pow2(m)))


def row_layout(x):
    """A row vector `[B, N]` (padded) in the kernels' layout: `[B, 1, N]`."""
    return x[:, None, :]


def row_values(x, n: int):
    """The first `n` rows' values of a row vector in the kernels' layout."""
    return x[:, 0, :n]


def _row_spec(block_q: int, index):
    """Lane-dense row-vector blocks `[1, block_q]`; `index(*grid) -> (b, query block)`."""
    return pl.BlockSpec((None, 1, block_q), lambda *g: (index(*g)[0], 0, index(*g)[1]))


def _diagonal(size: int):
    shape = (size, size)
    return lax.broadcasted_iota(jnp.int32, shape, 0) == lax.broadcasted_iota(jnp.int32, shape, 1)


def _to_row(stat):
    """A per-row statistic `[rows, LANES]` (repeated along the lanes) as one lane-dense row
    `[1, rows]`: per square of up to `LANES` rows, its diagonal, by a select and a sum over the
    sublanes (no transpose; what is not selected adds an exact 0)."""
    rows = stat.shape[0]
    w = min(rows, LANES)
    eye = _diagonal(w)
    pieces = [
        jnp.sum(jnp.where(eye, stat[c : c + w, :w], 0.0), axis=0, keepdims=True)
        for c in range(0, rows, w)
    ]
    return pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces, axis=1)


def _to_column(row):
    """`_to_row`'s inverse: a lane-dense row `[1, rows]` as `[rows, LANES]`, each row's value
    repeated along the lanes."""
    rows = row.shape[1]
    w = min(rows, LANES)
    eye = _diagonal(w)
    pieces = []
    for c in range(0, rows, w):
        square = jnp.broadcast_to(row[:, c : c + w], (w, w))
        column = jnp.sum(jnp.where(eye, square, 0.0), axis=1, keepdims=True)
        pieces.append(jnp.broadcast_to(column, (w, LANES)))
    return pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces, axis=0)


def _params():
    return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"))


def _beta_spec():
    return pl.BlockSpec(memory_space=pltpu.SMEM)


def _mask_spec(mask, rows: int, cols: int, index):
    """`[1 or B, 1 or N, M]` mask tiles; `index(b, i, j)` gives (batch, query block, key block)."""
    if mask is None:
        return None
    shared, per_query = mask.shape[0] == 1, mask.shape[1] != 1

    def at(*grid):
        b, i, j = index(*grid)
        return (0 if shared else b, i if per_query else 0, j)

    return pl.BlockSpec((None, rows if per_query else 1, cols), at)


def _forward_kernel(
    beta_ref,
    q_ref,
    k_ref,
    v_ref,
    mask_ref,
    out_ref,
    lse_ref,
    max_ref,
    total_ref,
    *acc,
    m_real,
    dtype,
):
    acc_ref = acc[0] if acc else None  # no values: no accumulator
    b, j = pl.program_id(0), pl.program_id(2)
    block_q, block_k = q_ref.shape[0], k_ref.shape[0]

    @pl.when(j == 0)
    def _():
        max_ref[...] = jnp.full(max_ref.shape, -jnp.inf, max_ref.dtype)
        total_ref[...] = jnp.zeros(total_ref.shape, total_ref.dtype)
        if acc_ref is not None:
            acc_ref[...] = jnp.zeros(acc_ref.shape, acc_ref.dtype)

    scale = beta_ref[b].astype(dtype) * _tile.LOG2E
    tile = None if mask_ref is None else mask_ref[...]
    ok = _tile.allowed(tile, (block_q, block_k), j * block_k, m_real)
    s = _tile.logits(q_ref[...], k_ref[...], scale, ok, dtype)
    state = (max_ref[...], total_ref[...], None if acc_ref is None else acc_ref[...])
    row_max, total, acc = _tile.softmax_step(s, state, None if v_ref is None else v_ref[...], dtype)
    max_ref[...], total_ref[...] = row_max, total
    if acc_ref is not None:
        acc_ref[...] = acc

    @pl.when(j == pl.num_programs(2) - 1)
    def _():
        out, lse = _tile.softmax_result((row_max, total, acc))
        lse_ref[...] = _to_row(lse)
        if out_ref is not None:
            out_ref[...] = out.astype(out_ref.dtype)


def forward(q, k, v, beta, mask, *, blocks: Blocks, m_real, dtype, interpret: bool):
    """`(out [B, N, Dv] or None, lse)` of padded inputs (`lse` lane-dense, see `row_layout`)."""
    B, N, D = q.shape
    M = k.shape[1]
    bq, bk = blocks.block_q, blocks.block_k
    Dv = None if v is None else v.shape[2]

    def query_block(cols):
        return pl.BlockSpec((None, bq, cols), lambda b, i, j: (b, i, 0))

    def key_block(cols):
        return pl.BlockSpec((None, bk, cols), lambda b, i, j: (b, j, 0))

    scratch = [pltpu.VMEM((bq, LANES), dtype), pltpu.VMEM((bq, LANES), dtype)]
    scratch += [] if v is None else [pltpu.VMEM((bq, v.shape[2]), dtype)]
    return pl.pallas_call(
        ft.partial(_forward_kernel, m_real=m_real, dtype=dtype),
        grid=(B, N // bq, M // bk),
        in_specs=[
            _beta_spec(),
            query_block(D),
            key_block(D),
            None if v is None else key_block(Dv),
            _mask_spec(mask, bq, bk, lambda b, i, j: (b, i, j)),
        ],
        out_specs=[None if v is None else query_block(Dv), _row_spec(bq, lambda b, i, j: (b, i))],
        out_shape=[
            None if v is None else jax.ShapeDtypeStruct((B, N, Dv), v.dtype),
            jax.ShapeDtypeStruct((B, 1, N), dtype),
        ],
        scratch_shapes=scratch,
        compiler_params=_params(),
        interpret=interpret,
        name="eqattn_attention_forward",
    )(beta, q, k, v, mask)


def _dkdv_kernel(
    beta_ref,
    q_ref,
    k_ref,
    v_ref,
    mask_ref,
    do_ref,
    lse2_ref,
    delta_ref,
    dk_ref,
    dv_ref,
    dk_acc,
    *dv_acc,
    m_real,
    dtype,
):
    dv_acc = dv_acc[0] if dv_acc else None  # no values: no accumulator
    b, j, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    block_q, block_k = q_ref.shape[0], k_ref.shape[0]

    @pl.when(i == 0)
    def _():
        dk_acc[...] = jnp.zeros(dk_acc.shape, dk_acc.dtype)
        if dv_acc is not None:
            dv_acc[...] = jnp.zeros(dv_acc.shape, dv_acc.dtype)

    beta = beta_ref[b].astype(dtype)
    q = q_ref[...]
    v = None if v_ref is None else v_ref[...]
    do = None if do_ref is None else do_ref[...]
    tile = None if mask_ref is None else mask_ref[...]
    ok = _tile.allowed(tile, (block_q, block_k), j * block_k, m_real)
    lse2, delta = (_to_column(r[...]) for r in (lse2_ref, delta_ref))
    p, ds = _tile.score_cotangent(q, k_ref[...], v, do, beta * _tile.LOG2E, ok, lse2, delta, dtype)
    if v is not None:
        dv_acc[...] += _tile.dot_tn(p, do, dtype)
    dk_acc[...] += _tile.dot_tn(ds, q, dtype)

    @pl.when(i == pl.num_programs(2) - 1)
    def _():
        dk_ref[...] = (beta * dk_acc[...]).astype(dk_ref.dtype)
        if dv_ref is not None:
            dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)


def _dq_kernel(
    beta_ref,
    q_ref,
    k_ref,
    v_ref,
    mask_ref,
    do_ref,
    lse2_ref,
    delta_ref,
    dq_ref,
    dbeta_ref,
    dq_acc,
    *,
    m_real,
    dtype,
):
    b, j = pl.program_id(0), pl.program_id(2)
    block_q, block_k = q_ref.shape[0], k_ref.shape[0]

    @pl.when(j == 0)
    def _():
        dq_acc[...] = jnp.zeros(dq_acc.shape, dq_acc.dtype)

    beta = beta_ref[b].astype(dtype)
    k = k_ref[...]
    v = None if v_ref is None else v_ref[...]
    do = None if do_ref is None else do_ref[...]
    tile = None if mask_ref is None else mask_ref[...]
    ok = _tile.allowed(tile, (block_q, block_k), j * block_k, m_real)
    lse2, delta = (_to_column(r[...]) for r in (lse2_ref, delta_ref))
    _, ds = _tile.score_cotangent(q_ref[...], k, v, do, beta * _tile.LOG2E, ok, lse2, delta, dtype)
    dq_acc[...] += _tile.dot(ds.astype(k.dtype), k, dtype)

    @pl.when(j == pl.num_programs(2) - 1)
    def _():
        dq = dq_acc[...]
        dq_ref[...] = (beta * dq).astype(dq_ref.dtype)
        # d(beta) = sum_i q_i . (ds k)_i: each row's share, lane-dense like the other row vectors
        share = jnp.sum(q_ref[...].astype(dtype) * dq, axis=1, keepdims=True)
        dbeta_ref[...] = _to_row(jnp.broadcast_to(share, (block_q, LANES)))


def backward(q, k, v, beta, mask, do, lse2, delta, *, blocks: Blocks, m_real, dtype, interpret):
    """`(dq, dk, dv or None, dbeta)` of padded inputs; `lse2` and `delta` lane-dense (see
    `row_layout`)."""
    B, N, D = q.shape
    M = k.shape[1]
    bq, bk = blocks.block_q, blocks.block_k
    Dv = None if v is None else v.shape[2]
    args = (beta, q, k, v, mask, do, lse2, delta)

    def in_specs(index):
        """`index(*grid) -> (b, query block, key block)`."""

        def queries(cols):
            return pl.BlockSpec((None, bq, cols), lambda *g: (index(*g)[0], index(*g)[1], 0))

        def keys(cols):
            return pl.BlockSpec((None, bk, cols), lambda *g: (index(*g)[0], index(*g)[2], 0))

        specs = [_beta_spec(), queries(D), keys(D), None if v is None else keys(Dv)]
        specs.append(_mask_spec(mask, bq, bk, index))
        rows = _row_spec(bq, lambda *g: index(*g)[:2])
        specs += [None if v is None else queries(Dv), rows, rows]
        return specs, queries, keys

    specs, _, keys = in_specs(lambda b, j, i: (b, i, j))
    dv_acc = [] if v is None else [pltpu.VMEM((bk, v.shape[2]), dtype)]
    dk, dv = pl.pallas_call(
        ft.partial(_dkdv_kernel, m_real=m_real, dtype=dtype),
        grid=(B, M // bk, N // bq),
        in_specs=specs,
        out_specs=[keys(D), None if v is None else keys(Dv)],
        out_shape=[
            jax.ShapeDtypeStruct(k.shape, k.dtype),
            None if v is None else jax.ShapeDtypeStruct(v.shape, v.dtype),
        ],
        scratch_shapes=[pltpu.VMEM((bk, D), dtype), *dv_acc],
        compiler_params=_params(),
        interpret=interpret,
        name="eqattn_attention_dkdv",
    )(*args)

    specs, queries, _ = in_specs(lambda b, i, j: (b, i, j))
    dq, dbeta = pl.pallas_call(
        ft.partial(_dq_kernel, m_real=m_real, dtype=dtype),
        grid=(B, N // bq, M // bk),
        in_specs=specs,
        out_specs=[queries(D), _row_spec(bq, lambda b, i, j: (b, i))],
        out_shape=[
            jax.ShapeDtypeStruct(q.shape, q.dtype),
            jax.ShapeDtypeStruct((B, 1, N), dtype),
        ],
        scratch_shapes=[pltpu.VMEM((bq, D), dtype)],
        compiler_params=_params(),
        interpret=interpret,
        name="eqattn_attention_dq",
    )(*args)
    return dq, dk, dv, jnp.sum(dbeta[:, 0], axis=1)
