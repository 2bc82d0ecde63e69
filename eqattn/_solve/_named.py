"""Solvers and adjoints by name, from the settings a run records (`eqattn train`'s options and
its checkpoints' headers)."""

from __future__ import annotations

from ._adjoints import (
    AbstractAdjoint,
    ImplicitAdjoint,
    JacobianFree,
    Phantom,
    SharedInverse,
    Unrolled,
)
from ._solvers import AbstractFixedPointSolver, Anderson, Broyden, Picard

SOLVERS = {"anderson": Anderson, "picard": Picard, "broyden": Broyden}
ADJOINTS = ("implicit", "phantom", "jacobian-free", "unrolled", "shared-inverse")


def named_solver(name: str, *, rtol: float, max_steps: int, **test) -> AbstractFixedPointSolver:
    """The fixed-point solver called `name` (`SOLVERS`) with these tolerance and cap, and the
    stopping test's other settings `test` (`atol`, `elementwise`) where given."""
    return SOLVERS[name](rtol=rtol, max_steps=max_steps, **test)


def named_adjoint(
    name: str,
    *,
    rtol: float,
    max_steps: int,
    backward_solver: str = "anderson",
    backward_steps: int | None = None,
    phantom_steps: int = 5,
    phantom_damping: float = 1.0,
) -> AbstractAdjoint:
    """The adjoint called `name` (`ADJOINTS`): the implicit one solves its linear system with
    `backward_solver` for at most `backward_steps` steps (None: `max_steps`) to `rtol`; the
    phantom one backpropagates through `phantom_steps` steps damped by `phantom_damping`."""
    if name == "implicit":
        # A truncated backward solve (a training lever chosen by the `training` benchmark); an
        # inexact one is accepted, as a layer's throw=False says.
        steps = max_steps if backward_steps is None else backward_steps
        return ImplicitAdjoint(named_solver(backward_solver, rtol=rtol, max_steps=steps))
    if name == "shared-inverse":
        return SharedInverse()
    if name == "phantom":
        return Phantom(steps=phantom_steps, damping=phantom_damping)
    return {"jacobian-free": JacobianFree(), "unrolled": Unrolled()}[name]
