r"""Linear solvers for the adjoint equation of implicit differentiation.

The implicit function theorem turns the backward pass of $z^* = f(z^*, \theta)$ into
$u = g + J^\top u$ with $J = \partial f/\partial z$ at $z^*$. It can be solved as a fixed point
(any of eqattn's fixed-point solvers; `Picard` is the Neumann series) or as the linear system
$(I - J^\top)\,u = g$ by any Lineax solver (`lx.GMRES`, `lx.BiCGStab`, `lx.Normal(lx.CG(...))`,
...), given as it is, on a matrix-free `lx.FunctionLinearOperator` (`solve_linear`).

`GMRES`, `BiCGStab` and `NormalCG` are the wrappers of those Lineax solvers that eqattn had
before it took them directly: deprecated aliases, kept for one release.
"""

from __future__ import annotations

import abc
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import optimistix as optx


def solve_linear(solver: lx.AbstractLinearSolver, matvec, b):
    """`(u, ok)`: a Lineax solver's solution of `matvec(u) = b` (matrix-free), and whether it
    reported success with a finite answer."""
    operator = lx.FunctionLinearOperator(matvec, jax.eval_shape(lambda: b))
    solution = lx.linear_solve(operator, b, solver, throw=False)
    ok = (solution.result == lx.RESULTS.successful) & jnp.all(jnp.isfinite(solution.value))
    return solution.value, ok


def _lineax_solve(solver, matvec, b):
    return solve_linear(solver, matvec, b)[0]


class AbstractKrylov(eqx.Module):
    r"""Deprecated: pass a Lineax solver to [`eqattn.ImplicitAdjoint`][] instead. Solves
    $(I - J^\top) u = g$ to $\lVert r\rVert \le \mathrm{atol} + \mathrm{rtol}\lVert g\rVert$."""

    rtol: eqx.AbstractVar[float]
    atol: eqx.AbstractVar[float]
    max_steps: eqx.AbstractVar[int]

    def __check_init__(self):
        name = type(self).__name__
        new = {"NormalCG": "lx.Normal(lx.CG(rtol, atol))"}.get(name, f"lx.{name}(rtol, atol)")
        warnings.warn(
            f"`eqattn.{name}` is deprecated: pass Lineax's `{new}` to eqattn.ImplicitAdjoint "
            "directly; the wrapper will be removed in the next release.",
            DeprecationWarning,
            stacklevel=3,
        )

    @abc.abstractmethod
    def solve(self, matvec, b):
        """A solution of `matvec(u) = b` (no convergence flag: the adjoint checks the residual)."""


class GMRES(AbstractKrylov):
    """Deprecated: `lx.GMRES(rtol, atol)` given to [`eqattn.ImplicitAdjoint`][] directly, as in
    the example. Restarted GMRES (`lx.GMRES`; `restart` Krylov vectors per cycle, at most `max_steps`
    iterations).

    **Example:**

    ```python
    import jax, jax.numpy as jnp, lineax as lx, eqattn

    A = jnp.array([[0.5, 0.2], [-0.3, 0.4]])
    f = lambda z, b: A @ z + b
    adjoint = eqattn.ImplicitAdjoint(linear_solver=lx.GMRES(rtol=1e-8, atol=1e-8))
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
    """Deprecated: `lx.BiCGStab(rtol, atol)` given to [`eqattn.ImplicitAdjoint`][] directly, as
    in the example. Biconjugate gradient, stabilized (`lx.BiCGStab`; two matrix products per step).

    **Example:**

    ```python
    import jax, jax.numpy as jnp, lineax as lx, eqattn

    A = jnp.array([[0.5, 0.2], [-0.3, 0.4]])
    f = lambda z, b: A @ z + b
    adjoint = eqattn.ImplicitAdjoint(linear_solver=lx.BiCGStab(rtol=1e-8, atol=1e-8))
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
    r"""Deprecated: `lx.Normal(lx.CG(rtol, atol))` given to [`eqattn.ImplicitAdjoint`][]
    directly, as in the example. Conjugate gradient on the normal equations $A^\top A u = A^\top b$ (works for any
    nonsingular $A$; `lx.Normal(lx.CG(...))`; two matrix products per step, one of them
    transposed).

    **Example:**

    ```python
    import jax, jax.numpy as jnp, lineax as lx, eqattn

    A = jnp.array([[0.5, 0.2], [-0.3, 0.4]])
    f = lambda z, b: A @ z + b
    adjoint = eqattn.ImplicitAdjoint(linear_solver=lx.Normal(lx.CG(rtol=1e-8, atol=1e-8)))
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
