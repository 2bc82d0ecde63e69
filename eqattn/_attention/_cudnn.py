"""The cuDNN backend: `jax.nn.dot_product_attention(..., implementation="cudnn")`, cuDNN's fused
flash attention on NVIDIA GPUs, on the prepared problem. It returns no log-sum-exp."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ._prepare import Problem

# What `jax.nn.dot_product_attention` is asked for (the tests run this backend on a CPU with
# "xla" instead, to check the layout and the masking around the call).
FUSED = "cudnn"


def attention(problem: Problem, causal: bool = False) -> jax.Array:
    """`out [B, n, dv]` of the flattened problem. `beta` is folded into `scale` where the user
    gave one number, else into the queries; a query whose mask excludes every key gets 0."""
    q, k, v, beta, mask = problem.q, problem.k, problem.v, problem.beta, problem.mask
    q, k, v = (x[:, :, None, :] for x in (q, k, v))  # [B, t, f] -> BTNH with one head
    if problem.scale is not None:
        scale = float(problem.scale)
    else:
        q, scale = (q.astype(jnp.float32) * beta[:, None, None, None]).astype(q.dtype), 1.0
    out = jax.nn.dot_product_attention(  # type: ignore[call-overload]  # (jax's overloads name no str)
        q,
        k,
        v,
        mask=None if mask is None else mask[:, None],
        scale=scale,
        is_causal=causal,
        implementation=FUSED,
    )[:, :, 0, :]
    if mask is not None:
        out = jnp.where(jnp.any(mask, axis=-1)[..., None], out, 0)
    return out
