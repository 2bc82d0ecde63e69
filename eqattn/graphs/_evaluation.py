"""The graph task's loss and scores for every algorithm: the training step's loss, the scores of
a model on a batch, and the evaluation by family, size, hops from the source and solver
budget."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._graph import Graph
from ..train import apply
from ._algorithms import AbstractAlgorithm, algorithm_of
from ._edges import parent_loss_and_right
from ._model import solve_graphs
from ._predict import budget_for, choose_parents
from ._references import hops as _hops
from ._scores import _by_distance
from ._weighted import WEIGHTED_FAMILIES, WeightedGraphs, sample_weighted

FLOOR = -1e4
"""In the loss, a score of -inf counts as this. Only edges
into the source (read as never a parent) and from nodes the solve did not reach are -inf: the
source, the unreachable and a node whose parent the budget missed then cost a large, finite
loss. A reached node's other edges come from reached nodes and keep their scores, so its chosen
parent is the same either way."""


def examples(g: WeightedGraphs, algorithm: AbstractAlgorithm, real=None):
    """A batch as the models read it, with its targets: `((graph, anchors [B, n]), (edge_ok
    [B, E], self_ok [B, n], real [B, n]))`.

    **Example:**

    ```python
    from eqattn import graphs

    g = graphs.sample_weighted("path", 5, 2, seed=0)
    (graph, anchors), (edge_ok, self_ok, real) = graphs.examples(g, graphs.ALGORITHMS["mst"])
    assert anchors.sum() == 2 and edge_ok.sum() == 2 * 4  # on a path, each tree edge once
    ```
    """
    n = g.graph.num_nodes
    anchors = np.arange(n) == g.source[:, None]
    edge_ok, self_ok = algorithm.targets(g)
    real = np.ones(anchors.shape, bool) if real is None else real
    return (g.graph, anchors), (edge_ok, self_ok, real)


def parent_scores(logits, inputs, targets):
    """Per node: minus the log-probability of its valid parents and whether its chosen parent
    is valid (a batch of `examples`)."""
    graph, _ = inputs
    edge_ok, self_ok, _ = targets
    floored = jnp.where(jnp.isfinite(logits.edges), logits.edges, FLOOR)
    return jax.vmap(parent_loss_and_right)(floored, logits.own, graph, edge_ok, self_ok)


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


def right_parents(parent: np.ndarray, graph: Graph, targets) -> np.ndarray:
    """Per node `[B, n]`: whether `parent` is a valid one (numpy; -1, no answer, never is)."""
    senders, receivers = np.asarray(graph.senders), np.asarray(graph.receivers)
    edge_ok, self_ok, _ = targets
    n = parent.shape[1]
    right = self_ok & (parent == np.arange(n))
    for b in range(parent.shape[0]):
        real = receivers[b] < n
        chosen = real & edge_ok[b] & (parent[b][np.minimum(receivers[b], n - 1)] == senders[b])
        right[b, receivers[b][chosen]] = True
    return right


def right_reach(parent: np.ndarray, targets) -> np.ndarray:
    """Per node `[B, n]`: whether its reachability, as a parent reads it (itself: unreachable,
    or the source; another node: reachable; -1: no answer), is right (numpy)."""
    _, self_ok, _ = targets
    own = parent == np.arange(parent.shape[1])
    return (parent >= 0) & (own == self_ok)


def answer(model, inputs, budget: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each node's parent as `graphs.predict` names it `[B, n]`, each solve's steps and
    convergence, for a batch of `examples`."""
    graph, anchors = inputs
    arrays = (graph, jnp.asarray(anchors))
    scores, steps, converged = solve_graphs(model, arrays, jnp.asarray(budget))
    source = np.argmax(anchors, axis=1)
    return choose_parents(scores, graph, source, np.asarray(converged)), steps, converged


def parent_accuracy(model, inputs, targets, budget: int) -> dict[str, float]:
    """The shares of real nodes with a valid parent, with reachability right and without an
    answer (unresolved), and the solves' statistics."""
    parent, steps, converged = answer(model, inputs, budget)
    real = targets[2]
    right = right_parents(parent, inputs[0], targets)
    share = float(np.sum(right & real) / np.sum(real))
    return dict(
        accuracy=share,
        reach_accuracy=float(np.sum(right_reach(parent, targets) & real) / np.sum(real)),
        parent_accuracy=share,
        unresolved=float(np.sum((parent < 0) & real) / np.sum(real)),
        mean_solver_steps=float(np.mean(steps)),
        converged=float(np.mean(converged)),
    )


def score_parents(g: WeightedGraphs, parent, algorithm) -> np.ndarray:
    """Per node `[B, n]`: whether `parent [B, n]` (e.g. `graphs.predict(...).parent`) is a
    valid one for `algorithm` (a name of `ALGORITHMS`, or one of them) on the graphs `g` (the
    references: hops for BFS; scipy's Dijkstra, any parent on a shortest path within a relative
    1e-6; its minimum spanning tree under the tie rule, rooted at the source).

    **Example:**

    ```python
    import numpy as np
    from eqattn import graphs

    g = graphs.sample_weighted("path", 5, 1, seed=0)
    itself = np.arange(5)[None]  # every node its own parent: right for the source alone
    assert graphs.score_parents(g, itself, "shortest-paths").sum() == 1
    ```
    """
    _, targets = examples(g, algorithm_of(algorithm))
    return right_parents(np.asarray(parent), g.graph, targets)


def hops(g: WeightedGraphs) -> np.ndarray:
    """Edges from each graph's source `[B, n]` (-1 where unreachable).

    **Example:**

    ```python
    from eqattn import graphs

    g = graphs.sample_weighted("path", 5, 1, seed=0)
    assert sorted(graphs.hops(g)[0].tolist())[-1] >= 2  # a path of 5 nodes: 2 to 4 edges deep
    ```
    """
    return _hops(g.graph, g.source)


SIZES = {16: 32, 64: 16, 256: 4, 1024: 2, 4096: 1}
"""Nodes per graph, and how many graphs of each family are scored at that size."""
SWEEP = (0.25, 1.0, 4.0)
"""The budgets a DEQ is scored at up to 256 nodes, as multiples of the rule."""


SHARED_EDGES = 16384
"""Up to this many edges a graph, the families of one size are padded to one shape, so that
their solves share one compiled program (the default run's side by side at 256 and 1024 nodes:
4 compilations instead of 14); wider graphs keep their own (a solve of thousands of steps over
8 x padding costs more than a compilation)."""


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
    algorithm = algorithm_of(config.algorithm)
    rows = []
    for n, count in sizes.items():
        chosen = families or WEIGHTED_FAMILIES
        drawn = [sample_weighted(f, n, count, seed=1000 + n) for f in chosen]
        edges = max(g.graph.senders.shape[1] for g in drawn)
        for family, g in zip(chosen, drawn):
            g = g.padded(edges) if edges <= SHARED_EDGES else g
            inputs, targets = examples(g, algorithm)

            def solve(budget):
                parent, steps, converged = answer(model, inputs, budget)
                right = right_parents(parent, g.graph, targets)
                reach = right_reach(parent, targets)
                return _row(budget, right, reach, parent, steps, converged), right

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


def _row(budget, right, reach, parent, steps, converged) -> dict[str, Any]:
    share = float(right.mean())
    return dict(
        max_steps=int(budget),
        accuracy=share,
        reach_accuracy=float(reach.mean()),
        parent_accuracy=share,
        unresolved=float((parent < 0).mean()),
        mean_steps=float(np.mean(steps)),
        converged=float(np.mean(converged)),
    )
