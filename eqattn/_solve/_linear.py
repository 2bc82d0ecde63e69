r"""Linear solvers for the adjoint equation of implicit differentiation.

The implicit function theorem turns the backward pass of $z^* = f(z^*, \theta)$ into
$u = g + J^\top u$ with $J = \partial f/\partial z$ at $z^*$. It can be solved as a fixed point
(any of eqattn's fixed-point solvers; `Picard` is the Neumann series) or as the linear system
$(I - J^\top)\,u = g$ by a Krylov method. The Krylov methods here are Lineax's (`lx.GMRES`,
`lx.BiCGStab`, `lx.Normal(lx.CG(...))`) on a matrix-free `lx.FunctionLinearOperator`, behind this
small interface, with eqattn's 2-norm test.
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax
import lineax as lx
import optimistix as optx


def _lineax_solve(solver, matvec, b):
    operator = lx.FunctionLinearOperator(matvec, jax.eval_shape(lambda: b))
    return lx.linear_solve(operator, b, solver, throw=False).value


class AbstractKrylov(eqx.Module):
    r"""Solves $(I - J^\top) u = g$ to $\lVert r\rVert \le \mathrm{atol} + \mathrm{rtol}\lVert g\rVert$."""

    rtol: eqx.AbstractVar[float]
    atol: eqx.AbstractVar[float]
    max_steps: eqx.AbstractVar[int]

    @abc.abstractmethod
    def solve(self, matvec, b):
        """A solution of `matvec(u) = b` (no convergence flag: the adjoint checks the residual)."""


class GMRES(AbstractKrylov):
    """Restarted GMRES (`lx.GMRES`; `restart` Krylov vectors per cycle, at most `max_steps`
    iterations).

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    A = jnp.array([[0.5, 0.2], [-0.3, 0.4]])
    f = lambda z, b: A @ z + b
    adjoint = eqattn.ImplicitAdjoint(linear_solver=eqattn.GMRES(rtol=1e-8))
    solve = lambda b: eqattn.fixed_point(f, jnp.zeros(2), b, adjoint=adjoint).value.sum()
    # the backward solve of (I - A^T) u = g by GMRES
    grad = jax.grad(solve)(jnp.array([1.0, 2.0]))
    assert jnp.allclose(grad, jnp.linalg.solve((jnp.eye(2) - A).T, jnp.ones(2)), rtol=1e-4)
    ```
    """

    rtol: float = 1e-6
    atol: float = 1e-8
    max_steps: int = eqx.field(static=True, default=60)
    restart: int = eqx.field(static=True, default=20)

    def solve(self, matvec, b):
        solver = lx.GMRES(
            rtol=self.rtol,
            atol=self.atol,
            norm=optx.two_norm,
            max_steps=self.max_steps,
            restart=self.restart,
        )
        return _lineax_solve(solver, matvec, b)


class BiCGStab(AbstractKrylov):
    """Biconjugate gradient, stabilized (`lx.BiCGStab`; two matrix products per step).

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    A = jnp.array([[0.5, 0.2], [-0.3, 0.4]])
    f = lambda z, b: A @ z + b
    adjoint = eqattn.ImplicitAdjoint(linear_solver=eqattn.BiCGStab(rtol=1e-8))
    solve = lambda b: eqattn.fixed_point(f, jnp.zeros(2), b, adjoint=adjoint).value.sum()
    # the backward solve of (I - A^T) u = g by BiCGStab
    grad = jax.grad(solve)(jnp.array([1.0, 2.0]))
    assert jnp.allclose(grad, jnp.linalg.solve((jnp.eye(2) - A).T, jnp.ones(2)), rtol=1e-4)
    ```
    """

    rtol: float = 1e-6
    atol: float = 1e-8
    max_steps: int = eqx.field(static=True, default=60)

    def solve(self, matvec, b):
        solver = lx.BiCGStab(
            rtol=self.rtol, atol=self.atol, norm=optx.two_norm, max_steps=self.max_steps
        )
        return _lineax_solve(solver, matvec, b)


class NormalCG(AbstractKrylov):
    r"""Conjugate gradient on the normal equations $A^\top A u = A^\top b$ (works for any
    nonsingular $A$; `lx.Normal(lx.CG(...))`; two matrix products per step, one of them
    transposed).

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    A = jnp.array([[0.5, 0.2], [-0.3, 0.4]])
    f = lambda z, b: A @ z + b
    adjoint = eqattn.ImplicitAdjoint(linear_solver=eqattn.NormalCG(rtol=1e-8))
    solve = lambda b: eqattn.fixed_point(f, jnp.zeros(2), b, adjoint=adjoint).value.sum()
    # the backward solve of (I - A^T) u = g by NormalCG
    grad = jax.grad(solve)(jnp.array([1.0, 2.0]))
    assert jnp.allclose(grad, jnp.linalg.solve((jnp.eye(2) - A).T, jnp.ones(2)), rtol=1e-4)
    ```
    """

    rtol: float = 1e-6
    atol: float = 1e-8
    max_steps: int = eqx.field(static=True, default=60)

    def solve(self, matvec, b):
        inner = lx.CG(rtol=self.rtol, atol=self.atol, norm=optx.two_norm, max_steps=self.max_steps)
        return _lineax_solve(lx.Normal(inner), matvec, b)
