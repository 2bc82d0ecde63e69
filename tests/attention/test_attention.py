import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import logsumexp

import eqattn

from ..checks import unchecked


def test_attention_is_the_gradient_of_the_log_normalizer(rng):
    # attention(q, k) == (1/beta) grad_q sum(log_normalizer(q, k)), per head, with a mask.
    q = rng.normal(size=(2, 3, 6, 5))
    k = rng.normal(size=(2, 3, 9, 5))
    beta = np.array([0.3, 1.0, 4.0])
    mask = rng.random((2, 1, 6, 9)) > 0.2
    mask[..., 0] = True
    grad = jax.grad(lambda q: jnp.sum(eqattn.log_normalizer(q, k, beta=beta, mask=mask)))(q)
    att = eqattn.attention(q, k, beta=beta, mask=mask)
    np.testing.assert_allclose(att, grad / beta[:, None, None], rtol=1e-12, atol=1e-13)


def test_log_normalizer_matches_scipy(rng):
    q, k = rng.normal(size=(4, 7, 3)), rng.normal(size=(4, 11, 3))
    expected = logsumexp(0.5 * np.einsum("bnd,bmd->bnm", q, k), axis=-1)
    np.testing.assert_allclose(eqattn.log_normalizer(q, k, beta=0.5), expected, rtol=1e-13)


def test_attention_matches_softmax_reference(rng):
    q, k, v = rng.normal(size=(5, 3)), rng.normal(size=(8, 3)), rng.normal(size=(8, 2))
    s = 2.0 * q @ k.T
    w = np.exp(s - logsumexp(s, axis=-1, keepdims=True))
    np.testing.assert_allclose(eqattn.attention(q, k, v, beta=2.0), w @ v, rtol=1e-13)
    np.testing.assert_allclose(eqattn.attention(q, k, beta=2.0), w @ k, rtol=1e-13)


def test_split_and_merge_heads(rng):
    x = rng.normal(size=(2, 5, 12))
    h = eqattn.split_heads(x, 3)
    assert h.shape == (2, 3, 5, 4)
    np.testing.assert_array_equal(h[:, 1], x[..., 4:8])
    np.testing.assert_array_equal(eqattn.merge_heads(h), x)
    with unchecked(), pytest.raises(ValueError, match="num_heads=5"):
        eqattn.split_heads(x, 5)
    with unchecked(), pytest.raises(ValueError, match="heads, n, head_dim"):
        eqattn.merge_heads(x[0])


def _softmax_reference(q, k, beta, mask):
    s = np.einsum("...nd,...md->...nm", q, k) * np.asarray(beta, np.float64)[..., None, None]
    s = np.where(mask, s, -np.inf)
    top = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0))
    total = e.sum(-1, keepdims=True)
    return np.where(total > 0, e / np.where(total > 0, total, 1), 0)


@pytest.mark.parametrize("scale", [1.0, 40.0], ids=["normal", "huge-logits"])
def test_attention_weights_against_numpy(scale):
    rng = np.random.default_rng(3)
    q, k = rng.normal(size=(2, 3, 5, 4)) * scale, rng.normal(size=(2, 3, 7, 4)) * scale
    beta = np.array([0.5, 1.0, 2.0]) * np.ones((2, 1))  # per batch element and head
    mask = rng.random((2, 1, 5, 7)) > 0.3
    mask[0, 0, 1] = False  # a row that sees nothing
    p = eqattn.attention_weights(q, k, beta=beta, mask=mask)
    ref = _softmax_reference(q, k, beta, mask)
    np.testing.assert_allclose(p, ref, atol=1e-12)
    assert np.all(p[0, :, 1] == 0)
    # the weights are what attention averages with
    v = rng.normal(size=(2, 3, 7, 3))
    np.testing.assert_allclose(
        np.einsum("...nm,...md->...nd", p, v),
        eqattn.attention(q, k, v, beta=beta, mask=mask),
        atol=1e-10,
    )
    low = eqattn.attention_weights(
        jnp.asarray(q / scale, jnp.bfloat16), jnp.asarray(k / scale, jnp.bfloat16), mask=mask
    )
    assert low.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(low, np.float64), _softmax_reference(q / scale, k / scale, 1.0, mask), atol=2e-2
    )
