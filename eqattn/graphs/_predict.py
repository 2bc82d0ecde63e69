"""Predictions of a trained graph model on any graphs, and loading one from a run."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._errors import ConfigError
from ._bfs import check_graphs
from ._edges import EdgeList, bucket, check_edges, edge_list
from ._model import solve_graphs
from ._weighted import ALGORITHMS, check_weights


def budget_for(n: int) -> int:
    """The solver's step budget for graphs of `n` nodes: `2 n + 8`. A node's state changes in
    the step after its parent's did, so a solve from zero states takes the source's
    eccentricity (at most `n - 1`) plus a step or two to see nothing move; twice that keeps a
    margin.

    **Example:**

    ```python
    from eqattn import graphs

    assert graphs.budget_for(16) == 40 and graphs.budget_for(256) == 520
    ```
    """
    return 2 * int(n) + 8


class GraphPrediction(NamedTuple):
    """`reachable [B, n]` (bool), each node's `parent [B, n]` (int: itself for the source and
    the unreachable), and each graph's solve: `steps [B]` and `converged [B]` (an explicit
    model's are 0 and True).

    **Example:**

    ```python
    from eqattn import graphs

    assert graphs.GraphPrediction._fields == ("reachable", "parent", "steps", "converged")
    ```
    """

    reachable: np.ndarray
    parent: np.ndarray
    steps: np.ndarray
    converged: np.ndarray


def _padded(graph: EdgeList, rows: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The batch's senders and receivers padded to `rows` graphs of `size` nodes and a power of
    two of edges."""
    (count, width), n = graph.senders.shape, graph.num_nodes
    senders = np.zeros((rows, bucket(width)), np.int32)
    receivers = np.full((rows, bucket(width)), size, np.int32)
    senders[:count, :width] = graph.senders
    receivers[:count, :width] = np.where(graph.receivers == n, size, graph.receivers)
    return senders, receivers


def predict(model, graph, source, *, weights=None, budget=None) -> GraphPrediction:
    """Reachability and a parent for every node of each graph, from a model of `eqattn train
    --task graphs` ([`load_model`][eqattn.graphs.load_model]): a BFS parent, a parent on a
    shortest path, or the parent in the minimum spanning tree, whichever `model.algorithm` it
    learned. `weights` (required by the weighted algorithms, refused by `bfs`): each edge's
    weight, finite and non-negative, `[B, n, n]` with dense adjacencies (symmetric, 0 where no
    edge) or `[B, E]` with an edge list. `graph`: dense adjacencies `[B, n, n]` (bool) or an
    [`EdgeList`][eqattn.graphs.EdgeList] (`[B, E]` senders and receivers, both directions of
    each undirected edge); `source [B]` int; numpy or JAX arrays, any n, E and batch: read as
    edges (a step costs O(E)) and padded inside (isolated nodes, padding edges, empty graphs,
    which change nothing) to powers of two. A DEQ's solve gets `budget` steps (default the rule
    [`budget_for`][eqattn.graphs.budget_for] of n; at least 1). Bad input is a `ValueError`
    naming the argument.

    **Example:**

    ```python
    import jax
    from eqattn import graphs

    model = graphs.GraphDEQ(4, "bfs", key=jax.random.key(0))  # untrained: shapes only
    g = graphs.sample("tree", 10, 3, seed=0)
    out = graphs.predict(model, g.adjacency, g.source)
    assert out.reachable.shape == out.parent.shape == (3, 10) and out.steps.shape == (3,)
    same = graphs.predict(model, graphs.edge_list(g.adjacency), g.source)  # as an edge list
    assert (same.parent == out.parent).all()
    ```
    """
    if isinstance(graph, EdgeList):
        graph, source = check_edges(graph, source)
        dense = None
    else:
        dense, source = check_graphs(graph, source)
        graph = edge_list(dense)
    if budget is not None and not (isinstance(budget, int | np.integer) and budget >= 1):
        raise ConfigError(f"`budget` must be an integer >= 1 (solver steps); got {budget!r}")
    algorithm = getattr(model, "algorithm", None)
    if algorithm not in ALGORITHMS:
        raise ConfigError(
            f"`model` must be a graph model (`GraphDEQ`, `GraphStack`, `load_model`); got "
            f"{type(model).__name__}"
        )
    if algorithm != "bfs" and weights is None:
        raise ConfigError(f"`weights` is required: the model learned {algorithm}")
    if algorithm == "bfs" and weights is not None:
        raise ConfigError("`weights` is for the weighted algorithms' models; this one learned bfs")
    steps = budget_for(graph.num_nodes) if budget is None else int(budget)
    if weights is None:  # bfs: every edge's weight 1
        w = (graph.receivers < graph.num_nodes).astype(np.float32)
    else:
        w = check_weights(graph, weights, dense)
    return _solve(model, graph, source, w, steps)


def _solve(model, edges: EdgeList, source, w: np.ndarray, budget: int) -> GraphPrediction:
    """`predict` on checked input, padded to powers of two of graphs, nodes and edges."""
    (count, width), n = edges.senders.shape, edges.num_nodes
    rows, size = bucket(count), bucket(n)
    senders, receivers = _padded(edges, rows, size)
    padded_w = np.zeros(senders.shape, np.float32)
    padded_w[:count, :width] = w
    anchors = np.zeros((rows, size), bool)
    anchors[np.arange(count), source] = True
    inputs = tuple(map(jnp.asarray, (anchors, senders, receivers, padded_w)))
    parent, steps, converged = jax.device_get(solve_graphs(model, inputs, jnp.asarray(budget)))
    parent = parent[:count, :n]
    reachable = (parent != np.arange(n)) | anchors[:count, :n]
    return GraphPrediction(reachable, parent, steps[:count], converged[:count])
