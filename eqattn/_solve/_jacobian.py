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

from .._attention import second_order


def _flat_vjp(fn, z, args):
    x, unravel = ravel_pytree(z)
    _, vjp = jax.vjp(lambda x: ravel_pytree(fn(unravel(x), args))[0], x)
    return x, lambda v: vjp(v)[0]


def jacobian_frobenius(
    fn, z: PyTree, args: PyTree = None, *, key: PRNGKeyArray, samples: int = 1
) -> Float[Array, ""]:
    r"""Hutchinson estimate of $\lVert J\rVert_F^2 = \mathbb{E}_{v\sim N(0, I)}\lVert v^\top
    J\rVert^2$ at `z`, averaged over `samples` probes. Unbiased; add it (times a small weight) to a
    loss to keep the fixed point well conditioned. Attention inside `fn` is traced to be
    differentiated twice: `implementation="auto"` leaves out cuDNN, which differentiates once
    (see [`eqattn.select_implementation`][]).

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    A = jnp.array([[0.5, 0.2], [0.0, 0.3]])
    f = lambda z, args: jnp.tanh(A @ z)  # Jacobian at 0: A
    est = eqattn.jacobian_frobenius(f, jnp.zeros(2), key=jax.random.key(0), samples=4000)
    assert jnp.allclose(est, jnp.sum(A**2), rtol=0.1)  # ||J||_F^2, by Hutchinson's probes
    ```
    """
    if samples < 1:
        raise ValueError(f"`samples` must be >= 1; got {samples}.")
    with second_order():  # the estimate is differentiated again (a training loss)
        x, vjp = _flat_vjp(fn, z, args)
    probes = jax.random.normal(key, (samples,) + x.shape, x.dtype)
    return jnp.mean(jax.vmap(lambda v: jnp.sum(vjp(v) ** 2))(probes))


def spectral_radius(
    fn, z: PyTree, args: PyTree = None, *, key: PRNGKeyArray, steps: int = 20
) -> Float[Array, ""]:
    r"""Power-iteration estimate of the spectral radius $\rho(J)$ at `z` ($= \rho(J^\top)$), from
    `steps` vector-Jacobian products. $\rho < 1$ means fixed-point iteration contracts locally.
    Accurate when one eigenvalue dominates in modulus.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    A = jnp.array([[0.5, 0.2], [0.0, 0.3]])
    f = lambda z, args: A @ z
    rho = eqattn.spectral_radius(f, jnp.zeros(2), key=jax.random.key(0), steps=50)
    assert jnp.allclose(rho, 0.5, atol=1e-3)  # the largest |eigenvalue| of A
    ```
    """
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
