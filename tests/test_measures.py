import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import logsumexp, softmax

import eqattn


def _spd(rng, d):
    a = rng.normal(size=(d, d))
    return a @ a.T / d + 0.5 * np.eye(d)


def _carriers(rng, d=3):
    points = rng.normal(size=(7, d))
    return [
        eqattn.Discrete(points),
        eqattn.Discrete(points, log_weights=rng.normal(size=7)),
        eqattn.Gaussian(rng.normal(size=d), _spd(rng, d)),
        eqattn.GaussianMixture(
            rng.uniform(0.5, 2, size=4),
            rng.normal(size=(4, d)),
            np.stack([_spd(rng, d) for _ in range(4)]),
        ),
    ]


@pytest.mark.parametrize("index", range(4))
def test_mean_and_fisher_are_derivatives_of_the_log_normalizer(rng, index):
    carrier = _carriers(rng)[index]
    eta = 0.5 * rng.normal(size=(2, 5, 3))
    grad = jax.vmap(jax.vmap(jax.grad(carrier.log_normalizer)))(eta)
    # jax.hessian is forward-over-reverse; the core is reverse-mode only, so use jacrev twice.
    hess = jax.vmap(jax.vmap(jax.jacrev(jax.jacrev(carrier.log_normalizer))))(eta)
    np.testing.assert_allclose(carrier.mean(eta), grad, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(carrier.fisher(eta), hess, rtol=1e-10, atol=1e-11)
    assert carrier.log_normalizer(eta).shape == (2, 5)


def test_discrete_closed_form(rng):
    points, logw = rng.normal(size=(9, 4)), rng.normal(size=9)
    eta = rng.normal(size=4)
    s = points @ eta + logw
    w = softmax(s)
    carrier = eqattn.Discrete(points, logw)
    np.testing.assert_allclose(carrier.log_normalizer(eta), logsumexp(s), rtol=1e-13)
    np.testing.assert_allclose(carrier.mean(eta), w @ points, rtol=1e-13)
    mean = w @ points
    cov = (points - mean).T @ np.diag(w) @ (points - mean)
    np.testing.assert_allclose(carrier.fisher(eta), cov, rtol=1e-12, atol=1e-14)
    # attention is the discrete mean at beta * q
    q = rng.normal(size=(3, 4))
    np.testing.assert_allclose(
        eqattn.Discrete(points).mean(2.0 * q), eqattn.attention(q, points, beta=2.0), rtol=1e-13
    )


def test_gaussian_closed_form_and_natural_convention(rng):
    mu, cov = rng.normal(size=3), _spd(rng, 3)
    eta = rng.normal(size=3)
    g = eqattn.Gaussian(mu, cov)
    np.testing.assert_allclose(g.log_normalizer(eta), mu @ eta + 0.5 * eta @ cov @ eta, rtol=1e-13)
    np.testing.assert_allclose(g.mean(eta), mu + cov @ eta, rtol=1e-13)
    np.testing.assert_allclose(g.fisher(eta), cov)
    # Natural parameters (h, P): N(P^-1 h, P^-1).
    h, P = rng.normal(size=3), _spd(rng, 3)
    n = eqattn.Gaussian.from_natural(h, P)
    np.testing.assert_allclose(n.mean(np.zeros(3)), np.linalg.solve(P, h), rtol=1e-12)
    np.testing.assert_allclose(n.fisher(np.zeros(3)), np.linalg.inv(P), rtol=1e-12)


def test_mixture_of_one_is_the_gaussian(rng):
    mu, cov, eta = rng.normal(size=3), _spd(rng, 3), rng.normal(size=(4, 3))
    g, mix = eqattn.Gaussian(mu, cov), eqattn.GaussianMixture(np.ones(1), mu[None], cov[None])
    for f in ("log_normalizer", "mean", "fisher"):
        np.testing.assert_allclose(getattr(mix, f)(eta), getattr(g, f)(eta), rtol=1e-12, atol=1e-13)


def test_mixture_closed_form(rng):
    w, mus = np.array([0.2, 0.3, 0.5]), rng.normal(size=(3, 2))
    covs = np.stack([_spd(rng, 2) for _ in range(3)])
    eta = rng.normal(size=2)
    scores = np.log(w) + mus @ eta + 0.5 * np.einsum("i,cij,j->c", eta, covs, eta)
    r = softmax(scores)
    tilted = mus + covs @ eta
    mix = eqattn.GaussianMixture(w, mus, covs)
    np.testing.assert_allclose(mix.log_normalizer(eta), logsumexp(scores), rtol=1e-13)
    np.testing.assert_allclose(mix.mean(eta), r @ tilted, rtol=1e-12)


def test_empirical_carrier_tends_to_the_gaussian(getkey):
    # Attention over m keys drawn from N(mu, Sigma) -> mu + Sigma eta, error ~ m^(-1/2).
    d, trials = 4, 24
    rng = np.random.default_rng(1)
    mu, cov = 0.5 * rng.normal(size=d), _spd(rng, d)
    gauss = eqattn.Gaussian(mu, cov)
    eta = 0.5 * jax.random.normal(getkey(), (trials, d))
    ms = [64, 256, 1024, 4096, 16384]
    errors = []
    for m in ms:
        keys = gauss.sample(getkey(), (trials, m))
        approx = jax.vmap(lambda k, e: eqattn.Discrete(k).mean(e))(keys, eta)
        errors.append(float(jnp.mean(jnp.linalg.norm(approx - gauss.mean(eta), axis=-1))))
    slope = np.polyfit(np.log(ms), np.log(errors), 1)[0]
    assert -0.6 <= slope <= -0.3, (slope, errors)
    assert errors[-1] < errors[0] / 8


@pytest.mark.bad_input
def test_bad_shapes(rng):
    with pytest.raises(ValueError, match=r"`points` must have shape \[m, d\]"):
        eqattn.Discrete(np.ones(3))
    with pytest.raises(ValueError, match="`log_weights`"):
        eqattn.Discrete(np.ones((3, 2)), np.ones(2))
    with pytest.raises(ValueError, match="`cov` shape"):
        eqattn.Gaussian(np.ones(3), np.eye(2))
    with pytest.raises(ValueError, match="`covs`"):
        eqattn.GaussianMixture(np.ones(2), np.ones((2, 3)), np.ones((2, 2, 2)))
    with pytest.raises(ValueError, match=r"`eta` must have shape \[..., 2\]"):
        eqattn.Gaussian(np.ones(2), np.eye(2)).mean(np.ones(3))
