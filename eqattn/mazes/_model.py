r"""The mazes models: an [`nn.GraphReasoner`][eqattn.nn.GraphReasoner] over a maze's graph
(a cell's input one-hot, 1 on the start and the goal -> a linear code -> the generic graph
transformer -> two logits a cell, on the path or not). The DEQ solves its step to the fixed
point, so a larger maze is answered by iterating longer; nothing in the step knows mazes."""

from __future__ import annotations

from jaxtyping import PRNGKeyArray

from .. import nn
from .._solve import AbstractAdjoint, Picard, Solver
from ._data import EDGE_KINDS

SHAPE = dict(categories=2, classes=2, edge_features=len(EDGE_KINDS))
"""What a mazes model reads and answers: an end (or not) a cell, the sides of its edges, two
logits a cell."""


def reach(size: int) -> int:
    """Steps with gradient in training on mazes of `size` x `size` cells: `size**2 // 2 + 4`
    (a path in a depth-first maze runs through up to about 70% of the cells; information
    crosses one passage a step).

    **Example:**

    ```python
    from eqattn import mazes

    assert mazes.reach(9) == 44
    ```
    """
    return size * size // 2 + 4


def budget_for(size: int) -> int:
    """The DEQ's solver budget on mazes of `size` x `size` cells: `4 size**2 + 100`.

    **Example:**

    ```python
    from eqattn import mazes

    assert mazes.budget_for(59) == 14024
    ```
    """
    return 4 * size * size + 100


def deq(
    dim: int,
    heads: int,
    *,
    key: PRNGKeyArray,
    solver: Solver | None = None,
    adjoint: AbstractAdjoint | None = None,
    dtype=None,
) -> nn.GraphReasoner:
    """The DEQ for mazes: one step of `dim` channels and `heads` heads, solved by `solver`
    (default Picard iteration to a relative residual of 1e-4 within 16384 steps).

    **Example:**

    ```python
    import jax, numpy as np
    from eqattn import mazes

    model = mazes.deq(8, 2, key=jax.random.key(0))
    batch = mazes.draw_mazes(np.random.default_rng(0), 1, 4)
    p = model.predict(batch.inputs[0], mazes.maze_graph(batch.passages[0], 4))
    assert p.logits.shape == (16, 2)
    ```
    """
    solver = Picard(rtol=1e-4, max_steps=16384) if solver is None else solver
    return nn.GraphReasoner.deq(
        dim, heads, key=key, solver=solver, adjoint=adjoint, dtype=dtype, **SHAPE
    )


def explicit(
    dim: int, heads: int, *, depth: int, key: PRNGKeyArray, hidden: int | None = None, dtype=None
) -> nn.GraphReasoner:
    """The explicit model for mazes: `depth` untied steps
    ([`nn.GraphReasoner.explicit`][eqattn.nn.GraphReasoner.explicit]; its twin of a DEQ's
    parameters: [`nn.GraphReasoner.matched`][eqattn.nn.GraphReasoner.matched]).

    **Example:**

    ```python
    import jax
    from eqattn import mazes, nn

    twin = mazes.explicit(8, 2, depth=3, key=jax.random.key(0))
    assert not twin.is_deq and len(twin.core.steps) == 3 and twin.shape == mazes.SHAPE
    matched = nn.GraphReasoner.matched(mazes.deq(8, 2, key=jax.random.key(1)), depth=3,
                                       key=jax.random.key(2))
    assert matched.shape == mazes.SHAPE
    ```
    """
    return nn.GraphReasoner.explicit(
        dim, heads, depth=depth, key=key, hidden=hidden, dtype=dtype, **SHAPE
    )
