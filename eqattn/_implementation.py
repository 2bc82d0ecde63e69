r"""Which implementation computes attention: eqattn's own passes, or cuDNN's fused kernel.

- `"xla"`: eqattn's single pass (on CPU, tile by tile over the queries), with its recomputing VJP.
- `"chunked"`: eqattn's key-chunked (online-softmax) pass: memory $O(n \cdot \mathrm{chunk})$.
- `"cudnn"`: `jax.nn.dot_product_attention(..., implementation="cudnn")` (flash attention on
  NVIDIA GPUs). It returns no log-sum-exp, so it can serve [`eqattn.attention`][] only.
- `"auto"`: cuDNN when it can run the inputs and no log-sum-exp is needed (a CUDA GPU, bf16/fp16
  inputs of one dtype, one feature size $d = d_v \le 128$ with $8 \mid d$, no mask); otherwise
  `"chunked"` when `chunk_size` is given or, off CPU, above $2^{26}$ logits per batch element;
  otherwise `"xla"`.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from . import _core
from ._core import Implementation, check_implementation

# What `jax.nn.dot_product_attention` is asked for (the tests run the wrapper on CPU with "xla").
_FUSED = "cudnn"


def cudnn_unsupported(queries, keys, values, mask, backend: str) -> str | None:
    """Why cuDNN's fused attention cannot run these inputs, or None if it can."""
    if backend != "gpu":
        return f"it needs an NVIDIA GPU (the default backend is {backend!r})"
    dtypes = {jnp.dtype(x.dtype) for x in (queries, keys, values)}
    if len(dtypes) != 1 or dtypes.pop() not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return (
            "it needs bfloat16 or float16 queries, keys and values of one dtype; got "
            f"{queries.dtype}, {keys.dtype}, {values.dtype}"
        )
    d, dv = queries.shape[-1], values.shape[-1]
    if d != dv or d > 128 or d % 8:
        return (
            "it needs the same feature size d for queries and values, a multiple of 8 and at "
            f"most 128; got d = {d}, dv = {dv}"
        )
    if queries.shape[-2] == 0 or keys.shape[-2] == 0:
        return "it needs at least one query and one key"
    del mask
    return None


def select_implementation(
    queries,
    keys,
    values=None,
    *,
    mask=None,
    implementation: Implementation = "auto",
    chunk_size: int | None = None,
    need_lse: bool = False,
    backend: str | None = None,
) -> Literal["xla", "chunked", "cudnn"]:
    """The implementation that `attention` (`need_lse=False`) or `attention_with_lse`
    (`need_lse=True`) runs for these inputs.

    Arrays or `jax.ShapeDtypeStruct`s are accepted (only shapes and dtypes are read). `backend`
    defaults to `jax.default_backend()`; pass `"gpu"` to see what a GPU would run. An explicit
    choice that cannot run raises a `ValueError` saying why.
    """
    backend = jax.default_backend() if backend is None else backend
    values = keys if values is None else values
    check_implementation(implementation, need_lse=need_lse)
    if implementation == "cudnn":
        reason = cudnn_unsupported(queries, keys, values, mask, backend)
        if reason is not None:
            raise ValueError(
                f"`implementation='cudnn'` cannot run these inputs: {reason} (queries "
                f"{tuple(queries.shape)}, keys {tuple(keys.shape)}, values "
                f"{tuple(values.shape)})."
            )
        return "cudnn"
    if implementation in ("xla", "chunked"):
        return implementation
    if (
        not need_lse
        and mask is None
        and cudnn_unsupported(queries, keys, values, mask, backend) is None
    ):
        return "cudnn"
    n, m = queries.shape[-2], keys.shape[-2]
    size, explicit = _core.chunk_spec(n, m, chunk_size, "auto")
    return "chunked" if explicit or (size is not None and backend != "cpu") else "xla"


def cudnn_attention(queries, keys, values, *, beta, mask):
    """Attention through `jax.nn.dot_product_attention(implementation="cudnn")`.

    Inputs as `eqattn.attention` (already checked); beta is folded into the queries (or into
    `scale` when it is a concrete number); a query whose mask excludes every key gets 0.
    """
    batch = _core.check_inputs(queries, keys, values, beta, mask)
    (n, d), (m, dv) = queries.shape[-2:], values.shape[-2:]
    B = int(np.prod(batch, dtype=np.int64))

    def flat(x, tail):  # [..., t, f] -> [B, t, 1, f] (BTNH with one head)
        return jnp.broadcast_to(x, batch + tail).reshape((B,) + tail[:1] + (1,) + tail[1:])

    q, k, v = flat(queries, (n, d)), flat(keys, (m, d)), flat(values, (m, dv))
    if _core.is_concrete(beta) and jnp.ndim(beta) == 0:
        scale = float(beta)
    else:
        b = jnp.broadcast_to(beta, batch).reshape(B, 1, 1, 1)
        q, scale = (q.astype(jnp.float32) * b).astype(q.dtype), 1.0
    mask4, mask_n = None, 1
    if mask is not None:
        mask_n = mask.shape[-2] if mask.ndim >= 2 else 1
        if any(s != 1 for s in mask.shape[:-2]):
            mask4 = jnp.broadcast_to(mask, batch + (mask_n, m)).reshape(B, 1, mask_n, m)
        else:
            mask4 = jnp.broadcast_to(mask, (mask_n, m)).reshape(1, 1, mask_n, m)
    out = jax.nn.dot_product_attention(q, k, v, mask=mask4, scale=scale, implementation=_FUSED)
    out = out.reshape(batch + (n, dv))
    if mask is not None:
        any_key = jnp.any(jnp.broadcast_to(mask, batch + (mask_n, m)), axis=-1)
        out = jnp.where(any_key[..., None], out, 0)
    return out
