"""Run a plan: the backends that compute a prepared problem, and the one place that picks them.

A backend here has the core's contract on the flattened problem: `forward(q, k, v, beta, mask)`
gives `(out, lse)` in the compute dtype, and `backward(q, k, v, beta, mask, lse, delta, g_out,
g_lse, dtype)` the gradients from the weights recomputed from `lse` (over all keys, which may be
more than these: then they are these keys' shares). The causal blocks (`_causal`) and ring
attention (`eqattn.parallel`) compute on any such backend; cuDNN (`_cudnn`) gives no log-sum-exp
and runs whole problems only.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
from jax import lax

from . import _causal, _cudnn, _xla
from ._pallas import _attention as _pallas
from ._plan import Plan, Tiling, core_path, cudnn_buildable
from ._prepare import Problem


@dataclasses.dataclass(frozen=True)
class XlaBackend:
    """The XLA core: each block along the path its own shape gets (`core_path`: one pass, query
    tiles on a CPU, key chunks elsewhere)."""

    implementation: str = "auto"
    chunk_size: int | None = None
    tiling: Tiling = Tiling()

    def path(self, q, k):
        return core_path(q.shape[1], k.shape[1], self.chunk_size, self.implementation, self.tiling)

    def forward(self, q, k, v, beta, mask):
        return _xla.forward(q, k, v, beta, mask, self.path(q, k))

    def backward(self, q, k, v, beta, mask, lse, delta, g_out, g_lse, dtype):
        path = self.path(q, k)
        return _xla.backward(q, k, v, beta, mask, lse, delta, g_out, g_lse, path, dtype)

    def attention_core(self, q, k, v, beta, mask):
        """`(out, lse)` in the dtype of `v`, differentiable (a recomputing custom VJP)."""
        return _xla.attention_core(q, k, v, beta, mask, self.path(q, k))


@dataclasses.dataclass(frozen=True)
class PallasBackend:
    """eqattn's fused kernel (Triton on NVIDIA GPUs, Mosaic on TPUs, interpreted on a CPU)."""

    def forward(self, q, k, v, beta, mask):
        return _pallas.forward(q, k, v, beta, mask)

    def backward(self, q, k, v, beta, mask, lse, delta, g_out, g_lse, dtype):
        return _pallas.backward(q, k, v, beta, mask, lse, delta, g_out, g_lse, dtype)

    def attention_core(self, q, k, v, beta, mask):
        return _pallas.attention_core(q, k, v, beta, mask)


def backend_of(
    implementation: str, chunk_size: int | None, tiling: Tiling
) -> XlaBackend | PallasBackend:
    """The backend with the core's contract for an `implementation` other than cuDNN's: the
    fused kernel for `"pallas"`, else the XLA core (its path per block follows the arguments)."""
    if implementation == "pallas":
        return PallasBackend()
    return XlaBackend(implementation, chunk_size, tiling)


def _computed(plan: Plan, problem: Problem) -> tuple[jax.Array, jax.Array]:
    """`(out, lse)` of the problem by eqattn's core or its fused kernel, causal or not."""
    # "auto" that chose the fused kernel (a GPU's measured table) runs it; else the XLA core,
    # whose path per block follows what was requested
    requested = "pallas" if plan.implementation == "pallas" else plan.requested
    backend, p = backend_of(requested, plan.chunk_size, plan.tiling), problem
    return _core(backend, plan.causal, plan.tiling.causal_leaf, p.q, p.k, p.v, p.beta, p.mask)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _core(backend, causal, causal_leaf, q, k, v, beta, mask):
    """The computation, one program per backend, causality and shapes: a call outside `jit`
    compiles it once instead of each of its operations; inside `jit` it is inlined."""
    if causal:
        return _causal.attention_core(q, k, v, beta, mask, backend, causal_leaf)
    return backend.attention_core(q, k, v, beta, mask)


def run(plan: Plan, problem: Problem) -> tuple[jax.Array, jax.Array | None]:
    """`(out, lse)` of the flattened problem (`lse` None from cuDNN).

    Where `"auto"` would run cuDNN on a GPU, the program holds both cuDNN's call and the XLA
    core (`lax.platform_dependent`) and the compiler keeps the one for its target platform, so
    a program exported or compiled for a GPU from a CPU host carries cuDNN, and one for a CPU
    from a GPU host does not. A jax that cannot build cuDNN's call (no CUDA plugin) builds the
    core alone."""
    if plan.requested == "auto" and plan.cudnn_on_gpu and cudnn_buildable():
        core = plan._replace(implementation="xla")
        out = lax.platform_dependent(
            problem,
            cuda=lambda p: _cudnn.attention(p, plan.causal),
            default=lambda p: _computed(core, p)[0],
        )
        return out, None
    if plan.implementation == "cudnn":
        return _cudnn.attention(problem, plan.causal), None
    return _computed(plan, problem)
