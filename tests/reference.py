"""Independent float64 numpy references."""

import numpy as np


def attention_with_lse(q, k, v=None, beta=1.0, mask=None):
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    v = k if v is None else np.asarray(v, np.float64)
    beta = np.asarray(beta, np.float64)
    s = np.einsum("...nd,...md->...nm", q, k) * beta[..., None, None]
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    smax = np.max(s, axis=-1, keepdims=True, initial=-np.inf)
    smax = np.where(np.isfinite(smax), smax, 0.0)
    p = np.exp(s - smax)
    total = p.sum(-1)
    with np.errstate(divide="ignore"):
        lse = smax[..., 0] + np.log(total)
    out = np.einsum("...nm,...md->...nd", p, v) / np.where(total > 0, total, 1.0)[..., None]
    return out, lse


def dense_attention_with_lse(q, k, v, beta, mask=None):
    """The same in jax.numpy, dense, with no custom derivative rule: jax's autodiff of it is a
    reference for hand-written backward passes. Run it in float64."""
    import jax
    import jax.numpy as jnp

    s = jnp.einsum("...nd,...md->...nm", q, k) * jnp.asarray(beta)[..., None, None]
    if mask is not None:
        s = jnp.where(mask, s, -jnp.inf)
    smax = jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True, initial=-jnp.inf))
    e = jnp.exp(s - jnp.where(jnp.isfinite(smax), smax, 0.0))
    total = e.sum(-1)
    some = total > 0
    safe = jnp.where(some, total, 1.0)
    lse = jnp.where(
        some, jnp.where(jnp.isfinite(smax[..., 0]), smax[..., 0], 0) + jnp.log(safe), -jnp.inf
    )
    return jnp.einsum("...nm,...md->...nd", e, v) / safe[..., None], lse
