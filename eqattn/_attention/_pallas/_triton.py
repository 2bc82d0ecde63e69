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
def row_layout(x):
    """A row vector `[B, N]` (padded) in the kernels' layout: as it is."""
    return x


def row_values(x, n: int):
    """The first `n` rows' values of a row vector in the kernels' layout."""
    return x[:, :n]


# Triton launches at most 65535 programs along its second and third grid axes.
_MAX_MINOR_GRID = 65535


@dataclasses.dataclass(frozen=True)
class Tile:
    """One kernel's tile and launch: `block_q` queries x `block_k` keys (powers of two, at least
    16), `num_warps` warps and `num_stages` software-pipeline stages."""

    block_q: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 2


@dataclasses.dataclass(frozen=True)
class Blocks:
    """The three kernels' tiles: the forward, the `dk, dv` kernel (a program per key block) and
    the `dq` kernel (a program per query block)."""

    forward: Tile = Tile(128, 64)
    dkdv: Tile = Tile(64, 64)
    dq: Tile = Tile(64, 64)

    @classmethod
    def uniform(cls, block_q: int, block_k: int, num_warps: int = 4, num_stages: int = 2):
        """The same tile for all three kernels."""
        tile = Tile(block_q, block_k, num_warps, num_stages)
        return cls(tile, tile, tile)

    @property
    def multiples(self) -> tuple[int, int]:
        """What the numbers of queries and keys are padded to."""
        tiles = (self.forward, self.dkdv, self.dq)
        return max(t.block_q for t in tiles), max(t.block_k for t in tiles)


# The message of a refusal (see `refusal`), which the compile check recognises.
REFUSAL = "has no spill-free tiling"

# Tiles per (dtype, padded head size D) for the H100 (sm_90a), chosen by
# `benchmarks._sweep.choose_triton` from two sets of results. The compiler's:
# `python -m benchmarks compile --sweep --target h100` (`benchmarks/results/compile-sweep-h100.json`,
# 8 x 4,096 queries and keys): 54 forward tiles and 64 backward tiles (16 to 128 queries x keys,
# 4 or 8 warps, 1 to 3 stages) of each kernel compiled by ptxas for sm_90a, without a mask and
# with a per-query `[n, m]` mask. Only a tile free of register spills in both is a candidate; None
# marks a (dtype, D) where some kernel has none, refused before compiling (`refusal`): float32 at
# D = 256, whose dk/dv kernel spills in every tiling with a per-query mask (at least 2,524 bytes).
# Then the devices': where the `kernel` suite timed candidates on GPUs (`kernel-gpu-*.json`: an
# H100 and an H200, float32 and bfloat16 at D = 64 and 128, 4,096 queries and keys, no mask), the
# fastest (the least worst time over the devices); elsewhere (float16, other D), by the compiler's
# report alone: wgmma if a spill-free tile has it, then the most resident warps per SM, the
# largest tile, the fewest warps, then stages (not timed).
_H100: dict[tuple[str, int], Blocks | None] = {
    ("float32", 16): Blocks(Tile(128, 32, 8, 1), Tile(16, 64, 8, 1), Tile(64, 16, 8, 1)),
    ("float32", 32): Blocks(Tile(64, 32, 8, 1), Tile(16, 128, 8, 1), Tile(64, 16, 8, 1)),
    ("float32", 64): Blocks(Tile(128, 128, 8, 3), Tile(64, 64, 4, 2), Tile(64, 64, 4, 2)),
    ("float32", 128): Blocks(Tile(128, 64, 8, 2), Tile(16, 64, 8, 1), Tile(64, 32, 8, 1)),
    ("float32", 256): None,
    ("bfloat16", 16): Blocks(Tile(64, 32, 8, 1), Tile(16, 64, 8, 1), Tile(64, 16, 8, 1)),
    ("bfloat16", 32): Blocks(Tile(128, 32, 8, 1), Tile(64, 16, 4, 1), Tile(128, 16, 8, 1)),
    ("bfloat16", 64): Blocks(Tile(128, 64, 8, 3), Tile(64, 64, 4, 2), Tile(64, 64, 4, 2)),
    ("bfloat16", 128): Blocks(Tile(128, 64, 8, 3), Tile(128, 64, 8, 2), Tile(128, 64, 8, 2)),
    ("bfloat16", 256): Blocks(Tile(64, 128, 8, 1), Tile(128, 64, 8, 1), Tile(64, 64, 8, 2)),
    ("float16", 16): Blocks(Tile(64, 32, 8, 1), Tile(16, 64, 8, 1), Tile(64, 16, 8, 1)),
    ("float16", 32): Blocks(Tile(128, 32, 8, 1), Tile(64, 16, 4, 1), Tile(128, 16, 8, 1)),
    ("float16", 64): Blocks(Tile(64, 32, 8, 1), Tile(128, 16, 8, 2), Tile(64, 16, 8, 1)),
    ("float16", 128): Blocks(Tile(64, 64, 8, 1), Tile(64, 32, 8, 1), Tile(64, 32, 8, 2)),
    ("float16", 256): Blocks(Tile(64, 128, 8, 1), Tile(128, 64, 8, 1), Tile(64, 64, 8, 2)),
}


def default_blocks(n: int, m: int, d: int, dv: int, dtype, *, compiled: bool = True):
    """The tiles for these sizes from the H100 table (no larger than the padded sizes), or None
    where no tiling is spill-free and the kernels are `compiled` (interpreted, on CPU, any tile
    runs). Other NVIDIA GPUs take the same tiles."""
    width = _tile.pow2(max(d, dv))
    blocks = _H100.get((jnp.dtype(dtype).name, width), Blocks())
    if blocks is None:
        if compiled:
            return None
        blocks = Blocks()
    nq, nk = _tile.pow2(n), _tile.pow2(m)

    def clamp(t: Tile) -> Tile:
        return dataclasses.replace(t, block_q=min(t.block_q, nq), block_k=min(t.block_k, nk))

    return Blocks(clamp(blocks.forward), clamp(blocks.dkdv), clamp(blocks.dq))


def refusal(d: int, dv: int, dtype) -> str:
    """Why a configuration without a spill-free tiling is not compiled."""
    return (
        f"implementation='pallas' {REFUSAL} for {jnp.dtype(dtype).name} inputs with head sizes "
        f"d = {d}, dv = {dv} on NVIDIA GPUs (ptxas spills registers in every tiling tried); use "
        "implementation='chunked' (or 'xla'), or bfloat16/float16 inputs."
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


def _params(tile: Tile):
    return plgpu.CompilerParams(num_warps=tile.num_warps, num_stages=tile.num_stages)


def forward(q, k, v, beta, mask, *, blocks: Blocks, m_real, dtype, interpret: bool):
    """`(out [B, N, Dv] or None, lse [B, N])` of padded inputs (`v` None: the log-sum-exp only)."""
    B, N, D = q.shape
    M = k.shape[1]
    tile = blocks.forward
    bq = tile.block_q
    grid = _Grid(N // bq, B)
    Dv = None if v is None else v.shape[2]
    return pl.pallas_call(
        ft.partial(
            _forward_kernel,
            block_k=tile.block_k,
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
        compiler_params=_params(tile),
        interpret=interpret,
        name="eqattn_attention_forward",
    )(beta, q, k, v, mask)


def backward(q, k, v, beta, mask, do, lse2, delta, *, blocks: Blocks, m_real, dtype, interpret):
    """`(dq, dk, dv or None, dbeta)` of padded inputs; `lse2` is the base-2 log-sum-exp with
    -inf replaced by 0 and `delta` the row term (both `[B, N]`, padded with 0)."""
    B, N, D = q.shape
    M = k.shape[1]
    Dv = None if v is None else v.shape[2]
    per_query = _per_query(mask)
    args = (beta, q, k, v, mask, do, lse2, delta)

    def in_specs(grid, query_block: int | None, key_block: int | None):
        """A block of queries and all keys, or a block of keys and all queries."""
        if query_block is not None:
            queries, keys, nq, nk = grid.blocked, grid.whole, query_block, M
        else:
            queries, keys, nq, nk = grid.whole, grid.blocked, N, key_block
        return [
            grid.whole(()),
            queries((nq, D)),
            keys((nk, D)),
            None if v is None else keys((nk, Dv)),
            grid.mask(mask, query_block, key_block),
            None if v is None else queries((nq, Dv)),
            queries((nq,)),
            queries((nq,)),
        ]

    tile = blocks.dkdv
    grid = _Grid(M // tile.block_k, B)
    dk, dv = pl.pallas_call(
        ft.partial(
            _dkdv_kernel,
            block_q=tile.block_q,
            block_axis=grid.block_axis,
            m_real=m_real,
            per_query=per_query,
            dtype=dtype,
        ),
        grid=grid.shape,
        in_specs=in_specs(grid, None, tile.block_k),
        out_specs=[
            grid.blocked((tile.block_k, D)),
            None if v is None else grid.blocked((tile.block_k, Dv)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct(k.shape, k.dtype),
            None if v is None else jax.ShapeDtypeStruct(v.shape, v.dtype),
        ],
        compiler_params=_params(tile),
        interpret=interpret,
        name="eqattn_attention_dkdv",
    )(*args)

    tile = blocks.dq
    grid = _Grid(N // tile.block_q, B)
    dq, dbeta = pl.pallas_call(
        ft.partial(
            _dq_kernel, block_k=tile.block_k, m_real=m_real, per_query=per_query, dtype=dtype
        ),
        grid=grid.shape,
        in_specs=in_specs(grid, tile.block_q, None),
        out_specs=[grid.blocked((tile.block_q, D)), grid.blocked((tile.block_q,))],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((B, N), dtype)],
        compiler_params=_params(tile),
        interpret=interpret,
        name="eqattn_attention_dq",
    )(*args)
    return dq, dk, dv, jnp.sum(dbeta, axis=1)
