import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import eqattn

from .checks import unchecked


@pytest.mark.parametrize("axis", [-1, 0, (0, 2)])
def test_renormalize_matches_numpy(rng, axis):
    x = rng.normal(size=(4, 5, 6)) * 3 + 1
    mean = x.mean(axis=axis, keepdims=True)
    expected = (x - mean) / np.sqrt(x.var(axis=axis, keepdims=True) + 1e-5)
    np.testing.assert_allclose(eqattn.renormalize(x, axis=axis), expected, rtol=1e-12)


def test_renormalize_gradient_and_low_precision(rng):
    x = rng.normal(size=(3, 8))
    check_grads(lambda x: eqattn.renormalize(x) ** 3, (x,), order=1, modes=["rev"])
    xb = jnp.asarray(x * 1e3, jnp.bfloat16)
    y = eqattn.renormalize(xb)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(y, np.float64),
        np.asarray(eqattn.renormalize(np.asarray(xb, np.float64))),
        atol=2e-2,
    )
    # constant rows go to 0, not NaN
    assert np.all(eqattn.renormalize(np.ones((2, 4))) == 0)


def test_standardize_tokens(rng):
    a = rng.normal(size=(3, 3))
    x = rng.normal(size=(2, 500, 3)) @ a + np.array([1.0, -2.0, 3.0])
    y = eqattn.standardize_tokens(x, eps=0.0)
    np.testing.assert_allclose(y.mean(axis=-2), 0, atol=1e-12)
    cov = np.einsum("bni,bnj->bij", y, y) / 500
    np.testing.assert_allclose(cov, np.broadcast_to(np.eye(3), cov.shape), atol=1e-10)
    # symmetric whitening commutes with rotations of the features
    rot, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    np.testing.assert_allclose(eqattn.standardize_tokens(x @ rot, eps=0.0), y @ rot, atol=1e-10)
    with unchecked(), pytest.raises(ValueError, match=r"\[..., n, d\]"):
        eqattn.standardize_tokens(np.ones(3))
