"""What every layer solved to equilibrium shares: a solver, an adjoint, and a `throw` flag."""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx

from .._solve import AbstractAdjoint, AbstractFixedPointSolver, fixed_point
from .._solve._equilibrium import Equilibrium


class AbstractEquilibriumLayer(eqx.Module):
    """A layer whose output is a fixed point $z^* = \\mathrm{update}(z^*, \\ldots)$."""

    solver: eqx.AbstractVar[AbstractFixedPointSolver]
    adjoint: eqx.AbstractVar[AbstractAdjoint]
    throw: eqx.AbstractVar[bool]

    def solve(self, update: Callable, z0, *args, max_steps=None) -> Equilibrium:
        """Solve $z = \\mathrm{update}(\\mathrm{self}, z, *\\mathrm{args})$ from `z0` with this layer's
        solver, adjoint and `throw`. The layer and `args` are passed explicitly, so gradients
        reach every parameter."""
        return fixed_point(
            lambda z, a: update(a[0], z, *a[1:]),
            z0,
            (self, *args),
            solver=self.solver,
            adjoint=self.adjoint,
            throw=self.throw,
            max_steps=max_steps,
        )
