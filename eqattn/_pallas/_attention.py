r"""The fused kernel's contract: the core's flattened inputs in, `(out, lse)` out, with a custom
VJP whose backward takes cotangents of both and recomputes the weights block by block.

Inputs as the core's: `q [B, n, d]`, `k [B, m, d]`, `v [B, m, dv]` (one dtype), `beta [B]` and
`mask` `None` or boolean `[1 or B, 1 or n, m]`. Sizes are padded here (queries and keys to whole
blocks, features to a power of two, at least 16, with zeros) and the kernels mask the padding.
Memory is $O((n + m) d)$ forward and backward: no `n x m` array is formed outside the kernels'
tiles (a per-query mask, the caller's own `n x m` array, is read in tiles).

Which lowering runs is decided by the platform being compiled for (`jax.lax.platform_dependent`),
not by the default backend: Triton on CUDA GPUs, Pallas interpret mode on CPU (slow; for tests),
so that a model exported for GPUs from a CPU host carries the real kernel.
"""

from __future__ import annotations

import functools as ft
import math

import jax
import jax.numpy as jnp
from jax import lax

from . import _triton

LOG2E = math.log2(math.e)


def _pow2(x: int, least: int = 16) -> int:
    return max(least, 1 << max(0, int(x) - 1).bit_length())


def blocks_for(n: int, m: int, d: int, dv: int, dtype) -> _triton.Blocks:
    """Default tiles: FlashAttention-2's shapes, smaller for wide heads (whose tiles would spill
    registers), and no larger than the padded sizes themselves."""
    width = max(d, dv)
    wide = width > 128 or (width > 64 and jnp.dtype(dtype).itemsize >= 4)
    bq, bk = (64, 32) if wide else (128, 64)
    bq_bwd, bk_bwd = (32, 32) if wide else (64, 64)
    nq, nk = _pow2(n), _pow2(m)
    return _triton.Blocks(
        block_q=min(bq, nq),
        block_k=min(bk, nk),
        block_q_bwd=min(bq_bwd, nq),
        block_k_bwd=min(bk_bwd, nk),
        num_warps=4 if width <= 64 else 8,
        num_warps_bwd=4 if width <= 64 else 8,
        num_stages=2,
    )


def _pad(x, axis: int, size: int, value=0):
    pad = size - x.shape[axis]
    if pad == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths, constant_values=value)


class _Layout:
    """Padded sizes of one call."""

    def __init__(self, q, k, v, blocks: _triton.Blocks):
        (_, n, d), (_, m, dv) = q.shape, v.shape
        rows = max(blocks.block_q, blocks.block_q_bwd)
        cols = max(blocks.block_k, blocks.block_k_bwd)
        self.n, self.m, self.d, self.dv = n, m, d, dv
        self.N, self.M = -(-n // rows) * rows, -(-m // cols) * cols
        self.D, self.Dv = _pow2(d), (_pow2(dv) if dv else 0)
        self.m_real = m if self.M != m else None

    def inputs(self, q, k, v, mask):
        q = _pad(_pad(q, 1, self.N), 2, self.D)
        k = _pad(_pad(k, 1, self.M), 2, self.D)
        v = None if not self.dv else _pad(_pad(v, 1, self.M), 2, self.Dv)
        if mask is not None:
            mask = _pad(mask, 2, self.M, False)
            if mask.shape[1] != 1:
                mask = _pad(mask, 1, self.N, False)
        return q, k, v, mask


def _compute_dtype(dtype):
    return jnp.promote_types(dtype, jnp.float32)


def _run(fn, *args, **kwargs):
    """`fn(*args, interpret=...)`, interpreted on CPU and compiled with Triton on CUDA GPUs."""
    return lax.platform_dependent(
        *args,
        cpu=ft.partial(fn, **kwargs, interpret=True),
        cuda=ft.partial(fn, **kwargs, interpret=False),
    )


def _forward(q, k, v, beta, mask, blocks):
    B = q.shape[0]
    dtype = _compute_dtype(q.dtype)
    if blocks is None:
        blocks = blocks_for(q.shape[1], k.shape[1], q.shape[2], v.shape[2], q.dtype)
    lay = _Layout(q, k, v, blocks)
    if lay.n == 0 or lay.m == 0:
        out = jnp.zeros((B, lay.n, lay.dv), dtype)
        return out, jnp.full((B, lay.n), -jnp.inf, dtype)
    qp, kp, vp, mp = lay.inputs(q, k, v, mask)
    fn = ft.partial(_triton.forward, blocks=blocks, m_real=lay.m_real, dtype=dtype)
    out, lse = _first_order(ft.partial(_run, fn))(qp, kp, vp, beta.astype(dtype), mp)
    lse = lse[:, : lay.n]
    out = jnp.zeros((B, lay.n, 0), v.dtype) if out is None else out[:, : lay.n, : lay.dv]
    return out, lse


def _first_order(fn):
    """`fn` with a derivative rule that says, instead of failing obscurely inside Pallas, that
    the kernel's backward pass is not differentiable itself."""

    @jax.custom_vjp
    def wrapped(*args):
        return fn(*args)

    def no_second_order(res, cotangents):
        raise NotImplementedError(
            "implementation='pallas' supports first-order reverse-mode differentiation only "
            "(grad, vjp); for higher orders use implementation='xla' or 'chunked'."
        )

    wrapped.defvjp(lambda *args: (fn(*args), None), no_second_order)
    return wrapped


@ft.partial(jax.custom_vjp, nondiff_argnums=(5,))
def attention_core(q, k, v, beta, mask, blocks=None):
    """`(out, lse)` in the dtype of `v`, computed by the fused kernel."""
    out, lse = _forward(q, k, v, beta, mask, blocks)
    return out.astype(v.dtype), lse.astype(v.dtype)


def _core_fwd(q, k, v, beta, mask, blocks):
    out, lse = _forward(q, k, v, beta, mask, blocks)
    return (out.astype(v.dtype), lse.astype(v.dtype)), (q, k, v, beta, mask, out, lse)


def _core_bwd(blocks, res, cotangents):
    q, k, v, beta, mask, out, lse = res
    g_out, g_lse = cotangents
    dtype = lse.dtype
    if blocks is None:
        blocks = blocks_for(q.shape[1], k.shape[1], q.shape[2], v.shape[2], q.dtype)
    lay = _Layout(q, k, v, blocks)
    if lay.n == 0 or lay.m == 0:
        return jnp.zeros_like(q), jnp.zeros_like(k), jnp.zeros_like(v), jnp.zeros_like(beta), None
    # The row term: dot(g_out, out) - g_lse (the log-sum-exp's cotangent shifts it). A query with
    # no key gets lse2 = 0; its weights are exp2(-inf) = 0 whatever the shift.
    delta = jnp.sum(g_out.astype(dtype) * out.astype(dtype), axis=-1) - g_lse.astype(dtype)
    lse2 = jnp.where(jnp.isfinite(lse), lse * LOG2E, 0.0)
    qp, kp, vp, mp = lay.inputs(q, k, v, mask)
    do = None if vp is None else _pad(_pad(g_out.astype(v.dtype), 1, lay.N), 2, lay.Dv)
    fn = ft.partial(
        _run, ft.partial(_triton.backward, blocks=blocks, m_real=lay.m_real, dtype=dtype)
    )
    dq, dk, dv, dbeta = _first_order(fn)(
        qp, kp, vp, beta.astype(dtype), mp, do, _pad(lse2, 1, lay.N), _pad(delta, 1, lay.N)
    )
    dq = dq[:, : lay.n, : lay.d]
    dk = dk[:, : lay.m, : lay.d]
    dv = jnp.zeros_like(v) if dv is None else dv[:, : lay.m, : lay.dv]
    return dq, dk, dv, dbeta.astype(beta.dtype), None


attention_core.defvjp(_core_fwd, _core_bwd)
