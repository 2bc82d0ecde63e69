r"""Estimates of $J = \partial f/\partial z$ for Jacobian regularization and diagnostics.

Both use vector-Jacobian products only (reverse mode), so they work with every eqattn operator,
and are differentiable with respect to the parameters of $f$ (S. Bai, V. Koltun, J. Z. Kolter,
"Stabilizing Equilibrium Models by Jacobian Regularization", 2021).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, Float, PRNGKeyArray, PyTree


def _flat_vjp(fn, z, args):
    x, unravel = ravel_pytree(z)
    _, vjp = jax.vjp(lambda x: ravel_pytree(fn(unravel(x), args))[0], x)
    return x, lambda v: vjp(v)[0]


def jacobian_frobenius(
    fn, z: PyTree, args: PyTree = None, *, key: PRNGKeyArray, samples: int = 1
) -> Float[Array, ""]:
    r"""Hutchinson estimate of $\lVert J\rVert_F^2 = \mathbb{E}_{v\sim N(0, I)}\lVert v^\top
    J\rVert^2$ at `z`, averaged over `samples` probes. Unbiased; add it (times a small weight) to a
    loss to keep the fixed point well conditioned."""
    if samples < 1:
        raise ValueError(f"`samples` must be >= 1; got {samples}.")
    x, vjp = _flat_vjp(fn, z, args)
    probes = jax.random.normal(key, (samples,) + x.shape, x.dtype)
    return jnp.mean(jax.vmap(lambda v: jnp.sum(vjp(v) ** 2))(probes))


def spectral_radius(
    fn, z: PyTree, args: PyTree = None, *, key: PRNGKeyArray, steps: int = 20
) -> Float[Array, ""]:
    r"""Power-iteration estimate of the spectral radius $\rho(J)$ at `z` ($= \rho(J^\top)$), from
    `steps` vector-Jacobian products. $\rho < 1$ means fixed-point iteration contracts locally.
    Accurate when one eigenvalue dominates in modulus."""
    if steps < 1:
        raise ValueError(f"`steps` must be >= 1; got {steps}.")
    x, vjp = _flat_vjp(fn, z, args)
    v = jax.random.normal(key, x.shape, x.dtype)
    v = v / jnp.linalg.norm(v)

    def body(_, carry):
        v, _ = carry
        w = vjp(v)
        norm = jnp.linalg.norm(w)
        return w / jnp.where(norm > 0, norm, 1), norm

    return jax.lax.fori_loop(0, steps, body, (v, jnp.zeros((), x.dtype)))[1]
