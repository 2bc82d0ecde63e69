"""Weighted graphs for the shortest-path and spanning-tree algorithms: families drawn as edge
lists (no n^2 array, so thousands of nodes are cheap), and the scipy references that define the
targets (Dijkstra's distances, the minimum spanning tree rooted at the source)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import breadth_first_order, dijkstra, minimum_spanning_tree
from scipy.spatial import Delaunay, cKDTree

from .._errors import ConfigError
from ._edges import EdgeList, bucket
from ._families import _FAMILIES

ALGORITHMS = ("bfs", "shortest-paths", "mst")
"""The algorithms of the graph task: breadth-first search (unweighted), shortest paths
(Bellman-Ford and Dijkstra's output: a parent on a shortest path) and the minimum spanning tree
of the source's component rooted at the source (Prim's output)."""


def _points(n: int, rng) -> np.ndarray:
    return rng.random((n, 2))


def _geometric(n: int, rng):
    """Points uniform in the unit square, joined within the radius `sqrt(1.5 log n / (pi n))`
    (mean degree about 1.5 log n, near the connectivity threshold: a few nodes stay apart)."""
    p = _points(n, rng)
    radius = np.sqrt(1.5 * np.log(max(n, 2)) / (np.pi * n))
    e = np.array(sorted(cKDTree(p).query_pairs(radius)), np.int64).reshape(-1, 2)
    return e, np.linalg.norm(p[e[:, 0]] - p[e[:, 1]], axis=-1)


def _delaunay(n: int, rng):
    """The Delaunay triangulation of points uniform in the unit square (a path below 4 nodes)."""
    p = _points(n, rng)
    if n < 4:
        e = np.array([(i, i + 1) for i in range(n - 1)], np.int64).reshape(-1, 2)
    else:
        simplices = Delaunay(p).simplices
        pairs = np.concatenate([simplices[:, [0, 1]], simplices[:, [1, 2]], simplices[:, [0, 2]]])
        e = np.unique(np.sort(pairs, axis=1), axis=0)
    return e, np.linalg.norm(p[e[:, 0]] - p[e[:, 1]], axis=-1)


def _uniform(family):
    def draw(n: int, rng):
        e = np.array(_FAMILIES[family](n, rng), np.int64).reshape(-1, 2)
        return e, 1.0 - rng.random(len(e))  # uniform in (0, 1]

    return draw


_WEIGHTED = {name: _uniform(name) for name in _FAMILIES} | {
    "geometric": _geometric,
    "delaunay": _delaunay,
}
WEIGHTED_FAMILIES = tuple(_WEIGHTED)
"""The weighted families: the unweighted ones (`FAMILIES`) with weights uniform in (0, 1], and
random geometric and Delaunay graphs of points in the unit square with Euclidean weights."""


class WeightedGraphs(NamedTuple):
    """A batch of undirected weighted graphs: `edges` (an [`EdgeList`][eqattn.graphs.EdgeList],
    both directions of each edge), each directed edge's `weights [B, E]` (0 on padding) and each
    graph's `source [B]`.

    **Example:**

    ```python
    from eqattn import graphs

    g = graphs.sample_weighted("delaunay", 50, 2, seed=0)
    assert g.edges.num_nodes == 50 and g.weights.shape == g.edges.senders.shape
    ```
    """

    edges: EdgeList
    weights: np.ndarray
    source: np.ndarray


def sample_weighted(
    family: str, n: int, count: int, *, seed: int, edges: int | None = None
) -> WeightedGraphs:
    """`count` weighted graphs of `family` (`WEIGHTED_FAMILIES`) with `n` nodes, the same for the
    same `seed`, nodes in a random order and a random source, padded to `edges` directed edges
    (default the largest count rounded up to a power of two).

    **Example:**

    ```python
    import numpy as np
    from eqattn import graphs

    g = graphs.sample_weighted("grid", 9, 1, seed=0)  # a 3 x 3 grid, weights in (0, 1]
    real = g.edges.receivers[0] < 9
    assert real.sum() == 2 * 12 and (g.weights[0][real] > 0).all() and g.source.shape == (1,)
    ```
    """
    if family not in _WEIGHTED:
        raise ConfigError(f"`family` must be one of {', '.join(WEIGHTED_FAMILIES)}; got {family!r}")
    rng = np.random.default_rng(seed)
    pairs, weights, source = [], [], []
    for _ in range(count):
        order = rng.permutation(n)
        e, w = _WEIGHTED[family](n, rng)
        pairs.append(order[e])
        weights.append(w)
        source.append(int(rng.integers(0, n)))
    return from_edges(n, pairs, source, weights=weights, edges=edges)


def from_edges(
    num_nodes: int, pairs, source, *, weights=None, edges: int | None = None
) -> WeightedGraphs:
    """A batch of undirected graphs on `num_nodes` nodes each, from each graph's edges: `pairs`
    a list of `[E_b, 2]` node pairs (each undirected edge once), `source [B]` and `weights` a
    list of `[E_b]` (default 1), padded to `edges` directed edges (default the largest count
    rounded up to a power of two). Graphs of another library go in this way (networkx:
    `list(G.edges)`); `graphs.predict`, `score_parents` and `hops` read the batch. A one-line
    `ValueError` names the argument that is out of range, a self-loop or a repeated edge.

    **Example:**

    ```python
    from eqattn import graphs

    g = graphs.from_edges(3, [[(0, 1), (1, 2)]], [0], weights=[[0.5, 2.0]])  # 0 - 1 - 2
    assert g.edges.receivers[0].tolist()[:4] == [0, 1, 1, 2] and g.weights[0, 1] == 2.0
    ```
    """
    n = int(num_nodes)
    source = np.asarray(source)
    if n < 1 or source.shape != (len(pairs),):
        raise ConfigError(
            f"`source` must hold one node per graph of `pairs` ({len(pairs)}), `num_nodes` >= 1;"
            f" got source of shape {list(source.shape)}, num_nodes {num_nodes}"
        )
    if not np.issubdtype(source.dtype, np.integer) or np.any((source < 0) | (source >= n)):
        raise ConfigError(f"`source` must be node indices in [0, {n}); got {source.tolist()}")
    if weights is not None and len(weights) != len(pairs):
        raise ConfigError(
            f"`weights` must hold one array per graph ({len(pairs)}); got {len(weights)}"
        )
    drawn = []
    for b, e in enumerate(pairs):
        e = np.asarray(e).reshape(-1, 2) if np.size(e) == 0 else np.asarray(e)
        if e.ndim != 2 or e.shape[1] != 2 or not np.issubdtype(e.dtype, np.integer):
            raise ConfigError(f"`pairs[{b}]` must be node pairs [E, 2] (integers); got {e.shape}")
        if np.any((e < 0) | (e >= n)):
            raise ConfigError(f"`pairs[{b}]` holds a node outside [0, {n})")
        if np.any(e[:, 0] == e[:, 1]):
            raise ConfigError(f"`pairs[{b}]` holds a self-loop")
        if len(np.unique(np.sort(e, axis=1), axis=0)) < len(e):
            raise ConfigError(f"`pairs[{b}]` holds an edge twice (each undirected edge once)")
        w = np.ones(len(e)) if weights is None else np.asarray(weights[b], np.float64)
        if w.shape != (len(e),):
            raise ConfigError(
                f"`weights[{b}]` must have one per pair, shape [{len(e)}]; got {list(w.shape)}"
            )
        if not np.all(np.isfinite(w)) or np.any(w < 0):
            raise ConfigError(f"`weights[{b}]` must be finite and non-negative")
        i, j = e[:, 0], e[:, 1]
        drawn.append((np.concatenate([j, i]), np.concatenate([i, j]), np.concatenate([w, w])))
    width = bucket(max((len(d[0]) for d in drawn), default=0)) if edges is None else int(edges)
    senders = np.zeros((len(pairs), width), np.int32)
    receivers = np.full((len(pairs), width), n, np.int32)
    out = np.zeros((len(pairs), width), np.float32)
    for b, (s, r, w) in enumerate(drawn):
        if len(s) > width:
            raise ConfigError(f"`edges` ({width}) is fewer than graph {b}'s {len(s)} edges")
        senders[b, : len(s)], receivers[b, : len(s)], out[b, : len(s)] = s, r, w
    return WeightedGraphs(EdgeList(senders, receivers, n), out, source.astype(np.int64))


def _matrix(s, r, w, n) -> csr_matrix:
    real = r < n
    return csr_matrix((w[real].astype(np.float64), (r[real], s[real])), shape=(n, n))


def shortest_distances(g: WeightedGraphs) -> np.ndarray:
    """Dijkstra's distances from each graph's source `[B, n]` (float64; inf where unreachable)."""
    s, r, n = g.edges
    return np.stack(
        [
            dijkstra(_matrix(s[b], r[b], g.weights[b], n), directed=False, indices=g.source[b])
            for b in range(len(g.source))
        ]
    )


def mst_parents(g: WeightedGraphs) -> np.ndarray:
    """Each node's parent `[B, n]` in the minimum spanning tree of its graph's source's component,
    rooted at the source (the source and the nodes of other components: themselves)."""
    s, r, n = g.edges
    out = np.tile(np.arange(n), (len(g.source), 1))
    for b in range(len(g.source)):
        # scipy's spanning tree drops edges of weight 0 (zero-length roads); the tree depends
        # only on the weights' order, which adding the least positive weight to each keeps
        w = g.weights[b].astype(np.float64)
        positive = w[(r[b] < n) & (w > 0)]
        shift = positive.min() if positive.size else 1.0
        tree = minimum_spanning_tree(_matrix(s[b], r[b], w + shift, n))
        _, pred = breadth_first_order(tree + tree.T, int(g.source[b]), directed=False)
        out[b, pred >= 0] = pred[pred >= 0]
    return out


def unit_weights(g: WeightedGraphs) -> WeightedGraphs:
    """`g` with every edge's weight 1 (padding 0): breadth-first search is shortest paths on
    these."""
    return g._replace(weights=(g.edges.receivers < g.edges.num_nodes).astype(np.float32))


def edge_targets(g: WeightedGraphs, algorithm: str) -> tuple[np.ndarray, np.ndarray]:
    """Per edge whether its sender is a valid parent of its receiver `[B, E]`, per node whether
    it is its own `[B, n]`: on a shortest path (any one where paths tie, within a relative 1e-6;
    `bfs`: counting edges) or the spanning tree's parent; the source and the unreachable are
    their own."""
    if algorithm == "bfs":
        g = unit_weights(g)
    s, r, n = g.edges
    real = r < n
    rc = np.minimum(r, n - 1)
    if algorithm == "mst":
        parent = mst_parents(g)
        own = parent == np.arange(n)
        return real & (np.take_along_axis(parent, rc, 1) == s), own
    d = shortest_distances(g)
    dr, ds = np.take_along_axis(d, rc, 1), np.take_along_axis(d, s, 1)
    source = np.arange(n) == g.source[:, None]
    sr = np.take_along_axis(source, rc, 1)
    with np.errstate(invalid="ignore"):  # inf - inf: an unreachable edge, not tight
        tight = np.abs(ds + g.weights - dr) <= 1e-6 * np.maximum(dr, 1.0)
    return real & np.isfinite(dr) & ~sr & tight, ~np.isfinite(d) | source


def stack(graphs: list[WeightedGraphs], nodes: int, edges: int) -> WeightedGraphs:
    """Single graphs as one batch of `nodes` nodes and `edges` directed edges each (padding: a
    receiver `nodes`, weight 0)."""
    senders = np.zeros((len(graphs), edges), np.int32)
    receivers = np.full((len(graphs), edges), nodes, np.int32)
    weights = np.zeros((len(graphs), edges), np.float32)
    for b, g in enumerate(graphs):
        (s,), (r,), n = g.edges
        real = r < n
        count = int(real.sum())
        senders[b, :count], receivers[b, :count] = s[real], r[real]
        weights[b, :count] = g.weights[0][real]
    source = np.array([int(g.source[0]) for g in graphs], np.int64)
    return WeightedGraphs(EdgeList(senders, receivers, nodes), weights, source)


def draw_weighted(
    rng: np.random.Generator, count: int, sizes: tuple[int, int], families, edges: int
) -> tuple[WeightedGraphs, np.ndarray]:
    """`count` graphs of random families (`WEIGHTED_FAMILIES`) and sizes in `sizes` (both ends
    included), padded to the largest size and `edges` directed edges (a graph with more is
    drawn again): the batch and which nodes are real `[count, nodes]`."""
    low, high = sizes
    drawn, real = [], np.zeros((count, high), bool)
    for b in range(count):
        family = families[rng.integers(len(families))]
        n = int(rng.integers(low, high + 1))
        g = sample_weighted(family, n, 1, seed=int(rng.integers(1 << 31)))
        while int((g.edges.receivers < n).sum()) > edges:
            g = sample_weighted(family, n, 1, seed=int(rng.integers(1 << 31)))
        drawn.append(g)
        real[b, :n] = True
    return stack(drawn, high, edges), real


def weighted_examples(g: WeightedGraphs, algorithm: str, real=None):
    """A batch as the models read it, with its targets: `((anchors [B, n], senders, receivers,
    weights [B, E]), (edge_ok [B, E], self_ok [B, n], real [B, n]))`; `bfs` reads every weight
    as 1."""
    g = unit_weights(g) if algorithm == "bfs" else g
    n = g.edges.num_nodes
    anchors = np.arange(n) == g.source[:, None]
    edge_ok, self_ok = edge_targets(g, algorithm)
    real = np.ones(anchors.shape, bool) if real is None else real
    inputs = (anchors, g.edges.senders, g.edges.receivers, g.weights)
    return inputs, (edge_ok, self_ok, real)


def check_weights(graph: EdgeList, weights, dense=None) -> np.ndarray:
    """Each directed edge's weight `[B, E]` (float32), or a one-line `ValueError` naming
    `weights`: finite and non-negative, equal both ways (undirected graphs), and nothing on a
    missing edge. `dense`: the graphs' adjacency `[B, n, n]` when `weights` is dense `[B, n, n]`
    too (`graph` its edge list)."""
    w = np.asarray(weights)
    if not np.issubdtype(w.dtype, np.number) or np.issubdtype(w.dtype, np.complexfloating):
        raise ConfigError(f"`weights` must be real numbers; got {w.dtype}")
    w = w.astype(np.float64)
    s, r, n = graph
    if dense is not None:
        if w.shape != dense.shape:
            raise ConfigError(
                f"`weights` must have the adjacency's shape {list(dense.shape)}; got {list(w.shape)}"
            )
        if np.any(w[~dense] != 0):
            raise ConfigError("`weights` must be 0 where the adjacency has no edge")
        if not np.array_equal(w, np.swapaxes(w, 1, 2)):
            raise ConfigError("`weights` must be symmetric (undirected graphs)")
        rows = np.arange(len(w))[:, None]
        w = np.where(r < n, w[rows, np.minimum(r, n - 1), s], 0.0)
    elif w.shape != s.shape:
        raise ConfigError(
            f"`weights` must have one per edge, shape {list(s.shape)}; got {list(w.shape)}"
        )
    real = r < n
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ConfigError("`weights` must be finite and non-negative")
    if np.any(w[~real] != 0):
        raise ConfigError("`weights` must be 0 on padding edges (receiver `num_nodes`)")
    for b in range(s.shape[0]):
        m = real[b]
        both = dict(zip(zip(s[b][m].tolist(), r[b][m].tolist(), strict=True), w[b][m].tolist()))
        if any(both.get((j, i)) != x for (i, j), x in both.items()):
            raise ConfigError("`weights` must be equal both ways of each edge (undirected graphs)")
    return w.astype(np.float32)
