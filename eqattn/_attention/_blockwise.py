"""The engine for callers that split the sequence over devices (`eqattn.parallel`): the one
place they enter it.

A sequence-parallel algorithm (ring attention, the sharded keys of `sharded_attention_with_lse`)
composes per-device pieces of one attention call. The engine gives it those pieces here and
keeps the rest: [`check`][] the arguments and the options that decide how a block is computed
([`Blocks`][]); [`prepare`][] them (flattened; key padding made inert); per block of queries
against a block of keys, [`forward`][] `(out, lse)` and [`backward`][] the gradient shares,
causal on a diagonal block; [`merge`][] or [`combine`][] partial results; and the non-finite
inputs' rules ([`inert_rows`][], [`poison_codes`][], [`apply_poison`][]): the same semantics as
the one-device call.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from . import _causal
from ._backends import PallasBackend, backend_of
from ._checks import check_chunk_size
from ._pallas import _triton
from ._plan import Tiling, check_tiling, pallas_unsupported, select_implementation
from ._prepare import (
    Arguments,
    Problem,
    apply_poison,
    check_arguments,
    nonfinite_rows,
    poison_codes,
    prepare as _prepare,
    zero_rows,
)
from ._xla import compute_dtype, finalize, merge_partials

__all__ = [
    "Blocks",
    "apply_poison",
    "backward",
    "check",
    "combine",
    "compute_dtype",
    "forward",
    "inert_rows",
    "merge",
    "poison_codes",
    "prepare",
]

BLOCK_IMPLEMENTATIONS = ("auto", "xla", "chunked", "pallas")
"""What may compute a block: each gives the log-sum-exp that merging needs (cuDNN does not)."""


@dataclasses.dataclass(frozen=True)
class Blocks:
    """How each block of queries against a block of keys is computed (static, hashable):
    `implementation` `"auto"`, `"xla"` or `"chunked"` (eqattn's core, its path per block
    following `chunk_size` and `tiling`) or `"pallas"` (the fused kernel, which keeps no block
    of logits); a diagonal block's causal halving stops at `leaf` queries. With `"auto"`, the
    platforms of `lean` (`"cuda"`, `"tpu"`: those where the kernel can run the inputs) take
    the fused kernel: a sequence long enough to split over devices is where its memory,
    O((n + m) d) against the core's O(n x chunk) per block, matters (compiled for 8 H100s, a
    causal ring over 65,536 bfloat16 tokens holds 104 MB a device with it, 609 MB without)."""

    implementation: str = "auto"
    chunk_size: int | None = None
    tiling: Tiling = Tiling()
    leaf: int = 512
    lean: tuple[str, ...] = ()

    @property
    def traces_kernel(self) -> bool:
        """Whether the program holds the fused kernel (whose calls carry no varying-axes types:
        `jax.shard_map`'s `check_vma` must be off)."""
        return self.implementation == "pallas" or bool(self.lean)


def check(
    queries, keys, values, beta, mask, *, implementation="auto", chunk_size=None, tiling=None
) -> tuple[Arguments, Blocks]:
    """The checked arguments (as the one-device call checks them) and the [`Blocks`][] of the
    options, or a `ValueError` naming the argument: an implementation that gives no
    log-sum-exp, or the fused kernel where it cannot run these inputs."""
    args = check_arguments(queries, keys, values, beta, mask)
    check_chunk_size(chunk_size)
    tiling = check_tiling(tiling)
    if implementation not in BLOCK_IMPLEMENTATIONS:
        raise ValueError(
            "`implementation` must be 'auto', 'xla', 'chunked' or 'pallas' for ring attention "
            f"(each block's log-sum-exp is merged; cuDNN gives none); got {implementation!r}."
        )
    if implementation == "pallas":
        select_implementation(
            args.queries, args.keys, args.values, implementation="pallas", need_lse=True
        )
    lean = _lean_platforms(args) if implementation == "auto" else ()
    return args, Blocks(implementation, chunk_size, tiling, chunk_size or 512, lean)


def _lean_platforms(args: Arguments) -> tuple[str, ...]:
    """The platforms whose compiler takes the fused kernel for these inputs: sizes and dtypes
    it runs, and on NVIDIA GPUs a spill-free tiling (float32 above d = 128 has none)."""
    q, k, v = args.queries, args.keys, args.values
    n, m, d, dv = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    dtype = jnp.result_type(q.dtype, k.dtype, v.dtype)
    lean: tuple[str, ...] = ()
    if pallas_unsupported(q, k, v, "gpu") is None:
        lean += ("cuda",) if _triton.default_blocks(n, m, d, dv, dtype) is not None else ()
    if pallas_unsupported(q, k, v, "tpu") is None:
        lean += ("tpu",)
    return lean


def _on_platform(blocks: Blocks, run):
    """`run(backend)` with the backend of `blocks` on the platform compiled for: the fused
    kernel on `blocks.lean`'s platforms, eqattn's core elsewhere (`lax.platform_dependent`:
    the compiler keeps the branch of its target)."""
    core = backend_of(blocks.implementation, blocks.chunk_size, blocks.tiling)
    if not blocks.lean:
        return run(core)
    lean = {p: (lambda: run(PallasBackend())) for p in blocks.lean}
    return jax.lax.platform_dependent(default=lambda: run(core), **lean)


def prepare(args: Arguments, *, inert: bool) -> Problem:
    """The flattened problem of checked arguments, with the mask's hidden inputs made inert
    (`inert=False`: the caller does it per device, with [`inert_rows`][])."""
    return _prepare(args, inert=inert)


def forward(blocks: Blocks, q, k, v, b, mask, diag: bool = False):
    """`(out, lse)` of a block of queries `[B, n, d]` against a block of keys; with `diag`,
    query i and key i are at the same position and a later key is hidden."""

    def run(backend):
        if diag:
            return _causal.forward(q, k, v, b, mask, backend, blocks.leaf)
        return backend.forward(q, k, v, b, mask)

    return _on_platform(blocks, run)


def backward(blocks: Blocks, q, k, v, b, mask, rows, dtype, diag: bool = False):
    """`(dq, dk, dv, dbeta)` shares of one block (as [`forward`][]); `rows` = the queries'
    `(lse, delta, g_out, g_lse)`, `dtype` the compute dtype."""
    lse, delta, g_out, g_lse = rows

    def run(backend):
        if diag:
            return _causal.backward(
                q, k, v, b, mask, lse, delta, g_out, g_lse, dtype, backend, blocks.leaf
            )
        return backend.backward(q, k, v, b, mask, lse, delta, g_out, g_lse, dtype)

    return _on_platform(blocks, run)


def merge(a, b):
    """`(out, lse)` of two disjoint sets of keys from each set's `(out, lse)`."""
    return merge_partials(a, b)


def combine(out, lse, axis: str):
    """`(out, lse)` of the keys of every device on mesh axis `axis` from each device's: the
    online softmax's statistics rescaled to the largest lse (`pmax`), summed (`psum`) and
    normalised by the core's `finalize`, in at least float32."""
    dtype = jnp.promote_types(out.dtype, jnp.float32)
    out, lse = out.astype(dtype), lse.astype(dtype)
    top = jax.lax.pmax(jax.lax.stop_gradient(lse), axis)
    w = jnp.exp(lse - jnp.where(jnp.isfinite(top), top, 0))  # 0 for a block with no key
    return finalize((top, jax.lax.psum(w, axis), jax.lax.psum(w[..., None] * out, axis)))


def inert_rows(q, k, v):
    """`(q, k, v)` with their non-finite rows zeroed, and the flags `(bad_q, bad_k, bad_v)`
    `[B, rows]` of those rows (what [`poison_codes`][] reads)."""
    bad_q, bad_k, bad_v = nonfinite_rows(q, k, v)
    return (zero_rows(q, bad_q), zero_rows(k, bad_k), zero_rows(v, bad_v)), (bad_q, bad_k, bad_v)
