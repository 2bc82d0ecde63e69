r"""Linear solvers for the adjoint equation of implicit differentiation.

The implicit function theorem turns the backward pass of $z^* = f(z^*, \theta)$ into
$u = g + J^\top u$ with $J = \partial f/\partial z$ at $z^*$. It can be solved as a fixed point
(any of eqattn's fixed-point solvers; `Picard` is the Neumann series) or as the linear system
$(I - J^\top)\,u = g$ by a Krylov method. The Krylov methods here are jaxopt's
(`jaxopt.linear_solve`, which wraps `jax.scipy.sparse.linalg`), behind this small interface.
"""

from __future__ import annotations

import abc
import math
import warnings

import equinox as eqx

with warnings.catch_warnings():
    # jaxopt is archived upstream and warns on import; it is used only behind this interface.
    warnings.filterwarnings("ignore", category=DeprecationWarning, module="jaxopt")
    warnings.filterwarnings("ignore", message=".*JAXopt is no longer maintained.*")
    from jaxopt import linear_solve as _jaxopt_linear


class AbstractKrylov(eqx.Module):
    r"""Solves $(I - J^\top) u = g$ to $\lVert r\rVert \le \mathrm{atol} + \mathrm{rtol}\lVert g\rVert$."""

    rtol: eqx.AbstractVar[float]
    atol: eqx.AbstractVar[float]
    max_steps: eqx.AbstractVar[int]

    @abc.abstractmethod
    def solve(self, matvec, b):
        """A solution of `matvec(u) = b` (no convergence flag: the adjoint checks the residual)."""


class GMRES(AbstractKrylov):
    """Restarted GMRES (`restart` Krylov vectors per cycle, `max_steps` matrix products in all)."""

    rtol: float = 1e-6
    atol: float = 1e-8
    max_steps: int = eqx.field(static=True, default=60)
    restart: int = eqx.field(static=True, default=20)

    def solve(self, matvec, b):
        cycles = max(1, math.ceil(self.max_steps / self.restart))
        return _jaxopt_linear.solve_gmres(
            matvec, b, tol=self.rtol, atol=self.atol, restart=self.restart, maxiter=cycles
        )


class BiCGStab(AbstractKrylov):
    """Biconjugate gradient, stabilized (two matrix products per step)."""

    rtol: float = 1e-6
    atol: float = 1e-8
    max_steps: int = eqx.field(static=True, default=60)

    def solve(self, matvec, b):
        return _jaxopt_linear.solve_bicgstab(
            matvec, b, tol=self.rtol, atol=self.atol, maxiter=self.max_steps
        )


class NormalCG(AbstractKrylov):
    r"""Conjugate gradient on the normal equations $A^\top A u = A^\top b$ (works for any
    nonsingular $A$; two matrix products per step, one of them transposed)."""

    rtol: float = 1e-6
    atol: float = 1e-8
    max_steps: int = eqx.field(static=True, default=60)

    def solve(self, matvec, b):
        return _jaxopt_linear.solve_normal_cg(
            matvec, b, tol=self.rtol, atol=self.atol, maxiter=self.max_steps
        )
