"""What every layer solved to equilibrium shares: a solver, an adjoint, a `throw` flag, and one
convention for its output and solver statistics."""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import equinox as eqx
from jaxtyping import ArrayLike

from .._solve import (
    AbstractAdjoint,
    AbstractFixedPointSolver,
    Equilibrium,
    Solver,
    default_adjoint,
    fixed_point,
    precision_rtol,
    solver_backend,
)


class AbstractSolved(eqx.Module):
    """A module that solves for an equilibrium: `forward(...)` returns `(output, equilibrium)`
    and a call returns the output alone. The equilibrium layers, `HopfieldPooling` and
    `HopfieldLayer` are such modules; they define `forward` only (`DEQTransformer` follows the
    same convention with its own `__call__`, as the transformer models compose their ends)."""

    @abc.abstractmethod
    def forward(self, *args, **kwargs) -> tuple[Any, Equilibrium]:
        """The output and the solve's `Equilibrium`."""

    @eqx.filter_jit
    def __call__(self, *args, **kwargs):
        """The output alone: `forward(...)[0]`, with the same arguments (compiled as one
        program: see `eqattn.nn`)."""
        return self.forward(*args, **kwargs)[0]


class AbstractEquilibriumLayer(AbstractSolved):
    """A layer whose output is computed from a fixed point $z^* = \\mathrm{update}(z^*, \\ldots)$.

    One convention on every equilibrium layer (and on [`eqattn.nn.DEQTransformer`][],
    [`eqattn.nn.HopfieldPooling`][] and [`eqattn.nn.HopfieldLayer`][]):

    - `layer(...)` returns the output;
    - `layer.forward(...)` returns `(output, equilibrium)`, the same output and the solve's
      [`eqattn.Equilibrium`][] (steps, residuals, `converged`; under `jax.vmap`, per example);
    - `layer.equilibrium(...)`, where a layer has it, returns the `Equilibrium` alone, whose
      `value` is the solved state (the output itself for `ImplicitAttention`, `DEQBlock` and
      `EnergyAttention`; the projected state patterns for the Hopfield layers).
    """

    solver: eqx.AbstractVar[AbstractFixedPointSolver]
    adjoint: eqx.AbstractVar[AbstractAdjoint]
    throw: eqx.AbstractVar[bool]

    @staticmethod
    def solving(
        solver: Solver | None,
        adjoint: AbstractAdjoint | None,
        default: AbstractFixedPointSolver,
        dtype=None,
    ) -> tuple[Any, AbstractAdjoint]:
        """A layer's solver and adjoint from its constructor's arguments: `solver`, else the
        layer's `default` with its `rtol` raised to what `dtype`'s matmuls resolve; `adjoint`,
        else the solver's default ([`eqattn.fixed_point`][]'s)."""
        if solver is None:
            solver = eqx.tree_at(lambda s: s.rtol, default, precision_rtol(default.rtol, dtype))
        return solver, default_adjoint(solver) if adjoint is None else adjoint

    def solve(self, update: Callable, z0, *args, budget=None) -> Equilibrium:
        """Solve $z = \\mathrm{update}(\\mathrm{self}, z, *\\mathrm{args})$ from `z0` with this layer's
        solver, adjoint and `throw`. The layer and `args` are passed explicitly, so gradients
        reach every parameter. Compiled as one program (see `eqattn.nn`); `update` is part of
        what is compiled (a function defined once, such as the layer's own step), and so is
        `budget` only where the solver needs a Python int (jaxopt's, Optimistix's)."""
        return _solve(update, self, z0, args, self._run_budget(budget))

    def _run_budget(self, budget: int | ArrayLike | None) -> Any:
        """`budget` as this layer's solver takes it at run time: eqattn's solvers an int32
        array (a new budget does not recompile), other libraries' the Python int."""
        return solver_backend(self.solver).budget(self.solver, budget)


@eqx.filter_jit
def _solve(update: Callable, layer: AbstractEquilibriumLayer, z0, args, budget) -> Equilibrium:
    return fixed_point(
        lambda z, a: update(a[0], z, *a[1:]),
        z0,
        (layer, *args),
        solver=layer.solver,
        adjoint=layer.adjoint,
        throw=layer.throw,
        budget=budget,
    )
