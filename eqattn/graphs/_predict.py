"""Predictions of a graph model on any graphs: the parents it names, by a tie rule that makes
them a forest rooted at the source, and what it could not resolve."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import breadth_first_order

from .._errors import ConfigError, GraphError
from .._graph import Graph
from ._algorithms import AbstractAlgorithm
from ._model import ParentScores, solve_graphs
from ._weighted import WeightedGraphs, bucket, check_weighted


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
    """`reachable [B, n]` (bool: the solve reached the node), each node's `parent [B, n]` (int:
    itself for the source and the unreachable; -1 where the model's answer is not resolved),
    and each graph's solve: `steps [B]` and `converged [B]` (an explicit model's are 0 and
    True). The parents other than -1 always form a forest: following them from any node ends
    at the source, or at an unreachable node that is its own parent (`is_forest` checks it).

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

    @property
    def resolved(self) -> np.ndarray:
        """`[B, n]`: where the model named a parent (`parent >= 0`)."""
        return self.parent >= 0


def is_forest(parent: np.ndarray, source: np.ndarray, reachable: np.ndarray | None = None) -> bool:
    """Whether `parent [B, n]` (-1: no answer) is a forest rooted at the sources: following the
    parents from any node that has one ends, without a cycle, at a node that is its own parent:
    its graph's source, or a node not `reachable` (when given).

    **Example:**

    ```python
    import numpy as np
    from eqattn import graphs

    assert graphs.is_forest(np.array([[0, 0, 1, -1]]), np.array([0]))
    assert not graphs.is_forest(np.array([[0, 2, 1, 3]]), np.array([0]))  # 1 and 2: a cycle
    ```
    """
    p = np.asarray(parent)
    count, n = p.shape
    for b in range(count):
        up = np.append(np.where(p[b] >= 0, p[b], n), n)  # n: the end of a chain without answer
        for _ in range(int(np.ceil(np.log2(max(n, 2)))) + 1):
            up = up[up]  # pointer doubling: 2^k steps up
        ends = up[:n][p[b] >= 0]
        if np.any(ends == n) or np.any(p[b][np.minimum(ends, n - 1)] != ends):
            return False
        roots = np.flatnonzero(p[b] == np.arange(n))
        others = roots[roots != source[b]]
        if p[b][source[b]] != source[b] or (reachable is not None and reachable[b][others].any()):
            return False
    return True


def _pad(g: WeightedGraphs, rows: int, size: int, width: int) -> tuple[Graph, np.ndarray]:
    """The batch padded to `rows` graphs of `size` nodes and `width` edges, and its anchors."""
    count, edges = np.shape(g.graph.senders)
    senders = np.zeros((rows, width), np.int32)
    receivers = np.full((rows, width), size, np.int32)
    weights = np.zeros((rows, width, 1), np.float32)
    senders[:count, :edges] = np.asarray(g.graph.senders)
    receivers[:count, :edges] = np.where(np.asarray(g.graph.real), g.graph.receivers, size)
    if g.graph.edge_features is not None:
        weights[:count, :edges, 0] = np.where(np.asarray(g.graph.real), g.weights, 0.0)
    anchors = np.zeros((rows, size), bool)
    anchors[np.arange(count), g.source] = True
    return Graph(senders, receivers, num_nodes=size, edge_features=weights), anchors


def choose_parents(
    scores: ParentScores, graph: Graph, source: np.ndarray, converged: np.ndarray
) -> np.ndarray:
    """Each node's parent `[B, n]` from a model's `ParentScores` (numpy): among a node's
    incoming edges that tie for its best score (`best`, in the model's step's sense: equal
    messages), the sender that a breadth-first search from the source along such edges meets
    first (the tie rule, which makes the parents a forest rooted at the source); -1 for a node
    that is not resolved, or whose best edges do not lead back to the source; itself for the
    source, and for a node the solve did not reach if the solve converged (-1 if not: it may
    have been on its way).

    **Example:**

    ```python
    import numpy as np, eqattn
    from eqattn import graphs

    # a path 0 - 1 - 2 from 0: node 1's best edge comes from 0, node 2's from 1
    g = eqattn.Graph(np.array([[1, 0, 2, 1]]), np.array([[0, 1, 1, 2]]), num_nodes=3)
    scores = graphs.ParentScores(
        edges=np.array([[-np.inf, 0.0, -1.0, 0.0]]), own=np.array([[0.0, -np.inf, -np.inf]]),
        best=np.array([[False, True, False, True]]), resolved=np.ones((1, 3), bool),
        reached=np.ones((1, 3), bool),
    )
    assert graphs.choose_parents(scores, g, np.array([0]), np.array([True])).tolist() == [[0, 0, 1]]
    ```
    """
    best, resolved, reached = map(np.asarray, (scores.best, scores.resolved, scores.reached))
    s_all, r_all = np.asarray(graph.senders), np.asarray(graph.receivers)
    count, n = resolved.shape
    out = np.full((count, n), -1, np.int64)
    for b in range(count):
        s, r = s_all[b], r_all[b]
        allowed = best[b] & (r < n) & resolved[b][np.minimum(r, n - 1)]
        m = csr_matrix((np.ones(allowed.sum()), (s[allowed], r[allowed])), shape=(n, n))
        order, pred = breadth_first_order(m, int(source[b]), directed=True)
        out[b, order] = pred[order]
        out[b, ~reached[b]] = np.arange(n)[~reached[b]] if converged[b] else -1
        out[b, source[b]] = source[b]
    return out


def _check_budget(budget) -> None:
    if budget is not None and not (
        isinstance(budget, int | np.integer) and not isinstance(budget, bool) and budget >= 1
    ):
        raise ConfigError(f"`budget` must be an integer >= 1 (solver steps); got {budget!r}")


def predict(model, graph: Graph, source, *, budget=None, refine: bool = True) -> GraphPrediction:
    """Reachability and a parent for every node of each graph, from a model of `eqattn train
    --task graphs` ([`load_model`][eqattn.graphs.load_model]): a BFS parent, a parent on a
    shortest path, or the parent in the minimum spanning tree (under its tie rule), whichever
    `model.algorithm` it learned.

    `graph`: an undirected [`eqattn.Graph`][] of `[B, E]` edges (both directions of each edge;
    [`from_edges`][eqattn.graphs.from_edges] or [`from_adjacency`][eqattn.graphs.from_adjacency]
    make one), whose one edge feature is the weight (finite, >= 0; BFS reads every edge as 1
    and needs none); `source [B]` int. Any n, E and batch: padded inside to powers of two
    (isolated nodes, padding edges, empty graphs, which change nothing). A DEQ's solve gets
    `budget` steps (default [`budget_for`][eqattn.graphs.budget_for] of n; at least 1).

    Exact where it says so: a node's parent is -1 where the model could not resolve it (its
    best candidates blend at the model's temperature, its state still moved when the solve
    stopped, or its best edges lead nowhere), never a parent the model did not decide; the
    parents form a forest rooted at the source ([`GraphPrediction`][eqattn.graphs.GraphPrediction]).
    Where every solve converged but left nodes unresolved for want of capacity (a spanning
    tree's lists of records cut short), it solves again with more (`GraphDEQ.refined`);
    `refine=False` keeps the model's capacity as it is.
    Bad input is an [`eqattn.GraphError`][] naming the argument.

    **Example:**

    ```python
    import jax
    from eqattn import graphs

    model = graphs.GraphDEQ(4, "bfs", key=jax.random.key(0))  # untrained, and already BFS
    g = graphs.sample("tree", 10, 3, seed=0)
    out = graphs.predict(model, graphs.from_adjacency(g.adjacency), g.source)
    assert out.reachable.shape == out.parent.shape == (3, 10) and out.steps.shape == (3,)
    assert graphs.is_forest(out.parent, g.source)
    ```
    """
    algorithm = getattr(model, "algorithm", None)
    if not isinstance(algorithm, AbstractAlgorithm):
        raise GraphError(
            f"`model` must be a graph model (`GraphDEQ`, `GraphStack`, `load_model`); got "
            f"{type(model).__name__}"
        )
    if not isinstance(graph, Graph):
        raise GraphError(
            f"`graph` must be an eqattn.Graph (graphs.from_edges, graphs.from_adjacency); got "
            f"{type(graph).__name__}"
        )
    _check_budget(budget)
    g = WeightedGraphs(graph, np.asarray(source))
    check_weighted(g, algorithm.weighted)
    steps = budget_for(graph.num_nodes) if budget is None else int(budget)
    return _solve(model, WeightedGraphs(graph, g.source.astype(np.int64)), steps, refine)


def _solve(model, g: WeightedGraphs, budget: int, refine: bool) -> GraphPrediction:
    """`predict` on checked input, padded to powers of two of graphs, nodes and edges."""
    count, edges = np.shape(g.graph.senders)
    n = g.graph.num_nodes
    rows = 1 << (count - 1).bit_length()  # graphs: a power of two, 1 for one
    padded, anchors = _pad(g, rows, bucket(n), bucket(edges))
    inputs = (padded, jnp.asarray(anchors))
    scores, steps, converged = solve_graphs(model, inputs, jnp.asarray(budget), refine=refine)
    scores = jax.tree.map(lambda x: np.asarray(x)[:count], scores)
    converged = np.asarray(converged)[:count]
    one = Graph(
        np.asarray(padded.senders)[:count], np.asarray(padded.receivers)[:count],
        num_nodes=padded.num_nodes,
    )  # fmt: skip
    parent = choose_parents(scores, one, g.source, converged)[:, :n]
    reachable = np.asarray(scores.reached)[:, :n]
    return GraphPrediction(reachable, parent, np.asarray(steps)[:count], converged)
