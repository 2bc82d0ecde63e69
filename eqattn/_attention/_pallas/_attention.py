r"""The fused kernel's contract: the core's flattened inputs in, `(out, lse)` out, with a custom
VJP whose backward takes cotangents of both and recomputes the weights block by block.

Inputs as the core's: `q [B, n, d]`, `k [B, m, d]`, `v [B, m, dv]` (one dtype), `beta [B]` and
`mask` `None` or boolean `[1 or B, 1 or n, m]`. Sizes are padded here (queries and keys to whole
blocks, features to a power of two, at least 16, with zeros) and the kernels mask the padding.
Memory is $O((n + m) d)$ forward and backward: no `n x m` array is formed outside the kernels'
tiles (a per-query mask, the caller's own `n x m` array, is read in tiles).

Which kernels run is decided by the platform being compiled for (`jax.lax.platform_dependent`),
not by the default backend: Triton's on CUDA GPUs, Mosaic's on TPUs, and on CPU the Triton ones
in Pallas interpret mode (slow; for tests). So a model exported for GPUs from a CPU host carries
the real kernel.
"""

from __future__ import annotations

import dataclasses
import functools as ft
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.core import ShapedArray
from jax.extend.core import Primitive
from jax.interpreters import mlir
from jaxtyping import Array, Bool, Float

from .. import _xla
from .._plan import Tiling, core_path
from . import _mosaic, _tile, _triton

_KERNELS = {"triton": _triton, "mosaic": _mosaic}


@dataclasses.dataclass(frozen=True)
class Config:
    """Static settings: tile sizes per backend (None: by the shapes) and which kernels CPU
    interprets (`"triton"`, or `"mosaic"` to test the TPU ones)."""

    triton: _triton.Blocks | None = None
    mosaic: _mosaic.Blocks | None = None
    interpret: str = "triton"


def _pad(x, axis: int, size: int, value=0):
    pad = size - x.shape[axis]
    if pad == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths, constant_values=value)


@dataclasses.dataclass(frozen=True)
class _Layout:
    """One call's real and padded sizes, and its kernels and blocks."""

    kernels: object
    blocks: Any
    n: int
    m: int
    d: int
    dv: int

    @classmethod
    def of(cls, name: str, config: Config, q, v, interpret: bool):
        (_, n, d), (_, m, dv) = q.shape, v.shape
        kernels = _KERNELS[name]
        blocks = getattr(config, name)
        if blocks is None:
            blocks = kernels.default_blocks(n, m, d, dv, q.dtype, compiled=not interpret)
        if blocks is None:
            raise _Refused(kernels.refusal(d, dv, q.dtype))
        return cls(kernels, blocks, n, m, d, dv)

    @property
    def N(self) -> int:
        rows = self.blocks.multiples[0]
        return -(-self.n // rows) * rows

    @property
    def M(self) -> int:
        cols = self.blocks.multiples[1]
        return -(-self.m // cols) * cols

    def inputs(self, q, k, v, mask):
        D = _tile.pow2(self.d)
        q = _pad(_pad(q, 1, self.N), 2, D)
        k = _pad(_pad(k, 1, self.M), 2, D)
        v = None if not self.dv else _pad(_pad(v, 1, self.M), 2, _tile.pow2(self.dv))
        if mask is not None:
            mask = _pad(mask, 2, self.M, False)
            if mask.shape[1] != 1:
                mask = _pad(mask, 1, self.N, False)
        return q, k, v, mask

    def row_vector(self, x):
        """`[B, n]` -> the kernels' layout (padded to `N` rows)."""
        return self.kernels.row_layout(_pad(x, 1, self.N))

    def kwargs(self, dtype):
        m_real = self.m if self.M != self.m else None
        return dict(blocks=self.blocks, m_real=m_real, dtype=dtype)


def _compute_dtype(dtype):
    return jnp.promote_types(dtype, jnp.float32)


def _forward_with(name, config, q, k, v, beta, mask, *, interpret):
    lay = _Layout.of(name, config, q, v, interpret)
    dtype = _compute_dtype(q.dtype)
    qp, kp, vp, mp = lay.inputs(q, k, v, mask)
    out, lse = lay.kernels.forward(
        qp, kp, vp, beta.astype(dtype), mp, **lay.kwargs(dtype), interpret=interpret
    )
    lse = lay.kernels.row_values(lse, lay.n)
    out = jnp.zeros(v.shape[:1] + (lay.n, 0), v.dtype) if out is None else out
    return out[:, : lay.n, : lay.dv], lse


def _backward_with(name, config, q, k, v, beta, mask, g_out, lse2, delta, *, interpret):
    lay = _Layout.of(name, config, q, v, interpret)
    dtype = lse2.dtype
    qp, kp, vp, mp = lay.inputs(q, k, v, mask)
    do = None if vp is None else _pad(_pad(g_out, 1, lay.N), 2, vp.shape[2])
    rows = (lay.row_vector(lse2), lay.row_vector(delta))
    dq, dk, dv, dbeta = lay.kernels.backward(
        qp, kp, vp, beta.astype(dtype), mp, do, *rows, **lay.kwargs(dtype), interpret=interpret
    )
    dv = jnp.zeros_like(v) if dv is None else dv[:, : lay.m, : lay.dv]
    return dq[:, : lay.n, : lay.d], dk[:, : lay.m, : lay.d], dv, dbeta


class _Refused(Exception):
    """A configuration the compiled kernels do not take (its message says why)."""


_refused_p = Primitive("eqattn_pallas_refused")
_refused_p.multiple_results = True
_refused_p.def_abstract_eval(lambda *args, outs, message: outs)


def _refuse_lowering(ctx, *args, outs, message):
    raise ValueError(message)


mlir.register_lowering(_refused_p, _refuse_lowering)


def _compiled(fn, name, config):
    """`fn` with the real kernels; a configuration they refuse becomes an error raised when the
    program is lowered for that platform (before its compiler runs), not when it is traced:
    every platform's branch is traced, and on other platforms this one is never compiled."""

    def branch(*args):
        try:
            return fn(name, config, *args, interpret=False)
        except _Refused as e:
            outs = jax.eval_shape(ft.partial(fn, name, config, interpret=True), *args)
            flat, tree = jax.tree.flatten(outs)
            avals = tuple(ShapedArray(o.shape, o.dtype) for o in flat)
            arrays = [a for a in args if a is not None]
            return jax.tree.unflatten(tree, _refused_p.bind(*arrays, outs=avals, message=str(e)))

    return branch


def _run(fn, config, *args):
    """`fn(kernels, config, *args, interpret=...)` for the platform being compiled for."""
    return lax.platform_dependent(
        *args,
        cpu=ft.partial(fn, config.interpret, config, interpret=True),
        cuda=_compiled(fn, "triton", config),
        tpu=_compiled(fn, "mosaic", config),
    )


def _first_order(fn):
    """`fn` with a derivative rule that says, instead of failing obscurely inside Pallas, that
    the kernels are not differentiable themselves."""

    @jax.custom_vjp
    def wrapped(*args):
        return fn(*args)

    def no_second_order(res, cotangents):
        raise NotImplementedError(
            "the fused kernel's forward and backward passes called by themselves (as ring "
            "attention's blocks are) support first-order reverse-mode differentiation only "
            "(grad, vjp); for higher orders use implementation='xla' or 'chunked'."
        )

    wrapped.defvjp(lambda *args: (fn(*args), None), no_second_order)
    return wrapped


def _forward(q, k, v, beta, mask, config):
    B, n = q.shape[:2]
    m, dv = v.shape[1:]
    dtype = _compute_dtype(q.dtype)
    if n == 0 or m == 0:
        return jnp.zeros((B, n, dv), v.dtype), jnp.full((B, n), -jnp.inf, dtype)
    return _first_order(ft.partial(_run, _forward_with, config))(q, k, v, beta, mask)


def forward(
    q: Float[Array, "B n d"],
    k: Float[Array, "B m d"],
    v: Float[Array, "B m dv"],
    beta: Float[Array, " B"],
    mask: Bool[Array, "#B #n m"] | None,
    config: Config = Config(),
) -> tuple[Float[Array, "B n dv"], Float[Array, "B n"]]:
    """`(out, lse)` in the compute dtype (at least float32) by the fused kernels, for callers
    with a VJP of their own (ring attention): the core's `forward` contract."""
    out, lse = _forward(q, k, v, beta, mask, config)
    return out.astype(lse.dtype), lse


def backward(
    q: Float[Array, "B n d"],
    k: Float[Array, "B m d"],
    v: Float[Array, "B m dv"],
    beta: Float[Array, " B"],
    mask: Bool[Array, "#B #n m"] | None,
    lse: Float[Array, "B n"],
    delta: Float[Array, "B n"],
    g_out: Float[Array, "B n dv"],
    g_lse: Float[Array, "B n"],
    dtype,
    config: Config = Config(),
) -> tuple[
    Float[Array, "B n d"], Float[Array, "B m d"], Float[Array, "B m dv"], Float[Array, " B"]
]:
    r"""`(dq, dk, dv, dbeta)` in `dtype` of one set of keys by the fused kernels, the weights
    recomputed from the `lse` over all keys (then these are this set's shares) and
    $\delta = \sum g_o \odot o$: the core's `backward` contract."""
    row = delta.astype(dtype) - g_lse.astype(dtype)
    lse2 = jnp.where(jnp.isfinite(lse), lse.astype(dtype) * _tile.LOG2E, 0.0)
    run = _first_order(ft.partial(_run, _backward_with, config))
    grads = run(q, k, v, beta, mask, g_out.astype(v.dtype), lse2, row)
    return tuple(g.astype(dtype) for g in grads)


def attention_core(q, k, v, beta, mask, config=Config()):
    """`(out, lse)` in the dtype of `v`, computed by the fused kernels; differentiable twice
    (see `_fused`)."""
    out, lse = _fused(q, k, v, beta, mask, config)
    return out.astype(v.dtype), lse.astype(v.dtype)


@ft.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _fused(q, k, v, beta, mask, config):
    r"""`(out in v's dtype, lse in the compute dtype)` by the fused kernels. Its VJP runs the
    fused backward kernels; that VJP is itself differentiable: the residuals come from `_fused`
    (the forward's derivative is this VJP) and the backward kernels' own derivative is that of
    the XLA core's backward, the same formula (`_twice`). So a loss that differentiates
    attention twice (a DEQ's Jacobian penalty) runs the kernels for the value and the gradient,
    and XLA for the second-order terms only."""
    return _forward(q, k, v, beta, mask, config)


def _fused_fwd(q, k, v, beta, mask, config):
    out, lse = _fused(q, k, v, beta, mask, config)
    return (out, lse), (q, k, v, beta, mask, out, lse)


def _fused_bwd(config, res, cotangents):
    q, k, v, beta, mask, out, lse = res
    g_out, g_lse = cotangents
    if q.shape[1] == 0 or k.shape[1] == 0:
        return jnp.zeros_like(q), jnp.zeros_like(k), jnp.zeros_like(v), jnp.zeros_like(beta), None
    dtype = lse.dtype
    # The row term: dot(g_out, out) - g_lse (the log-sum-exp's cotangent shifts it). A query with
    # no key gets lse2 = 0; its weights are exp2(-inf) = 0 whatever the shift.
    delta = jnp.sum(g_out.astype(dtype) * out.astype(dtype), axis=-1) - g_lse.astype(dtype)
    lse2 = jnp.where(jnp.isfinite(lse), lse * _tile.LOG2E, 0.0)
    args = (q, k, v, beta, mask, g_out.astype(v.dtype), lse2, delta)
    dq, dk, dv, dbeta = _twice(config, *args)
    return dq, dk, dv, dbeta.astype(beta.dtype), None


_fused.defvjp(_fused_fwd, _fused_bwd)


@ft.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _twice(config, q, k, v, beta, mask, g_out, lse2, delta):
    """The backward kernels, `(dq, dk, dv, dbeta)` from the base-2 `lse2` and the row term
    `delta`; their VJP is that of `_xla_backward`."""
    return _run(_backward_with, config, q, k, v, beta, mask, g_out, lse2, delta)


def _twice_fwd(config, *args):
    return _twice(config, *args), args


def _twice_bwd(config, args, cotangents):
    q, k, v, beta, mask, g_out, lse2, delta = args

    def same(q, k, v, beta, g_out, lse2, delta):
        return _xla_backward(q, k, v, beta, mask, g_out, lse2, delta)

    _, vjp = jax.vjp(same, q, k, v, beta, g_out, lse2, delta)
    dq, dk, dv, dbeta, d_out, d_lse2, d_delta = vjp(tuple(cotangents))
    return dq, dk, dv, dbeta, None, d_out, d_lse2, d_delta


_twice.defvjp(_twice_fwd, _twice_bwd)


def _xla_backward(q, k, v, beta, mask, g_out, lse2, delta):
    r"""What the backward kernels compute, by the XLA core's backward (one pass, or key chunks
    off a CPU, as its `"auto"` path gives) in the kernels' output dtypes: the weights
    $e^{s - \mathrm{lse}}$ with $\mathrm{lse} = \mathrm{lse}_2 / \log_2 e$, and `delta` the
    whole row term (no separate log-sum-exp cotangent)."""
    dtype = lse2.dtype
    path = core_path(q.shape[1], k.shape[1], None, "auto", Tiling())
    grads = _xla.backward(
        q,
        k,
        v,
        beta.astype(dtype),
        mask,
        lse2 / _tile.LOG2E,
        delta,
        g_out.astype(dtype),
        jnp.zeros_like(delta),
        path,
        dtype,
    )
    return tuple(g.astype(x.dtype) for g, x in zip(grads, (q, k, v, lse2)))
