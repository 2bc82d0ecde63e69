"""PyTorch's `scaled_dot_product_attention` as an outside anchor for the `core` suite: the flash
backend on a CUDA GPU (bf16/fp16), when torch is installed there.

The same inputs as the JAX cases (copied once through DLPack), the `[batch, heads, n, d]` layout,
forward and forward+backward (gradient of `sum(out * c)` w.r.t. q, k and v). Each call ends with
`torch.cuda.synchronize()`; the cases run in the same round-robin rounds as the JAX ones.
"""

from __future__ import annotations

from ._harness import External


def available(dtype) -> bool:
    """torch with a CUDA device, and a dtype its flash backend takes."""
    try:
        import torch
    except ImportError:
        return False
    import jax.numpy as jnp

    return torch.cuda.is_available() and jnp.dtype(dtype).name in ("bfloat16", "float16")


def version() -> str:
    import torch

    return torch.__version__


def cases(q, k, v, c, scale, *, device: str = "cuda", backend: str = "FLASH_ATTENTION"):
    """`{mode: External}` for the forward and forward+backward cases."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def to_torch(x):
        if device == "cuda":
            return torch.from_dlpack(x).clone()
        return torch.from_numpy(np.array(x, np.float32)).to(getattr(torch, x.dtype.name))

    qt, kt, vt, ct = (to_torch(x) for x in (q, k, v, c))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    kernel = getattr(SDPBackend, backend)

    def forward():
        with torch.no_grad(), sdpa_kernel(kernel):
            out = F.scaled_dot_product_attention(qt, kt, vt, scale=scale)
        sync()
        return out

    leaves = [x.detach().requires_grad_(True) for x in (qt, kt, vt)]

    def forward_backward():
        with sdpa_kernel(kernel):
            out = F.scaled_dot_product_attention(*leaves, scale=scale)
        grads = torch.autograd.grad((out * ct).sum(), leaves)
        sync()
        return grads

    return {"forward": External(forward), "forward+backward": External(forward_backward)}
