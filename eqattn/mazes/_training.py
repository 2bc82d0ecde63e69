r"""Training and scoring mazes models, as the reasoning tasks share them
([`eqattn.train`][]'s reasoning functions): the DEQ by path independence from partly solved
starts, then [`reach`][eqattn.mazes.reach] steps with gradient (Anil et al. 2022; Bansal et al.
2022); a maze counts as solved only if every cell is right."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray

from .. import nn, train
from ._data import Mazes, draw_mazes
from ._model import reach


def loss(
    model: nn.GraphReasoner,
    mazes: Mazes,
    key: PRNGKeyArray,
    *,
    steps: int | None = None,
    warm: float = 1.0,
    penalty: float = 0.0,
) -> tuple[Array, train.ReasoningStats]:
    """A batch's mean cross-entropy over cells and its statistics (the share of mazes solved,
    and a DEQ's steps, residual and convergence): a DEQ's after a random partial solve of at
    most `warm` times `steps` steps and `steps` steps with gradient (default
    [`reach`][eqattn.mazes.reach] of the size), plus `penalty` times the relative residual
    after `steps` steps from zeros (`train.reasoning_loss`); an
    explicit model's of its output.

    **Example:**

    ```python
    import jax, numpy as np
    from eqattn import mazes

    model = mazes.deq(8, 2, key=jax.random.key(0))
    batch = mazes.draw_mazes(np.random.default_rng(0), 2, 3)
    value, (solved, steps, residual, converged) = mazes.loss(model, batch, jax.random.key(1))
    assert value > 0 and 0 <= solved <= 1 and mazes.reach(3) <= steps <= 2 * mazes.reach(3)
    ```
    """
    if not isinstance(mazes, Mazes):
        raise TypeError(f"`mazes` must be a mazes.Mazes batch; got {type(mazes).__name__}")
    if not warm >= 0 or not penalty >= 0:
        raise ValueError(f"`warm` and `penalty` must be >= 0; got {warm} and {penalty}")
    count = reach(mazes.size) if steps is None else steps
    return train.reasoning_loss(
        model,
        mazes.inputs,
        mazes.graph,
        mazes.targets,
        key,
        steps=count,
        warm=int(warm * count),
        penalty=penalty,
    )


def mixed_loss(
    model: nn.GraphReasoner,
    batches: Sequence[Mazes],
    key: PRNGKeyArray,
    *,
    warm: float = 1.0,
    penalty: float = 0.0,
    extra: int = 0,
) -> tuple[Array, train.ReasoningStats]:
    """A step's loss over batches of several sizes: the mean of their `loss`es (`warm` and
    `penalty` as there; `reach` + `extra` steps with gradient), each size weighing alike, and
    of their statistics.

    **Example:**

    ```python
    import jax, numpy as np
    from eqattn import mazes

    model = mazes.deq(8, 2, key=jax.random.key(0))
    rng = np.random.default_rng(0)
    batches = [mazes.draw_mazes(rng, 2, k) for k in (3, 4)]
    value, stats = mazes.mixed_loss(model, batches, jax.random.key(1))
    assert value.shape == () and len(stats) == 4
    ```
    """
    if not batches:
        raise ValueError("`batches` must hold at least one batch of mazes; got none")
    keys = jax.random.split(key, len(batches))
    parts = [
        loss(model, b, k, steps=reach(b.size) + extra, warm=warm, penalty=penalty)
        for b, k in zip(batches, keys)
    ]
    return train.mean_parts(parts)


def fit(
    model: nn.GraphReasoner,
    *,
    steps: int,
    sizes: tuple[int, ...] = (5, 7, 9),
    batch: int = 8,
    lr: float = 1e-3,
    clip: float = 1.0,
    seed: int = 0,
    warm: float = 1.0,
    penalty: float = 0.0,
) -> tuple[nn.GraphReasoner, list[float]]:
    """`steps` optimizer steps (AdamW at `lr` after clipping the gradient's global norm to
    `clip`), each on `batch` fresh mazes of every one of `sizes` (`mixed_loss`, with `warm` and
    `penalty`): the trained model and each step's loss.

    **Example:**

    ```python
    import jax
    from eqattn import mazes

    model = mazes.deq(8, 2, key=jax.random.key(0))
    model, losses = mazes.fit(model, steps=2, sizes=(3,), batch=2)
    assert len(losses) == 2
    ```
    """
    if not sizes:
        raise ValueError("`sizes` must name at least one maze size; got none")
    return train.reasoning_fit(
        model,
        lambda optimizer: train.reasoning_step(
            optimizer, lambda m, b, k: mixed_loss(m, b, k, warm=warm, penalty=penalty)
        ),
        lambda rng: [draw_mazes(rng, batch, k) for k in sizes],
        steps=steps,
        lr=lr,
        clip=clip,
        seed=seed,
    )


def score(
    model: nn.GraphReasoner,
    mazes: Mazes,
    *,
    budget: int | None = None,
    steps: int | None = None,
) -> dict[str, float]:
    """A batch of mazes of one size: the share solved, every cell right (`mazes`), of cells
    right (`cells`), and for a DEQ solved to its fixed point (within `budget` steps) the mean
    solver steps and the share converged; with `steps`, the DEQ's step run that many times
    instead (the tied control).

    **Example:**

    ```python
    import jax, numpy as np
    from eqattn import mazes

    model = mazes.deq(8, 2, key=jax.random.key(0))
    batch = mazes.draw_mazes(np.random.default_rng(0), 2, 4)
    out = mazes.score(model, batch, budget=50)
    assert 0 <= out["mazes"] <= out["cells"] <= 1 and out["steps"] <= 50
    ```
    """
    out = train.reasoning_score(
        model, mazes.inputs, mazes.graph, mazes.targets, budget=budget, steps=steps
    )
    return {"mazes": out.pop("instances"), "cells": out.pop("nodes"), **out}


def score_steps(
    model: nn.GraphReasoner, mazes: Mazes, *, counts: Sequence[int]
) -> list[dict[str, float]]:
    """A DEQ's step run with no stopping test, scored after each of `counts` steps (increasing,
    one run continued): per count, `score`'s fields, `steps` the count and `converged` the share
    of mazes whose state passes the solver's relative test. The tied control, 4 x the budget
    with the stopping test off, and mazes solved against solver steps, from one run.

    **Example:**

    ```python
    import jax, numpy as np
    from eqattn import mazes

    model = mazes.deq(8, 2, key=jax.random.key(0))
    batch = mazes.draw_mazes(np.random.default_rng(0), 2, 4)
    early, late = mazes.score_steps(model, batch, counts=[5, 50])
    assert late["steps"] == 50 and late == mazes.score_steps(model, batch, counts=[50])[0]
    ```
    """
    out = train.reasoning_score_steps(
        model, mazes.inputs, mazes.graph, mazes.targets, counts=counts
    )
    return [{"mazes": r.pop("instances"), "cells": r.pop("nodes"), **r} for r in out]


def path_independence(
    model: nn.GraphReasoner,
    mazes: Mazes,
    *,
    key: PRNGKeyArray,
    budget: int | None = None,
    starts: int = 3,
) -> dict[str, float]:
    """Whether a DEQ's answer depends on where its solve starts (random starts against zeros):
    `agree`, the lowest share of mazes answered alike on every cell; `alignment`, the lowest
    mean cosine between the fixed points (1: the same point).

    **Example:**

    ```python
    import jax, numpy as np
    from eqattn import mazes

    model = mazes.deq(8, 2, key=jax.random.key(0))
    batch = mazes.draw_mazes(np.random.default_rng(0), 2, 3)
    out = mazes.path_independence(model, batch, key=jax.random.key(1), budget=50)
    assert 0 <= out["agree"] <= 1 and -1 <= out["alignment"] <= 1
    ```
    """
    return train.reasoning_paths(
        model, jnp.asarray(mazes.inputs), mazes.graph, key=key, budget=budget, starts=starts
    )
