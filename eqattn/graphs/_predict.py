"""Predictions of a trained graph model on any graphs, and loading one from a run."""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._errors import ConfigError
from ._bfs import check_graphs
from ._edges import DENSE_UP_TO, EdgeList, bucket, check_edges, choose_parent, edge_list
from ._model import IDENTITY_DIM
from ._weighted import check_weights
from ._weighted_model import WeightedGraphDEQ, WeightedGraphStack, solve_weighted


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


def features(source: np.ndarray, n: int, key) -> jax.Array:
    """Every node's input `[B, n, IDENTITY_DIM + 1]`: a random identity vector drawn with `key`
    (normal, one per node and graph), then the source flag.

    **Example:**

    ```python
    import jax, numpy as np
    from eqattn import graphs

    x = graphs.features(np.array([2, 0]), 5, jax.random.key(0))
    assert x.shape == (2, 5, graphs.IDENTITY_DIM + 1) and x[0, 2, -1] == 1 and x[:, :, -1].sum() == 2
    ```
    """
    ids = jax.random.normal(key, (len(source), n, IDENTITY_DIM))
    flag = jax.nn.one_hot(jnp.asarray(source), n)[..., None]
    return jnp.concatenate([ids, flag.astype(ids.dtype)], axis=-1)


@eqx.filter_jit
def solve_batch(model, features, graph, budget):
    """Reachability, parents, steps and convergence of a batch: `graph` is `(adjacency,)` or
    `(senders, receivers)`."""
    p = jax.vmap(lambda f, *g: model.predict((f, *g), budget=budget))(features, *graph)
    if len(graph) == 1:
        parent = jnp.argmax(p.logits[1], -1)
    else:
        parent = jax.vmap(choose_parent)(*p.logits[1:], *graph)
    return p.logits[0] > 0, parent, p.steps, p.converged


def _padded(graph: EdgeList | np.ndarray, rows: int, size: int) -> tuple:
    """The batch as the model reads it, padded to `rows` graphs of `size` nodes: a dense
    adjacency up to `DENSE_UP_TO` nodes, else an edge list padded to a power of two of edges."""
    if not isinstance(graph, EdgeList) and size <= DENSE_UP_TO:
        padded = np.zeros((rows, size, size), bool)
        padded[: len(graph), : graph.shape[1], : graph.shape[1]] = graph
        return (padded,)
    graph = graph if isinstance(graph, EdgeList) else edge_list(graph)
    (count, width), n = graph.senders.shape, graph.num_nodes
    senders = np.zeros((rows, bucket(width)), np.int32)
    receivers = np.full((rows, bucket(width)), size, np.int32)
    senders[:count, :width] = graph.senders
    receivers[:count, :width] = np.where(graph.receivers == n, size, graph.receivers)
    return senders, receivers


def predict(model, graph, source, *, weights=None, budget=None, key=None) -> GraphPrediction:
    """Reachability and a parent for every node of each graph, from a model of `eqattn train
    --task graphs` ([`load_model`][eqattn.graphs.load_model]): a BFS parent, a parent on a
    shortest path, or the parent in the minimum spanning tree, whichever `algorithm` the model
    learned. `weights` (the weighted algorithms' models only, and required by them): each edge's
    weight, finite and non-negative, `[B, n, n]` with dense adjacencies (symmetric, 0 where no
    edge) or `[B, E]` with an edge list. `graph`: dense adjacencies
    `[B, n, n]` (bool) or an [`EdgeList`][eqattn.graphs.EdgeList] (`[B, E]` senders and
    receivers, both directions of each undirected edge); `source [B]` int; numpy or JAX arrays,
    any n, E and batch: padded inside (isolated nodes, padding edges, empty graphs, which change
    nothing) to powers of two. Graphs of more than 128 nodes, and every edge list, are read as
    edges: a step costs O(E). A DEQ's solve gets `budget` steps (default the rule
    [`budget_for`][eqattn.graphs.budget_for] of n; at least 1); `key` draws the nodes' identity
    vectors (default `jax.random.key(0)`). Bad input is a `ValueError` naming the argument.

    **Example:**

    ```python
    import jax
    from eqattn import graphs

    model = graphs.GraphDEQ(16, key=jax.random.key(0))  # untrained: shapes only
    g = graphs.sample("tree", 10, 3, seed=0)
    out = graphs.predict(model, g.adjacency, g.source)
    assert out.reachable.shape == out.parent.shape == (3, 10) and out.steps.shape == (3,)
    same = graphs.predict(model, graphs.edge_list(g.adjacency), g.source)  # as an edge list
    assert (same.parent == out.parent).all()
    ```
    """
    if isinstance(graph, EdgeList):
        graph, source = check_edges(graph, source)
        count, n = graph.senders.shape[0], graph.num_nodes
    else:
        graph, source = check_graphs(graph, source)
        count, n = graph.shape[:2]
    if budget is not None and not (isinstance(budget, int | np.integer) and budget >= 1):
        raise ConfigError(f"`budget` must be an integer >= 1 (solver steps); got {budget!r}")
    weighted = isinstance(model, WeightedGraphDEQ | WeightedGraphStack)
    if weighted and weights is None:
        raise ConfigError("`weights` is required: the model learned a weighted algorithm")
    if not weighted and weights is not None:
        raise ConfigError("`weights` is for the weighted algorithms' models; this one learned bfs")
    steps = budget_for(n) if budget is None else int(budget)
    if weighted:
        return _predict_weighted(model, graph, source, weights, steps)
    rows, size = bucket(count), bucket(n)
    src = np.zeros(rows, np.int64)
    src[:count] = source
    key = jax.random.key(0) if key is None else key
    x = features(src, size, key).at[count:].set(0.0)  # no source in the padding's graphs
    solved = solve_batch(model, x, _padded(graph, rows, size), jnp.asarray(steps))
    reach, parent, used, converged = jax.device_get(solved)
    return GraphPrediction(reach[:count, :n], parent[:count, :n], used[:count], converged[:count])


def _predict_weighted(model, graph, source, weights, budget: int) -> GraphPrediction:
    """`predict` for the weighted algorithms' models: always over edges, padded to powers of
    two of graphs, nodes and edges."""
    dense = None if isinstance(graph, EdgeList) else graph
    edges = graph if dense is None else edge_list(dense)
    w = check_weights(edges, weights, dense)
    (count, width), n = edges.senders.shape, edges.num_nodes
    rows, size = bucket(count), bucket(n)
    senders, receivers = _padded(edges, rows, size)
    padded_w = np.zeros(senders.shape, np.float32)
    padded_w[:count, :width] = w
    anchors = np.zeros((rows, size), bool)
    anchors[np.arange(count), source] = True
    inputs = tuple(map(jnp.asarray, (anchors, senders, receivers, padded_w)))
    parent, steps, converged = jax.device_get(solve_weighted(model, inputs, jnp.asarray(budget)))
    parent = parent[:count, :n]
    reachable = (parent != np.arange(n)) | anchors[:count, :n]
    return GraphPrediction(reachable, parent, steps[:count], converged[:count])
