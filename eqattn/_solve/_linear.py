r"""Linear solvers for the adjoint equation of implicit differentiation.

The implicit function theorem turns the backward pass of $z^* = f(z^*, \theta)$ into
$u = g + J^\top u$ with $J = \partial f/\partial z$ at $z^*$. It can be solved as a fixed point
(any of eqattn's fixed-point solvers; `Picard` is the Neumann series) or as the linear system
$(I - J^\top)\,u = g$ by any Lineax solver (`lx.GMRES`, `lx.BiCGStab`, `lx.Normal(lx.CG(...))`,
...), given as it is, on a matrix-free `lx.FunctionLinearOperator` (`solve_linear`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import lineax as lx


def solve_linear(solver: lx.AbstractLinearSolver, matvec, b):
    """`(u, ok)`: a Lineax solver's solution of `matvec(u) = b` (matrix-free), and whether it
    reported success with a finite answer."""
    operator = lx.FunctionLinearOperator(matvec, jax.eval_shape(lambda: b))
    solution = lx.linear_solve(operator, b, solver, throw=False)
    ok = (solution.result == lx.RESULTS.successful) & jnp.all(jnp.isfinite(solution.value))
    return solution.value, ok
