"""Cached generation's read (`attention_over_cache`: keys and values positions last, the first
`length` in use): against float64 numpy over the positions in use, at every length from none to
all, with a mask, huge logits, garbage past the length, bfloat16 inputs, and its gradients
against finite differences."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from eqattn._attention import attention_over_cache
from tests import reference

H, N, D, DV, M = 2, 3, 4, 5, 9


def _inputs(seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.normal(size=s).astype(dtype) for s in ((H, N, D), (H, M, D), (H, M, DV)))
    return q, k, v, np.array([0.7, 1.3])


def _positions_last(x):
    return jnp.swapaxes(jnp.asarray(x), -1, -2)


@pytest.mark.parametrize("length", [0, 1, 5, M])
def test_reads_the_positions_in_use_as_float64_numpy(length):
    q, k, v, beta = _inputs(length)
    mask = np.random.default_rng(7).random((N, M)) < 0.7
    mask[1] = False  # a query that sees nothing: out 0, lse -inf
    garbage_k, garbage_v = k.copy(), v.copy()
    garbage_k[:, length:] *= 1e6  # finite values past the length change nothing
    garbage_v[:, length:] = 3e5
    out, lse = attention_over_cache(
        jnp.asarray(q),
        _positions_last(garbage_k),
        _positions_last(garbage_v),
        length,
        beta=jnp.asarray(beta),
        mask=mask,
    )
    ref_out, ref_lse = reference.attention_with_lse(
        q, k[:, :length], v[:, :length], beta, mask[:, :length]
    )
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12)
    assert np.all(out[:, 1] == 0) and np.all(np.isneginf(lse[:, 1]))


def test_huge_logits_and_bfloat16():
    q, k, v, beta = _inputs(1)
    out, lse = attention_over_cache(
        jnp.asarray(q) * 1e4, _positions_last(k), _positions_last(v), 6, beta=beta
    )
    ref_out, ref_lse = reference.attention_with_lse(q * 1e4, k[:, :6], v[:, :6], beta)
    np.testing.assert_allclose(out, ref_out, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12)
    low = [jnp.asarray(x, jnp.bfloat16) for x in (q, k, v)]
    out, lse = attention_over_cache(
        low[0], _positions_last(low[1]), _positions_last(low[2]), 6, beta=beta
    )
    assert out.dtype == jnp.bfloat16 and lse.dtype == jnp.float32
    q, k, v = (np.asarray(x, np.float64) for x in low)
    ref_out, _ = reference.attention_with_lse(q, k[:, :6], v[:, :6], beta)
    np.testing.assert_allclose(np.asarray(out, np.float64), ref_out, atol=0.05)


def test_gradients_match_finite_differences():
    q, k, v, beta = _inputs(2)

    def f(q, k, v, beta):
        out, lse = attention_over_cache(q, k, v, 6, beta=beta)
        return out.sum(-1) + jnp.sin(lse)

    args = (jnp.asarray(q), _positions_last(k), _positions_last(v), jnp.asarray(beta))
    check_grads(f, args, order=1, modes=["rev"])
    grads = jax.grad(lambda k, v: f(args[0], k, v, args[3]).sum(), argnums=(0, 1))(*args[1:3])
    assert all(np.all(g[..., 6:] == 0) for g in grads)  # nothing reaches the unused positions
