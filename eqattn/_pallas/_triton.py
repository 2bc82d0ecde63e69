r"""FlashAttention-2-style kernels in Pallas, lowered through Triton on NVIDIA GPUs.

Three `pallas_call`s on padded, flattened inputs: `q [B, N, D]`, `k [B, M, D]`, `v [B, M, Dv]`
(`N`, `M` multiples of the blocks; `D`, `Dv` powers of two, zero-padded), `beta [B]` and an
optional boolean `mask [1 or B, N, M]` or `[1 or B, 1, M]` (one row shared by every query):

- forward, one program per (query block, batch element): a loop over key blocks keeps the running
  row maximum, sum of exponentials and weighted sum of values (the online softmax), then writes
  `out` and the log-sum-exp;
- `dk, dv`, one program per (key block, batch element): a loop over query blocks;
- `dq` and each query's share of $\bar\beta$, one program per (query block, batch element): a loop
  over key blocks.

The tile math is `_tile`'s. Matmuls take the inputs' dtype and accumulate in float32 (float64 for
float64 inputs, in interpret mode); the softmax runs in that dtype too.
"""

from __future__ import annotations

import dataclasses
import functools as ft

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from . import _tile

# Per-row statistics are columns `[rows, 1]`; row vectors go in and out as `[B, N]`.
LANES = 1
# Triton launches at most 65535 programs along its second and third grid axes.
_MAX_MINOR_GRID = 65535


@dataclasses.dataclass(frozen=True)
class Blocks:
    """Tile sizes (powers of two, at least 16) and launch parameters of the three kernels."""

    block_q: int = 128
    block_k: int = 64
    block_q_bwd: int = 64
    block_k_bwd: int = 64
    num_warps: int = 4
    num_warps_bwd: int = 4
    num_stages: int = 2

    @property
    def multiples(self) -> tuple[int, int]:
        """What the numbers of queries and keys are padded to."""
        return max(self.block_q, self.block_q_bwd), max(self.block_k, self.block_k_bwd)


def _rows_for(budget_bytes: int, width: int, itemsize: int, cap: int) -> int:
    """The most rows (a power of two in [16, cap]) of a `[rows, width]` tile within a budget."""
    rows = budget_bytes // (width * itemsize)
    return max(16, min(cap, 1 << max(0, rows.bit_length() - 1)))


def default_blocks(n: int, m: int, d: int, dv: int, dtype) -> Blocks:
    """FlashAttention-2's tile shapes (128 queries x 64 keys forward, 64 x 64 backward) for
    heads up to 64 features of 2 bytes, shrunk so that a query tile stays within 32 KB and a key
    tile within 16 KB as heads widen (wide tiles spill registers and shared memory), and no
    larger than the padded sizes themselves. Not yet tuned on a GPU."""
    width, size = _tile.pow2(max(d, dv)), jnp.dtype(dtype).itemsize
    nq, nk = _tile.pow2(n), _tile.pow2(m)
    warps = 4 if width * size <= 128 else 8
    return Blocks(
        block_q=min(nq, _rows_for(32 << 10, width, size, 128)),
        block_k=min(nk, _rows_for(16 << 10, width, size, 64)),
        block_q_bwd=min(nq, _rows_for(16 << 10, width, size, 64)),
        block_k_bwd=min(nk, _rows_for(16 << 10, width, size, 64)),
        num_warps=warps,
        num_warps_bwd=warps,
        num_stages=2,
    )


def _mask_tile(mask_ref, rows, cols, per_query):
    if mask_ref is None:
        return None
    return mask_ref[rows, cols] if per_query else mask_ref[cols][None, :]


def _column(ref, rows=slice(None)):
    """A `[N]` row vector's block as a `[rows, 1]` column."""
    return ref[rows][:, None]


# --- kernels ------------------------------------------------------------------------------------


def _forward_kernel(
    beta_ref, q_ref, k_ref, v_ref, mask_ref, out_ref, lse_ref, *, block_k, m_real, per_query, dtype
):
    block_q = q_ref.shape[0]
    q = q_ref[...]
    scale = beta_ref[...].astype(dtype) * _tile.LOG2E

    def body(j, state):
        cols = pl.ds(pl.multiple_of(j * block_k, block_k), block_k)
        tile = _mask_tile(mask_ref, slice(None), cols, per_query)
        ok = _tile.allowed(tile, (block_q, block_k), j * block_k, m_real)
        s = _tile.logits(q, k_ref[cols, :], scale, ok, dtype)
        return _tile.softmax_step(s, state, None if v_ref is None else v_ref[cols, :], dtype)

    dv = None if v_ref is None else v_ref.shape[1]
    state = _tile.softmax_init(block_q, 1, dv, dtype)
    state = lax.fori_loop(0, k_ref.shape[0] // block_k, body, state)
    out, lse = _tile.softmax_result(state)
    lse_ref[...] = jnp.squeeze(lse, 1)
    if out_ref is not None:
        out_ref[...] = out.astype(out_ref.dtype)


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
    *,
    block_q,
    block_axis,
    m_real,
    per_query,
    dtype,
):
    block_k = k_ref.shape[0]
    k_start = pl.program_id(block_axis) * block_k
    k = k_ref[...]
    v = None if v_ref is None else v_ref[...]
    beta = beta_ref[...].astype(dtype)
    scale = beta * _tile.LOG2E

    def body(i, carry):
        dk, dv = carry
        rows = pl.ds(pl.multiple_of(i * block_q, block_q), block_q)
        q = q_ref[rows, :]
        do = None if do_ref is None else do_ref[rows, :]
        tile = _mask_tile(mask_ref, rows, slice(None), per_query)
        ok = _tile.allowed(tile, (block_q, block_k), k_start, m_real)
        lse2, delta = _column(lse2_ref, rows), _column(delta_ref, rows)
        p, ds = _tile.score_cotangent(q, k, v, do, scale, ok, lse2, delta, dtype)
        if v is not None:
            dv = dv + _tile.dot_tn(p, do, dtype)
        return dk + _tile.dot_tn(ds, q, dtype), dv

    dv = None if v is None else jnp.zeros(v.shape, dtype)
    dk, dv = lax.fori_loop(0, q_ref.shape[0] // block_q, body, (jnp.zeros(k.shape, dtype), dv))
    dk_ref[...] = (beta * dk).astype(dk_ref.dtype)
    if dv_ref is not None:
        dv_ref[...] = dv.astype(dv_ref.dtype)


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
    *,
    block_k,
    m_real,
    per_query,
    dtype,
):
    block_q = q_ref.shape[0]
    q = q_ref[...]
    do = None if do_ref is None else do_ref[...]
    lse2, delta = _column(lse2_ref), _column(delta_ref)
    beta = beta_ref[...].astype(dtype)
    scale = beta * _tile.LOG2E

    def body(j, dq):
        cols = pl.ds(pl.multiple_of(j * block_k, block_k), block_k)
        k = k_ref[cols, :]
        v = None if v_ref is None else v_ref[cols, :]
        tile = _mask_tile(mask_ref, slice(None), cols, per_query)
        ok = _tile.allowed(tile, (block_q, block_k), j * block_k, m_real)
        _, ds = _tile.score_cotangent(q, k, v, do, scale, ok, lse2, delta, dtype)
        return dq + _tile.dot(ds.astype(k.dtype), k, dtype)

    dq = lax.fori_loop(0, k_ref.shape[0] // block_k, body, jnp.zeros(q.shape, dtype))
    dq_ref[...] = (beta * dq).astype(dq_ref.dtype)
    # d(beta) = sum_ij ds_ij q_i . k_j = sum_i q_i . (ds k)_i: O(n d), not O(n m).
    dbeta_ref[...] = jnp.sum(q.astype(dtype) * dq, axis=1)


# --- launches -----------------------------------------------------------------------------------


class _Grid:
    """A launch grid over (block, batch element) and BlockSpecs of `[B, ...]` arrays on it.

    Blocks go on the first axis (neighbouring programs then share keys and values in the cache)
    unless the batch is too large for Triton's second axis.
    """

    def __init__(self, blocks: int, batch: int):
        self.block_axis = 0 if batch <= _MAX_MINOR_GRID else 1
        self.shape = (blocks, batch) if self.block_axis == 0 else (batch, blocks)

    def _ids(self, *grid):
        return grid[self.block_axis], grid[1 - self.block_axis]

    def blocked(self, shape):
        """This program's block along the first axis after the batch; the rest whole."""
        rest = (0,) * (len(shape) - 1)
        return pl.BlockSpec((None, *shape), lambda *g: (self._ids(*g)[1], self._ids(*g)[0], *rest))

    def whole(self, shape):
        """This program's batch element, whole."""
        return pl.BlockSpec((None, *shape), lambda *g: (self._ids(*g)[1], *(0,) * len(shape)))

    def mask(self, mask, rows: int | None, cols: int | None):
        """A `[1 or B, 1 or N, M]` mask in blocks of `rows` queries or `cols` keys (None: all)."""
        if mask is None:
            return None
        _, N, M = mask.shape
        shared = mask.shape[0] == 1

        def index(*grid):
            block, b = self._ids(*grid)
            return (0 if shared else b, 0 if rows is None else block, 0 if cols is None else block)

        cols_shape = M if cols is None else cols
        if N == 1:  # one row for every query: squeezed
            return pl.BlockSpec((None, None, cols_shape), index)
        return pl.BlockSpec((None, N if rows is None else rows, cols_shape), index)


def _per_query(mask) -> bool:
    return mask is not None and mask.shape[1] != 1


def forward(q, k, v, beta, mask, *, blocks: Blocks, m_real, dtype, interpret: bool):
    """`(out [B, N, Dv] or None, lse [B, N])` of padded inputs (`v` None: the log-sum-exp only)."""
    B, N, D = q.shape
    M = k.shape[1]
    bq = blocks.block_q
    grid = _Grid(N // bq, B)
    Dv = None if v is None else v.shape[2]
    return pl.pallas_call(
        ft.partial(
            _forward_kernel,
            block_k=blocks.block_k,
            m_real=m_real,
            per_query=_per_query(mask),
            dtype=dtype,
        ),
        grid=grid.shape,
        in_specs=[
            grid.whole(()),
            grid.blocked((bq, D)),
            grid.whole((M, D)),
            None if v is None else grid.whole((M, Dv)),
            grid.mask(mask, bq, None),
        ],
        out_specs=[None if v is None else grid.blocked((bq, Dv)), grid.blocked((bq,))],
        out_shape=[
            None if v is None else jax.ShapeDtypeStruct((B, N, Dv), v.dtype),
            jax.ShapeDtypeStruct((B, N), dtype),
        ],
        compiler_params=plgpu.CompilerParams(
            num_warps=blocks.num_warps, num_stages=blocks.num_stages
        ),
        interpret=interpret,
        name="eqattn_attention_forward",
    )(beta, q, k, v, mask)


def backward(q, k, v, beta, mask, do, lse2, delta, *, blocks: Blocks, m_real, dtype, interpret):
    """`(dq, dk, dv or None, dbeta)` of padded inputs; `lse2` is the base-2 log-sum-exp with
    -inf replaced by 0 and `delta` the row term (both `[B, N]`, padded with 0)."""
    B, N, D = q.shape
    M = k.shape[1]
    bq, bk = blocks.block_q_bwd, blocks.block_k_bwd
    Dv = None if v is None else v.shape[2]
    params = plgpu.CompilerParams(num_warps=blocks.num_warps_bwd, num_stages=blocks.num_stages)
    per_query = _per_query(mask)
    args = (beta, q, k, v, mask, do, lse2, delta)

    def in_specs(grid, query_block: bool):
        """A block of queries and all keys, or a block of keys and all queries."""
        if query_block:
            queries, keys, nq, nk = grid.blocked, grid.whole, bq, M
        else:
            queries, keys, nq, nk = grid.whole, grid.blocked, N, bk
        return [
            grid.whole(()),
            queries((nq, D)),
            keys((nk, D)),
            None if v is None else keys((nk, Dv)),
            grid.mask(mask, bq, None) if query_block else grid.mask(mask, None, bk),
            None if v is None else queries((nq, Dv)),
            queries((nq,)),
            queries((nq,)),
        ]

    grid = _Grid(M // bk, B)
    dk, dv = pl.pallas_call(
        ft.partial(
            _dkdv_kernel,
            block_q=bq,
            block_axis=grid.block_axis,
            m_real=m_real,
            per_query=per_query,
            dtype=dtype,
        ),
        grid=grid.shape,
        in_specs=in_specs(grid, query_block=False),
        out_specs=[grid.blocked((bk, D)), None if v is None else grid.blocked((bk, Dv))],
        out_shape=[
            jax.ShapeDtypeStruct(k.shape, k.dtype),
            None if v is None else jax.ShapeDtypeStruct(v.shape, v.dtype),
        ],
        compiler_params=params,
        interpret=interpret,
        name="eqattn_attention_dkdv",
    )(*args)

    grid = _Grid(N // bq, B)
    dq, dbeta = pl.pallas_call(
        ft.partial(_dq_kernel, block_k=bk, m_real=m_real, per_query=per_query, dtype=dtype),
        grid=grid.shape,
        in_specs=in_specs(grid, query_block=True),
        out_specs=[grid.blocked((bq, D)), grid.blocked((bq,))],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((B, N), dtype)],
        compiler_params=params,
        interpret=interpret,
        name="eqattn_attention_dq",
    )(*args)
    return dq, dk, dv, jnp.sum(dbeta, axis=1)
