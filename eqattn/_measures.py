r"""Carrier measures of exponential families with sufficient statistic $x$.

A carrier (intrinsic, base) measure $h$ defines the family $p(x\mid\eta) \propto h(x)\, e^{x\cdot\eta}$
with log-normalizer $A(\eta) = \log\int h(x)\, e^{x\cdot\eta}\, dx$, mean $\nabla A(\eta)$ and Fisher
information $\nabla^2 A(\eta)$ (the covariance of the tilted distribution).

Softmax attention is the discrete case: with points $k_j$ and queries $\beta q$,
`Discrete(k).mean(beta * q) == attention(q, k, beta=beta)`. Keys drawn from $N(\mu, \Sigma)$ make the
discrete carrier tend to the Gaussian one, whose mean is $\mu + \Sigma\eta$ (Y. Zhang et al., "An
Analysis of Attention via the Lens of Exchangeability and Latent Variable Models",
arXiv:2212.14852).

Every log-normalizer here goes through the one core (`eqattn.attention_with_lse`); a quadratic or
weighted exponent is written as a dot product of augmented features.
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from ._attention import attention_with_lse


def _as_queries(eta: ArrayLike, d: int, name: str = "eta") -> Array:
    eta = jnp.asarray(eta)
    if eta.ndim < 1 or eta.shape[-1] != d:
        raise ValueError(f"`{name}` must have shape [..., {d}]; got shape {eta.shape}.")
    return eta[..., None, :]


def _ones_column(x: Array) -> Array:
    return jnp.ones(x.shape[:-1] + (1,), x.dtype)


class AbstractCarrier(eqx.Module):
    r"""A carrier measure $h$ on $\mathbb{R}^d$: the family $p(x\mid\eta)\propto h(x)e^{x\cdot\eta}$."""

    @property
    @abc.abstractmethod
    def dim(self) -> int:
        """The dimension d of the sample space."""

    @abc.abstractmethod
    def log_normalizer(self, eta: Float[ArrayLike, "*batch d"]) -> Float[Array, "*batch"]:
        r"""$A(\eta) = \log\int h(x)\, e^{x\cdot\eta}\, dx$."""

    @abc.abstractmethod
    def mean(self, eta: Float[ArrayLike, "*batch d"]) -> Float[Array, "*batch d"]:
        r"""$\nabla A(\eta) = \mathbb{E}_{p(\cdot\mid\eta)}[x]$."""

    @abc.abstractmethod
    def fisher(self, eta: Float[ArrayLike, "*batch d"]) -> Float[Array, "*batch d d"]:
        r"""$\nabla^2 A(\eta) = \mathrm{Cov}_{p(\cdot\mid\eta)}[x]$."""


class Discrete(AbstractCarrier):
    r"""Point masses $h = \sum_j w_j \delta_{k_j}$ (the keys of attention).

    $A(\eta) = \log\sum_j w_j e^{k_j\cdot\eta}$ and $\nabla A(\eta) = \sum_j \mathrm{softmax}_j(\log w +
    k\cdot\eta)\, k_j$: attention of the query $\eta$ over the keys, with values = keys.

    **Arguments:**

    - `points`: `[m, d]`, the support $k_j$.
    - `log_weights`: `[m]`, $\log w_j$ (unnormalized); `None` for unit weights.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    points = jax.random.normal(jax.random.key(0), (6, 2))
    carrier = eqattn.Discrete(points)
    eta = jnp.array([0.5, -1.0])
    assert jnp.allclose(carrier.log_normalizer(eta), jax.nn.logsumexp(points @ eta), atol=1e-6)
    assert jnp.allclose(carrier.mean(eta), jax.nn.softmax(points @ eta) @ points, atol=1e-6)
    ```
    """

    points: Float[Array, "m d"]
    log_weights: Float[Array, " m"] | None

    def __init__(self, points: Float[ArrayLike, "m d"], log_weights=None):
        points = jnp.asarray(points)
        if points.ndim != 2:
            raise ValueError(f"`points` must have shape [m, d]; got shape {points.shape}.")
        if log_weights is not None:
            log_weights = jnp.asarray(log_weights)
            if log_weights.shape != points.shape[:1]:
                raise ValueError(
                    f"`log_weights` must have shape [m] = {points.shape[:1]}; "
                    f"got shape {log_weights.shape}."
                )
        self.points = points
        self.log_weights = log_weights

    @property
    def dim(self) -> int:
        return self.points.shape[-1]

    def _weights(self, eta, values):
        q = _as_queries(eta, self.dim)
        k = self.points
        if self.log_weights is not None:
            # k_j . eta + log w_j  ==  [k_j, log w_j] . [eta, 1]
            q = jnp.concatenate([q, _ones_column(q)], axis=-1)
            k = jnp.concatenate([k, self.log_weights[:, None]], axis=-1)
        out, lse = attention_with_lse(q, k, values)
        return out[..., 0, :], lse[..., 0]

    def log_normalizer(self, eta):
        return self._weights(eta, jnp.zeros(self.points.shape[:1] + (0,)))[1]

    def mean(self, eta):
        return self._weights(eta, self.points)[0]

    def fisher(self, eta):
        mean = self.mean(eta)
        centred = self.points - mean[..., None, :]
        d = self.dim
        outer = (centred[..., :, :, None] * centred[..., :, None, :]).reshape(
            *centred.shape[:-1], d * d
        )
        return self._weights(eta, outer)[0].reshape(*mean.shape, d)


def _check_gaussian(mean: Array, cov: Array, mean_name="mean", cov_name="cov"):
    if mean.ndim != 1 or cov.shape != mean.shape * 2:
        raise ValueError(
            f"`{mean_name}` must have shape [d] and `{cov_name}` shape [d, d]; "
            f"got {mean_name} {mean.shape}, {cov_name} {cov.shape}."
        )


class Gaussian(AbstractCarrier):
    r"""Gaussian carrier $h = N(\mu, \Sigma)$ ("moment" convention).

    $A(\eta) = \mu\cdot\eta + \tfrac12 \eta^\top\Sigma\eta$, $\nabla A(\eta) = \mu + \Sigma\eta$ (affine),
    $\nabla^2 A = \Sigma$: tilting by $\eta$ gives $N(\mu + \Sigma\eta, \Sigma)$. This is the limit of
    attention over keys drawn from $N(\mu, \Sigma)$.

    The other convention writes the carrier in natural parameters,
    $h(x) \propto e^{h\cdot x - \frac12 x^\top P x}$; that is $N(P^{-1}h, P^{-1})$ and is built with
    [`eqattn.Gaussian.from_natural`][] (so its equilibrium/mean at $\eta = 0$ is $P^{-1}h$, covariance
    $P^{-1}$).

    **Arguments:**

    - `mean`: `[d]`, $\mu$.
    - `cov`: `[d, d]`, $\Sigma$ (symmetric positive semi-definite).

    **Example:**

    ```python
    import jax.numpy as jnp, eqattn

    mu, cov = jnp.array([1.0, -2.0]), jnp.array([[2.0, 0.5], [0.5, 1.0]])
    eta = jnp.array([0.3, 0.1])
    g = eqattn.Gaussian(mu, cov)
    assert jnp.allclose(g.mean(eta), mu + cov @ eta, atol=1e-6)  # the tilted mean
    assert jnp.allclose(g.log_normalizer(eta), eta @ mu + eta @ cov @ eta / 2, atol=1e-6)
    ```
    """

    loc: Float[Array, " d"]
    cov: Float[Array, "d d"]

    def __init__(self, mean: Float[ArrayLike, " d"], cov: Float[ArrayLike, "d d"]):
        mean, cov = jnp.asarray(mean), jnp.asarray(cov)
        _check_gaussian(mean, cov)
        self.loc = mean
        self.cov = cov

    @classmethod
    def from_natural(
        cls, linear: Float[ArrayLike, " d"], precision: Float[ArrayLike, "d d"]
    ) -> Gaussian:
        r"""The carrier $h(x) \propto e^{\mathrm{linear}\cdot x - \frac12 x^\top P x}$ ("natural"
        convention), normalized: $N(P^{-1}\,\mathrm{linear},\ P^{-1})$ with $P$ = `precision`
        (symmetric positive definite)."""
        linear, precision = jnp.asarray(linear), jnp.asarray(precision)
        _check_gaussian(linear, precision, "linear", "precision")
        factor = jax.scipy.linalg.cho_factor(precision)
        cov = jax.scipy.linalg.cho_solve(factor, jnp.eye(linear.shape[0], dtype=precision.dtype))
        return cls(jax.scipy.linalg.cho_solve(factor, linear), 0.5 * (cov + cov.T))

    @property
    def dim(self) -> int:
        return self.loc.shape[0]

    def log_normalizer(self, eta):
        eta = _as_queries(eta, self.dim)[..., 0, :]
        return eta @ self.loc + 0.5 * jnp.einsum("...i,ij,...j->...", eta, self.cov, eta)

    def mean(self, eta):
        eta = _as_queries(eta, self.dim)[..., 0, :]
        return self.loc + eta @ self.cov.T

    def fisher(self, eta):
        eta = _as_queries(eta, self.dim)[..., 0, :]
        return jnp.broadcast_to(self.cov, eta.shape[:-1] + self.cov.shape)

    def sample(self, key: PRNGKeyArray, shape: tuple[int, ...] = ()) -> Float[Array, "*shape d"]:
        """Draws from $N(\\mu, \\Sigma)$."""
        return jax.random.multivariate_normal(key, self.loc, self.cov, shape)


class GaussianMixture(AbstractCarrier):
    r"""Mixture carrier $h = \sum_c w_c N(\mu_c, \Sigma_c)$ (moment convention per component).

    $A(\eta) = \log\sum_c w_c\, e^{\mu_c\cdot\eta + \frac12\eta^\top\Sigma_c\eta}$; the mean is the
    posterior-weighted mix of the components' tilted means,
    $\nabla A = \sum_c r_c(\eta)\,(\mu_c + \Sigma_c\eta)$ with $r = \mathrm{softmax}_c(\log w_c +
    \mu_c\cdot\eta + \frac12\eta^\top\Sigma_c\eta)$, and the Fisher information is
    $\sum_c r_c \Sigma_c + \mathrm{Cov}_r[\mu_c + \Sigma_c\eta]$.

    **Arguments:**

    - `weights`: `[C]`, positive (normalized internally).
    - `means`: `[C, d]`.
    - `covs`: `[C, d, d]`.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    w = jnp.array([0.3, 0.7])
    means = jnp.array([[0.0, 1.0], [2.0, -1.0]])
    covs = jnp.stack([jnp.eye(2), 0.5 * jnp.eye(2)])
    mix = eqattn.GaussianMixture(w, means, covs)
    eta = jnp.array([0.2, -0.4])
    parts = jnp.array([eqattn.Gaussian(m, c).log_normalizer(eta) for m, c in zip(means, covs)])
    assert jnp.allclose(mix.log_normalizer(eta), jax.nn.logsumexp(parts, b=w), atol=1e-5)
    ```
    """

    log_weights: Float[Array, " C"]
    means: Float[Array, "C d"]
    covs: Float[Array, "C d d"]

    def __init__(self, weights, means, covs):
        weights, means, covs = jnp.asarray(weights), jnp.asarray(means), jnp.asarray(covs)
        C = weights.shape[0] if weights.ndim == 1 else None
        if C is None or means.shape[:1] != (C,) or means.ndim != 2:
            raise ValueError(
                "`weights` must have shape [C] and `means` shape [C, d]; "
                f"got weights {weights.shape}, means {means.shape}."
            )
        if covs.shape != (C, means.shape[1], means.shape[1]):
            raise ValueError(
                f"`covs` must have shape [C, d, d] = {(C, means.shape[1], means.shape[1])}; "
                f"got {covs.shape}."
            )
        self.log_weights = jnp.log(weights) - jnp.log(jnp.sum(weights))
        self.means = means
        self.covs = covs

    @property
    def dim(self) -> int:
        return self.means.shape[1]

    def _posterior(self, eta, values):
        # mu_c . eta + 1/2 eta^T S_c eta + log w_c == [mu_c, vec S_c, log w_c] . [eta, vec(eta eta^T)/2, 1]
        q = _as_queries(eta, self.dim)
        quad = 0.5 * (q[..., :, None] * q[..., None, :]).reshape(*q.shape[:-1], self.dim**2)
        q = jnp.concatenate([q, quad, _ones_column(q)], axis=-1)
        C = self.means.shape[0]
        k = jnp.concatenate([self.means, self.covs.reshape(C, -1), self.log_weights[:, None]], -1)
        out, lse = attention_with_lse(q, k, values)
        return out[..., 0, :], lse[..., 0]

    def log_normalizer(self, eta):
        return self._posterior(eta, jnp.zeros((self.means.shape[0], 0)))[1]

    def _component_means(self, eta):
        eta = _as_queries(eta, self.dim)[..., 0, :]
        return self.means + jnp.einsum("cij,...j->...ci", self.covs, eta)

    def mean(self, eta):
        d = self.dim
        avg = self._posterior(eta, jnp.concatenate([self.means, self.covs.reshape(-1, d * d)], -1))[
            0
        ]
        mean_mu, mean_cov = avg[..., :d], avg[..., d:].reshape(*avg.shape[:-1], d, d)
        return mean_mu + jnp.einsum("...ij,...j->...i", mean_cov, jnp.asarray(eta))

    def fisher(self, eta):
        d = self.dim
        tilted = self._component_means(eta)  # [..., C, d]
        centred = tilted - self.mean(eta)[..., None, :]
        outer = centred[..., :, None] * centred[..., None, :]
        covs = jnp.broadcast_to(self.covs, outer.shape)
        values = (covs + outer).reshape(*outer.shape[:-2], d * d)
        return self._posterior(eta, values)[0].reshape(*tilted.shape[:-2], d, d)
