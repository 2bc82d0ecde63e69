r"""Renormalization operators: they contract what residual attention expands.

A residual attention step $\eta \leftarrow \eta + \frac1\beta\nabla A(\eta)$ is gradient ascent on the
log-normalizer and spreads the tokens out; renormalization maps them back to a fixed scale, so
$\mathrm{RN}\circ(I + \mathrm{attn})$ can have equilibrium token distributions (A. Shim, "A
Probabilistic Interpretation of Transformers", 2021).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, ArrayLike, Float

from ._attention import compute_dtype


def renormalize(
    x: Float[ArrayLike, "*shape"], *, axis: int | tuple[int, ...] = -1, eps: float = 1e-5
) -> Float[Array, "*shape"]:
    r"""Zero mean and unit variance along `axis` (layer norm without affine parameters):

    $$\mathrm{RN}(x) = \frac{x - \bar x}{\sqrt{\mathrm{Var}[x] + \epsilon}}.$$

    Statistics are computed in at least float32; the result has the dtype of `x`.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    x = 3.0 + 2.0 * jax.random.normal(jax.random.key(0), (4, 64))
    y = eqattn.renormalize(x)  # along the last axis
    assert jnp.allclose(y.mean(-1), 0, atol=1e-5) and jnp.allclose(y.var(-1), 1, atol=1e-3)
    ```
    """
    x = jnp.asarray(x)
    if eps < 0:
        raise ValueError(f"`eps` must be >= 0; got {eps}.")
    xf = x.astype(compute_dtype(x.dtype))
    # The statistics without kept dimensions, and rsqrt rather than division by a sqrt: so a
    # linearized copy of this (whose derivative reuses them) is the same as a plain one, and XLA
    # merges two evaluations of one map at one point (XLA rewrites x / sqrt(y) to
    # x * rsqrt(y), and moves reshapes of size-1 axes, only where the value has no other use).
    mean = jnp.mean(xf, axis=axis)
    centred = xf - jnp.expand_dims(mean, axis)
    var = jnp.mean(centred * centred, axis=axis)
    return (centred * jnp.expand_dims(lax.rsqrt(var + eps), axis)).astype(x.dtype)


def standardize_tokens(
    x: Float[ArrayLike, "*batch n d"], *, eps: float = 1e-5
) -> Float[Array, "*batch n d"]:
    r"""Standardize the cloud of n tokens: zero mean and identity covariance across tokens.

    $$\mathrm{RN}(x)_i = (\Sigma + \epsilon I)^{-1/2}(x_i - \bar x),\qquad
      \Sigma = \tfrac1n\textstyle\sum_i (x_i - \bar x)(x_i - \bar x)^\top$$

    (symmetric, "ZCA" whitening, so it commutes with rotations of the features). On Gaussian token
    clouds it maps $N(\mu, \Sigma)$ to $N(0, I)$. The gradient goes through an eigendecomposition
    and is undefined where $\Sigma$ has repeated eigenvalues.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    x = jax.random.normal(jax.random.key(0), (256, 3)) @ jnp.array([[2.0, 0, 0], [1, 1, 0], [0, 0, 3]])
    y = eqattn.standardize_tokens(x)  # the token cloud: zero mean, identity covariance
    assert jnp.allclose(y.mean(0), 0, atol=1e-4)
    assert jnp.allclose(y.T @ y / 256, jnp.eye(3), atol=1e-3)
    ```
    """
    x = jnp.asarray(x)
    if x.ndim < 2:
        raise ValueError(f"`x` must have shape [..., n, d]; got shape {x.shape}.")
    xf = x.astype(compute_dtype(x.dtype))
    centred = xf - jnp.mean(xf, axis=-2, keepdims=True)
    cov = jnp.einsum("...ni,...nj->...ij", centred, centred) / x.shape[-2]
    evals, evecs = jnp.linalg.eigh(cov)
    inv_sqrt = jnp.einsum("...ik,...k,...jk->...ij", evecs, 1 / jnp.sqrt(evals + eps), evecs)
    return (centred @ inv_sqrt).astype(x.dtype)
