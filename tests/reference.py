"""Independent references: float64 numpy, and parameter counts of built models."""

import numpy as np


def built_model(task, config):
    """The shapes of `task`'s model for `config` (nothing initialised)."""
    import equinox as eqx
    import jax

    return eqx.filter_eval_shape(task.build_model, config, jax.random.key(0))


def parameter_count(shapes) -> int:
    """Every floating-point leaf's size (embeddings, positions and read-out included), counted
    from the leaves rather than by the model code's own count."""
    import jax

    leaves = [x for x in jax.tree.leaves(shapes) if isinstance(x, jax.ShapeDtypeStruct)]
    return sum(x.size for x in leaves if np.issubdtype(x.dtype, np.inexact))


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


def removed_attention_with_lse(q, k, v, beta, mask):
    """float64 numpy: each query's output from the keys it may attend to only (masked products
    are dropped, not multiplied by 0, so NaN stored there cannot reach the answer)."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # as the problem has them
        q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
        s = np.where(mask, np.einsum("...nd,...md->...nm", q, k) * beta, -np.inf)
        smax = np.max(s, axis=-1, keepdims=True, initial=-np.inf)
        smax = np.where(np.isfinite(smax), smax, 0.0)
        p = np.where(mask, np.exp(s - smax), 0.0)
        total = p.sum(-1)
        lse = smax[..., 0] + np.log(total)
        terms = np.where(mask[..., None], p[..., None] * v[..., None, :, :], 0.0)
        out = terms.sum(-2) / np.where(total > 0, total, 1.0)[..., None]
    return out, lse


def assert_matches_removed(out, lse, ref_out, ref_lse, atol):
    """Equal to the reference where it is finite; not finite wherever it is not (a row that a
    non-finite value reaches may be NaN as a whole: see eqattn's `make_inert`)."""
    out, lse = np.asarray(out, np.float64), np.asarray(lse, np.float64)
    clean = np.isfinite(ref_out).all(-1)
    np.testing.assert_allclose(out[clean], ref_out[clean], atol=atol * 3)
    assert np.all(~np.isfinite(out) | np.isfinite(ref_out))
    assert np.array_equal(np.isnan(lse), np.isnan(ref_lse))
    assert np.array_equal(np.isfinite(lse), np.isfinite(ref_lse))
    finite = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[finite], ref_lse[finite], rtol=atol, atol=atol)
    assert np.array_equal(lse[~finite & ~np.isnan(lse)], ref_lse[~finite & ~np.isnan(ref_lse)])
