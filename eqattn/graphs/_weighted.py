"""Weighted graphs: families drawn as edge lists (no n^2 array, so thousands of nodes are cheap),
a batch of graphs with a source each, and the ways in: your own node pairs (`from_edges`) or
dense adjacencies (`from_adjacency`)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.spatial import Delaunay, cKDTree

from .._errors import ConfigError, GraphError
from .._graph import Graph, check_graph
from ._families import _FAMILIES


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
    """A batch of undirected weighted graphs: `graph`, an [`eqattn.Graph`][] of `[B, E]` edges
    (both directions of each edge) whose one edge feature is the weight (0 on padding), and
    each graph's `source [B]`; `weights [B, E]` is that feature.

    **Example:**

    ```python
    from eqattn import graphs

    g = graphs.sample_weighted("delaunay", 50, 2, seed=0)
    assert g.graph.num_nodes == 50 and g.weights.shape == g.graph.senders.shape
    ```
    """

    graph: Graph
    source: np.ndarray

    @property
    def weights(self) -> np.ndarray:
        """Each directed edge's weight `[B, E]` (0 on padding)."""
        return np.asarray(self.graph.edge_features)[..., 0]

    def padded(self, edges: int) -> WeightedGraphs:
        """The same graphs padded to `edges` directed edges each (at least as many as they
        have): batches of one shape share one compiled solve."""
        senders, receivers = np.asarray(self.graph.senders), np.asarray(self.graph.receivers)
        count, width = senders.shape
        if edges < width:
            raise GraphError(f"`edges` ({edges}) is fewer than the batch's {width} edge slots")
        more = ((0, 0), (0, edges - width))
        n = self.graph.num_nodes
        graph = Graph(
            np.pad(senders, more),
            np.pad(receivers, more, constant_values=n),
            num_nodes=n,
            edge_features=np.pad(np.asarray(self.graph.edge_features), (*more, (0, 0))),
        )
        return WeightedGraphs(graph, self.source)

    def with_weights(self, weights) -> WeightedGraphs:
        """The same graphs and sources with other `weights [B, E]` (0 on padding)."""
        w = np.where(np.asarray(self.graph.real), np.asarray(weights, np.float32), 0.0)
        graph = Graph(
            self.graph.senders, self.graph.receivers, num_nodes=self.graph.num_nodes,
            edge_features=w[..., None].astype(np.float32),
        )  # fmt: skip
        return WeightedGraphs(graph, self.source)


def bucket(size: int) -> int:
    """`size` rounded up to a power of two (at least 8): a few shapes, a few compilations."""
    return max(8, 1 << (int(size) - 1).bit_length())


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
    real = g.graph.receivers[0] < 9
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


def check_source(source, count: int, n: int) -> np.ndarray:
    """`source` as `[count]` node indices, or a `GraphError` naming it."""
    src = np.asarray(source)
    if src.shape != (count,) or not np.issubdtype(src.dtype, np.integer):
        raise GraphError(
            f"`source` must be integers of shape [{count}] (one per graph); got "
            f"{src.dtype}{list(src.shape)}"
        )
    if np.any((src < 0) | (src >= n)):
        raise GraphError(f"`source` must be in 0 .. {n - 1}; got {src.tolist()}")
    return src.astype(np.int64)


def _pairs(b: int, e, n: int) -> np.ndarray:
    e = np.zeros((0, 2), np.int64) if np.size(e) == 0 else np.asarray(e)  # no edge: [0, 2]
    if e.ndim != 2 or e.shape[1] != 2 or not np.issubdtype(e.dtype, np.integer):
        raise GraphError(f"`pairs[{b}]` must be node pairs [E, 2] (integers); got {e.shape}")
    if np.any((e < 0) | (e >= n)):
        raise GraphError(f"`pairs[{b}]` holds a node outside 0 .. {n - 1}")
    if np.any(e[:, 0] == e[:, 1]):
        raise GraphError(f"`pairs[{b}]` holds a self-loop")
    if len(np.unique(np.sort(e, axis=1), axis=0)) < len(e):
        raise GraphError(f"`pairs[{b}]` holds an edge twice (each undirected edge once)")
    return e


def from_edges(
    num_nodes: int, pairs, source, *, weights=None, edges: int | None = None
) -> WeightedGraphs:
    """A batch of undirected graphs on `num_nodes` nodes each, from each graph's edges: `pairs`
    a list of `[E_b, 2]` node pairs (each undirected edge once; none is an empty list),
    `source [B]` and `weights` a list of `[E_b]` (default 1), padded to `edges` directed edges
    (default the largest count rounded up to a power of two). Graphs of another library go in
    this way (networkx: `list(G.edges)`); `graphs.predict`, `score_parents` and `hops` read the
    batch. A one-line [`eqattn.GraphError`][] names the argument that is out of range, a
    self-loop or a repeated edge.

    **Example:**

    ```python
    from eqattn import graphs

    g = graphs.from_edges(3, [[(0, 1), (1, 2)]], [0], weights=[[0.5, 2.0]])  # 0 - 1 - 2
    assert g.graph.receivers[0].tolist()[:4] == [0, 1, 1, 2] and g.weights[0, 1] == 2.0
    assert graphs.from_edges(3, [[]], [1]).graph.real.sum() == 0  # no edge at all
    ```
    """
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int | np.integer) or num_nodes < 1:
        raise GraphError(f"`num_nodes` must be an int >= 1; got {num_nodes!r}")
    n = int(num_nodes)
    if np.shape(source) != (len(pairs),):
        raise GraphError(
            f"`source` must hold one node per graph of `pairs` ({len(pairs)}); got shape "
            f"{list(np.shape(source))}"
        )
    source = check_source(source, len(pairs), n)
    if weights is not None and len(weights) != len(pairs):
        raise GraphError(
            f"`weights` must hold one array per graph ({len(pairs)}); got {len(weights)}"
        )
    drawn = []
    for b, e in enumerate(pairs):
        e = _pairs(b, e, n)
        w = np.ones(len(e)) if weights is None else np.asarray(weights[b], np.float64)
        if w.shape != (len(e),):
            raise GraphError(
                f"`weights[{b}]` must have one per pair, shape [{len(e)}]; got {list(w.shape)}"
            )
        if not np.all(np.isfinite(w)) or np.any(w < 0):
            raise GraphError(f"`weights[{b}]` must be finite and non-negative")
        i, j = e[:, 0], e[:, 1]
        drawn.append((np.concatenate([j, i]), np.concatenate([i, j]), np.concatenate([w, w])))
    width = bucket(max((len(d[0]) for d in drawn), default=0)) if edges is None else int(edges)
    senders = np.zeros((len(pairs), width), np.int32)
    receivers = np.full((len(pairs), width), n, np.int32)
    out = np.zeros((len(pairs), width, 1), np.float32)
    for b, (s, r, w) in enumerate(drawn):
        if len(s) > width:
            raise GraphError(f"`edges` ({width}) is fewer than graph {b}'s {len(s)} edges")
        senders[b, : len(s)], receivers[b, : len(s)], out[b, : len(s), 0] = s, r, w
    return WeightedGraphs(Graph(senders, receivers, num_nodes=n, edge_features=out), source)


def from_adjacency(adjacency, weights=None, edges: int | None = None) -> Graph:
    """The [`eqattn.Graph`][] of dense undirected adjacencies `[B, n, n]` (boolean, symmetric,
    no self-loops), padded to `edges` directed edges per graph (default the largest count
    rounded up to a power of two); with `weights [B, n, n]` (symmetric, finite, >= 0, 0 where
    there is no edge) as its one edge feature. Bad input is a one-line
    [`eqattn.GraphError`][] naming the argument.

    **Example:**

    ```python
    import numpy as np
    from eqattn import graphs

    adjacency = np.zeros((1, 3, 3), bool)
    adjacency[0, [0, 1], [1, 0]] = True  # 0 - 1, node 2 alone
    g = graphs.from_adjacency(adjacency, edges=4)
    assert g.senders[0, :2].tolist() == [1, 0] and g.receivers[0].tolist() == [0, 1, 3, 3]
    ```
    """
    a = check_adjacency(adjacency)
    w = None if weights is None else _dense_weights(weights, a)
    count, n = a.shape[:2]
    width = bucket(int(a.sum((1, 2)).max(initial=0))) if edges is None else int(edges)
    senders = np.zeros((count, width), np.int32)
    receivers = np.full((count, width), n, np.int32)
    features = np.zeros((count, width, 1), np.float32)
    for b in range(count):
        r, s = np.nonzero(a[b])
        if len(r) > width:
            raise GraphError(f"`edges` ({width}) is fewer than graph {b}'s {len(r)} edges")
        senders[b, : len(r)], receivers[b, : len(r)] = s, r
        if w is not None:
            features[b, : len(r), 0] = w[b, r, s]
    return Graph(senders, receivers, num_nodes=n, edge_features=None if w is None else features)


def check_adjacency(adjacency) -> np.ndarray:
    """Dense undirected adjacencies `[B, n, n]` as numpy booleans, or a `GraphError`: square,
    at least one node, boolean, symmetric, no self-loops."""
    a = np.asarray(adjacency)
    if a.ndim != 3 or a.shape[1] != a.shape[2]:
        raise GraphError(f"`adjacency` must have shape [B, n, n]; got {list(a.shape)}")
    if a.shape[1] == 0:
        raise GraphError("`adjacency` must have at least one node (n >= 1); got n = 0")
    if a.dtype != np.bool_:
        raise GraphError(f"`adjacency` must be boolean; got {a.dtype}")
    if not np.array_equal(a, np.swapaxes(a, 1, 2)):
        raise GraphError("`adjacency` must be symmetric (undirected graphs)")
    if np.any(np.diagonal(a, axis1=1, axis2=2)):
        raise GraphError("`adjacency` must have no self-loops (a False diagonal)")
    return a


def _dense_weights(weights, a: np.ndarray) -> np.ndarray:
    w = np.asarray(weights)
    if not np.issubdtype(w.dtype, np.number) or np.issubdtype(w.dtype, np.complexfloating):
        raise GraphError(f"`weights` must be real numbers; got {w.dtype}")
    if w.shape != a.shape:
        raise GraphError(
            f"`weights` must have the adjacency's shape {list(a.shape)}; got {list(w.shape)}"
        )
    w = w.astype(np.float64)
    if np.any(w[~a] != 0):
        raise GraphError("`weights` must be 0 where the adjacency has no edge")
    if not np.array_equal(w, np.swapaxes(w, 1, 2)):
        raise GraphError("`weights` must be symmetric (undirected graphs)")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise GraphError("`weights` must be finite and non-negative")
    return w


def stack(graphs: list[WeightedGraphs], nodes: int, edges: int) -> WeightedGraphs:
    """Single graphs as one batch of `nodes` nodes and `edges` directed edges each (padding: a
    receiver `nodes`, weight 0)."""
    senders = np.zeros((len(graphs), edges), np.int32)
    receivers = np.full((len(graphs), edges), nodes, np.int32)
    weights = np.zeros((len(graphs), edges, 1), np.float32)
    for b, g in enumerate(graphs):
        s, r = np.asarray(g.graph.senders)[0], np.asarray(g.graph.receivers)[0]
        real = r < g.graph.num_nodes
        count = int(real.sum())
        senders[b, :count], receivers[b, :count] = s[real], r[real]
        weights[b, :count, 0] = g.weights[0][real]
    source = np.array([int(g.source[0]) for g in graphs], np.int64)
    return WeightedGraphs(Graph(senders, receivers, num_nodes=nodes, edge_features=weights), source)


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
        while int((np.asarray(g.graph.receivers) < n).sum()) > edges:
            g = sample_weighted(family, n, 1, seed=int(rng.integers(1 << 31)))
        drawn.append(g)
        real[b, :n] = True
    return stack(drawn, high, edges), real


def check_weighted(g: WeightedGraphs, weighted: bool) -> None:
    """A batch `predict` can read: an undirected [`eqattn.Graph`][] of `[B, E]` edges (with one
    edge feature, finite and >= 0, where `weighted`) and a source per graph; or a
    `GraphError`."""
    check_graph(g.graph, edge_features=1 if weighted else None, undirected=True)
    if np.ndim(g.graph.senders) != 2:
        raise GraphError(
            f"`graph` must be a batch, edges [B, E]; got {list(np.shape(g.graph.senders))}"
        )
    if weighted and np.any(g.weights[np.asarray(g.graph.real)] < 0):
        raise GraphError("`graph`'s weights (its edge feature) must be finite and non-negative")
    check_source(g.source, np.shape(g.graph.senders)[0], g.graph.num_nodes)
