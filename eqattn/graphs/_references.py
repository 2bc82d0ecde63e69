"""The references the graph task's targets come from, in float64 numpy and scipy: hops from the
source, Dijkstra's distances, and the minimum spanning tree under the tie rule (each edge's rank
by (weight, smaller end, larger end): one tree, whatever ties the weights hold)."""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra, minimum_spanning_tree, shortest_path

from .._graph import Graph


def _batch(graph: Graph, weights: np.ndarray | None = None) -> csr_matrix:
    """The batch as one block-diagonal graph (graph b's node i is node `b n + i`):
    `[sender, receiver]` holds each real edge's weight (`weights [B, E]`, default its edge
    feature, or 1 without one). An explicit 0 is an edge to scipy's Dijkstra."""
    s, r = np.asarray(graph.senders), np.asarray(graph.receivers)
    n = graph.num_nodes
    real = r < n
    if weights is None:
        features = graph.edge_features
        weights = np.ones(s.shape) if features is None else np.asarray(features)[..., 0]
    offset = (np.arange(s.shape[0]) * n)[:, None]
    size = s.shape[0] * n
    w = np.asarray(weights, np.float64)[real]
    return csr_matrix(((w), ((s + offset)[real], (r + offset)[real])), shape=(size, size))


def _rows(d: np.ndarray, n: int) -> np.ndarray:
    """Each source's row of a batch's block-diagonal result `[B, B n]`, as `[B, n]`."""
    count = d.shape[0]
    return d.reshape(count, count, n)[np.arange(count), np.arange(count)]


def _starts(graph: Graph, source) -> np.ndarray:
    return np.arange(len(source)) * graph.num_nodes + np.asarray(source)


def tie_ranks(senders, receivers, weights) -> np.ndarray:
    """Each edge's rank `1 .. m` among the `m` undirected edges in the tie rule's order: by
    weight, then the smaller end, then the larger (both directions of an edge share it)."""
    lo, hi = np.minimum(senders, receivers), np.maximum(senders, receivers)
    order = np.lexsort((hi, lo, weights))
    key = np.stack([weights[order], lo[order], hi[order]], 1)
    new = np.concatenate([[True], np.any(key[1:] != key[:-1], axis=1)])
    ranks = np.empty(len(order), np.int64)
    ranks[order] = np.cumsum(new)
    return ranks


def hops(graph: Graph, source) -> np.ndarray:
    """Edges from each graph's source `[B, n]` (-1 where unreachable)."""
    m = _batch(graph, np.ones(np.shape(graph.senders)))
    d = shortest_path(m, directed=True, unweighted=True, indices=_starts(graph, source))
    d = _rows(d, graph.num_nodes)
    return np.where(np.isfinite(d), d, -1).astype(np.int64)


def shortest_distances(graph: Graph, source) -> np.ndarray:
    """Dijkstra's distances from each graph's source `[B, n]` (float64; inf where unreachable;
    an edge of weight 0 is an edge)."""
    d = dijkstra(_batch(graph), directed=True, indices=_starts(graph, source))
    return _rows(d, graph.num_nodes)


def mst_parents(graph: Graph, source) -> np.ndarray:
    """Each node's parent `[B, n]` in the minimum spanning tree of its graph's source's
    component under the tie rule (`tie_ranks`), rooted at the source (the source and the nodes
    of other components: themselves)."""
    s, r = np.asarray(graph.senders), np.asarray(graph.receivers)
    n, count = graph.num_nodes, len(source)
    ranks = np.zeros(s.shape)
    features = graph.edge_features
    weights = np.ones(s.shape) if features is None else np.asarray(features)[..., 0]
    for b in range(count):  # each graph's own ranks, all >= 1 (scipy's tree drops a weight 0)
        real = r[b] < n
        w = weights[b][real].astype(np.float64)
        ranks[b, real] = tie_ranks(s[b][real], r[b][real], w)
    tree = minimum_spanning_tree(_batch(graph, ranks))
    _, pred = shortest_path(
        tree + tree.T, unweighted=True, indices=_starts(graph, source), return_predecessors=True
    )
    pred = _rows(pred, n)
    out = np.tile(np.arange(n), (count, 1))
    found = pred >= 0
    out[found] = (pred - (np.arange(count) * n)[:, None])[found]
    return out
