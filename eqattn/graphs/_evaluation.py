"""The graph task's loss and scores for every algorithm: the training step's loss, the scores of
a model on a batch, and the evaluation by family, size, hops from the source and solver
budget."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from scipy.sparse.csgraph import shortest_path

from ..train import apply
from ._edges import parent_loss_and_right
from ._model import solve_graphs
from ._predict import budget_for
from ._scores import _by_distance
from ._weighted import (
    WEIGHTED_FAMILIES,
    WeightedGraphs,
    _matrix,
    sample_weighted,
    weighted_examples,
)

FLOOR = -1e4
"""In the loss, a score of -inf counts as this. Only edges into the source (read as never a
parent) and from nodes the solve did not reach are -inf: the source, the unreachable and a node
whose parent the budget missed then cost a large, finite loss. A reached node's other edges
come from reached nodes and keep their scores, so its chosen parent is the same either way."""


def parent_scores(logits, inputs, targets):
    """Per node: minus the log-probability of its valid parents and whether its chosen parent
    is valid (a batch of `weighted_examples`)."""
    scores, own = logits
    _, senders, receivers, _ = inputs
    edge_ok, self_ok, _ = targets
    floored = jnp.where(jnp.isfinite(scores), scores, FLOOR)
    return jax.vmap(parent_loss_and_right)(floored, own, senders, receivers, edge_ok, self_ok)


def make_step(budget: int, optimizer):
    """The graph task's optimizer step (`Step`) on `model.predict` at `budget` solver steps, the
    loss `parent_scores`; stats = (share of real nodes with a valid parent, mean solver steps,
    mean relative residual, share converged)."""

    def loss_fn(model, inputs, targets):
        p = jax.vmap(lambda x: model.predict(x, budget=budget))(inputs)
        loss, right = parent_scores(p.logits, inputs, targets)
        real = targets[2].astype(loss.dtype)
        nodes = jnp.sum(real)
        accuracy = jnp.sum(right * real) / nodes
        stats = (accuracy, p.steps.mean(), p.residual.mean(), p.converged.mean())
        return jnp.sum(loss * real) / nodes, stats

    def step(model, opt_state, inputs, targets, key, z0):
        del key, z0  # no dropout, no warm start
        (loss, stats), grads = eqx.filter_value_and_grad(loss_fn, has_aux=True)(
            model, inputs, targets
        )
        return *apply(optimizer, model, opt_state, grads), loss, stats, None

    return step


def right_parents(parent: np.ndarray, inputs, targets) -> np.ndarray:
    """Per node `[B, n]`: whether `parent` is a valid one (numpy)."""
    _, senders, receivers, _ = inputs
    edge_ok, self_ok, _ = targets
    n = parent.shape[1]
    right = self_ok & (parent == np.arange(n))
    for b in range(parent.shape[0]):
        real = receivers[b] < n
        chosen = real & edge_ok[b] & (parent[b][np.minimum(receivers[b], n - 1)] == senders[b])
        right[b, receivers[b][chosen]] = True
    return right


def right_reach(parent: np.ndarray, targets) -> np.ndarray:
    """Per node `[B, n]`: whether its reachability (as `predict` reads it: a parent other than
    itself, or the source) is right (numpy)."""
    _, self_ok, _ = targets
    return (parent == np.arange(parent.shape[1])) == self_ok


def parent_accuracy(model, inputs, targets, budget: int) -> dict[str, float]:
    """The shares of real nodes with a valid parent and with reachability right, and the
    solves' statistics."""
    parent, steps, converged = jax.device_get(
        solve_graphs(model, tuple(map(jnp.asarray, inputs)), jnp.asarray(budget))
    )
    real = targets[2]
    right = right_parents(parent, inputs, targets)
    share = float(np.sum(right & real) / np.sum(real))
    return dict(
        accuracy=share,
        reach_accuracy=float(np.sum(right_reach(parent, targets) & real) / np.sum(real)),
        parent_accuracy=share,
        mean_solver_steps=float(np.mean(steps)),
        converged=float(np.mean(converged)),
    )


def score_parents(g: WeightedGraphs, parent, algorithm: str) -> np.ndarray:
    """Per node `[B, n]`: whether `parent [B, n]` (e.g. `graphs.predict(...).parent`) is a
    valid one for `algorithm` on the graphs `g` (the references: scipy's Dijkstra, any parent
    on a shortest path; its minimum spanning tree rooted at the source).

    **Example:**

    ```python
    import numpy as np
    from eqattn import graphs

    g = graphs.sample_weighted("path", 5, 1, seed=0)
    itself = np.arange(5)[None]  # every node its own parent: right for the source alone
    assert graphs.score_parents(g, itself, "shortest-paths").sum() == 1
    ```
    """
    inputs, targets = weighted_examples(g, algorithm)
    return right_parents(np.asarray(parent), inputs, targets)


def hops(g: WeightedGraphs) -> np.ndarray:
    """Edges from each graph's source `[B, n]` (-1 where unreachable).

    **Example:**

    ```python
    from eqattn import graphs

    g = graphs.sample_weighted("path", 5, 1, seed=0)
    assert sorted(graphs.hops(g)[0].tolist())[-1] >= 2  # a path of 5 nodes: 2 to 4 edges deep
    ```
    """
    s, r, n = g.edges
    out = []
    for b in range(len(g.source)):
        m = _matrix(s[b], r[b], np.ones_like(g.weights[b]), n)
        d = shortest_path(m, directed=False, unweighted=True, indices=int(g.source[b]))
        out.append(np.where(np.isfinite(d), d, -1).astype(np.int64))
    return np.stack(out)


SIZES = {16: 32, 64: 16, 256: 4, 1024: 2, 4096: 1}
"""Nodes per graph, and how many graphs of each family are scored at that size."""
SWEEP = (0.25, 1.0, 4.0)
"""The budgets a DEQ is scored at up to 256 nodes, as multiples of the rule."""


def evaluate_parents(
    model,
    config,
    budgets: list[int] | None,
    tick=None,
    sizes=SIZES,
    sweep: bool = True,
    families=None,
) -> list[dict[str, Any]]:
    """One row per family and size: the share of valid parents at the budget rule, against the
    budget (a DEQ up to 256 nodes), and by hops from the source."""
    rows = []
    for n, count in sizes.items():
        for family in families or WEIGHTED_FAMILIES:
            g = sample_weighted(family, n, count, seed=1000 + n)
            inputs, targets = weighted_examples(g, config.algorithm)
            arrays = tuple(map(jnp.asarray, inputs))

            def solve(budget):
                parent, steps, converged = jax.device_get(
                    solve_graphs(model, arrays, jnp.asarray(budget))
                )
                right = right_parents(parent, inputs, targets)
                reach = right_reach(parent, targets)
                return _row(budget, right, reach, steps, converged), right

            rule, h = budget_for(n), hops(g)
            at_rule, right = solve(rule)
            row = dict(family=family, n=n, graphs=count, max_distance=int(h.max()))
            row.update(budget_rule=rule, at_rule=at_rule, by_distance=_by_distance(h, right))
            if sweep and config.model == "deq" and n <= 256:
                chosen = sorted(set(budgets or [int(f * rule) for f in SWEEP]))
                row["sweep"] = [at_rule if b == rule else solve(b)[0] for b in chosen]
            rows.append(row)
            if tick is not None:
                tick()
    return rows


def _row(budget, right, reach, steps, converged) -> dict[str, Any]:
    share = float(right.mean())
    return dict(
        max_steps=int(budget),
        accuracy=share,
        reach_accuracy=float(reach.mean()),
        parent_accuracy=share,
        mean_steps=float(np.mean(steps)),
        converged=float(np.mean(converged)),
    )
