"""Graphs the project did not generate, for `python -m benchmarks graphs`: networkx's random
graph generators (families unlike the task's own: expanders, hubs, small worlds, uniform random
trees, chains of cliques), the real graphs networkx ships (social networks with their own edge
weights), and two large real graphs PyGSP ships: Minnesota's road network and an airfoil's
mesh, weighted by length. Nodes are put in a random order; weights are uniform in (0, 1] unless
a real graph's own are asked for.

Needs networkx and PyGSP (the `bench` extra); `available()` and `available_large()` say whether
they are installed. `DISTRIBUTIONS` and `reweighted` give any batch the weights of one of the
distributions that break a graph algorithm written as a layer (ties, heavy tails, near ties,
zeros, twelve orders of magnitude); the tests draw from them too.
"""

from __future__ import annotations

import importlib.util

import numpy as np
from scipy.sparse import coo_matrix

from eqattn import graphs


def available() -> bool:
    return importlib.util.find_spec("networkx") is not None


def available_large() -> bool:
    return importlib.util.find_spec("pygsp") is not None


def _generators():
    import networkx as nx

    return {
        "random 3-regular": lambda n, s: nx.random_regular_graph(3, n, seed=s),
        "Barabasi-Albert": lambda n, s: nx.barabasi_albert_graph(n, 2, seed=s),
        "Watts-Strogatz": lambda n, s: nx.connected_watts_strogatz_graph(n, 4, 0.1, seed=s),
        "powerlaw cluster": lambda n, s: nx.powerlaw_cluster_graph(n, 2, 0.3, seed=s),
        "uniform random tree": lambda n, s: nx.random_labeled_tree(n, seed=s),
        "connected caveman": lambda n, s: nx.connected_caveman_graph(n // 8, 8),
    }


GENERATORS = (
    "random 3-regular",
    "Barabasi-Albert",
    "Watts-Strogatz",
    "powerlaw cluster",
    "uniform random tree",
    "connected caveman",
)
"""networkx generators, each drawing graphs of exactly n nodes (n a multiple of 8)."""
REAL = ("karate club", "Les Miserables", "Florentine families")
"""networkx's real graphs: Zachary's karate club (34 nodes, weighted by interactions), the
co-appearances of Les Miserables' characters (77, weighted by their count) and the marriages of
Florence's families (15, unweighted)."""


def _real(name: str):
    import networkx as nx

    loaders = {
        "karate club": nx.karate_club_graph,
        "Les Miserables": nx.les_miserables_graph,
        "Florentine families": nx.florentine_families_graph,
    }
    return nx.convert_node_labels_to_integers(loaders[name]())


LARGE = ("Minnesota roads", "airfoil mesh")
"""PyGSP's large real graphs: the road network of Minnesota (2642 crossings, 3303 roads; two
crossings lie apart) and the triangulated mesh around an airfoil (4253 nodes, 12289 edges), each
road or edge weighted by the straight-line distance between its ends (4 roads join crossings
at the same coordinates: length 0), the coordinates scaled into the unit square (as the task's
geometric families)."""


def _pointcloud(name: str) -> dict:
    from importlib.resources import files

    from scipy.io import loadmat

    with (files("pygsp") / "data" / "pointclouds" / f"{name}.mat").open("rb") as f:
        return loadmat(f)


def large(name: str, count: int, seed: int) -> graphs.WeightedGraphs:
    """The large real graph `name` (`LARGE`) `count` times, each with its own node order and
    source, weighted by length."""
    if name == "Minnesota roads":
        d = _pointcloud("minnesota")
        a = coo_matrix(d["A"])  # dense or sparse, as the file holds it
        i, j = a.row.astype(np.int64), a.col.astype(np.int64)
        xy = d["xy"]
    else:
        d = _pointcloud("airfoil")
        i, j = d["i_inds"].ravel().astype(np.int64) - 1, d["j_inds"].ravel().astype(np.int64) - 1
        xy = np.concatenate([d["x"], d["y"]], axis=1)
    pairs = np.unique(np.sort(np.stack([i, j], 1), axis=1), axis=0)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    xy = (xy - xy.min(0)) / (xy.max(0) - xy.min(0)).max()
    lengths = np.linalg.norm(xy[pairs[:, 0]] - xy[pairs[:, 1]], axis=1)
    rng = np.random.default_rng(seed)
    n = len(xy)
    orders = [rng.permutation(n) for _ in range(count)]
    source = rng.integers(0, n, count)
    return graphs.from_edges(n, [o[pairs] for o in orders], source, weights=[lengths] * count)


DISTRIBUTIONS = {
    "equal": lambda rng, m: np.ones(m),
    "1 or 2": lambda rng, m: rng.integers(1, 3, m).astype(float),
    "integers 1-5": lambda rng, m: rng.integers(1, 6, m).astype(float),
    "2 decimals": lambda rng, m: np.round(rng.random(m), 2),
    "lognormal 1": lambda rng, m: rng.lognormal(0, 1, m),
    "lognormal 2": lambda rng, m: rng.lognormal(0, 2, m),
    "lognormal 3": lambda rng, m: rng.lognormal(0, 3, m),
    "near ties": lambda rng, m: 1 + rng.uniform(0, 1e-3, m),
    "zeros": lambda rng, m: np.where(rng.random(m) < 0.3, 0.0, rng.random(m)),
    "1e-6 to 1e6": lambda rng, m: 10.0 ** rng.uniform(-6, 6, m),
    "uniform": lambda rng, m: 1.0 - rng.random(m),
}
"""Weight distributions `draw(rng, m) -> [m]`: all equal, {1, 2}, integers 1-5, uniform rounded
to 2 decimals (ties), lognormal with sigma 1, 2, 3 (heavy tails), 1 + U(0, 1e-3) (near ties),
30% zeros, log-uniform over 1e-6 .. 1e6, and uniform in (0, 1] (distinct, well separated)."""


def reweighted(g: graphs.WeightedGraphs, name: str, seed: int) -> graphs.WeightedGraphs:
    """`g` with each undirected edge's weight drawn from `DISTRIBUTIONS[name]`."""
    rng = np.random.default_rng(seed)
    s, r, n = np.asarray(g.graph.senders), np.asarray(g.graph.receivers), g.graph.num_nodes
    w = np.zeros(s.shape)
    for b in range(s.shape[0]):
        real = r[b] < n
        key = np.minimum(s[b], r[b]).astype(np.int64) * n + np.maximum(s[b], r[b])
        pairs, inverse = np.unique(key[real], return_inverse=True)
        w[b, real] = DISTRIBUTIONS[name](rng, len(pairs))[inverse]
    return g.with_weights(w)


MORE = ("Watts-Strogatz", "Barabasi-Albert m=3", "powerlaw cluster")
"""The networkx generators the weight distributions are tried on beside the task's families
(Barabási-Albert with 3 edges per new node, as the graphs that failed to converge had)."""


def sample(family: str, n: int, count: int, seed: int) -> graphs.WeightedGraphs:
    """`count` graphs of `family` with `n` nodes: one of the task's `WEIGHTED_FAMILIES` or of
    `MORE` (networkx, nodes in a random order, a random source; weights uniform in (0, 1])."""
    if family in graphs.WEIGHTED_FAMILIES:
        return graphs.sample_weighted(family, n, count, seed=seed)
    import networkx as nx

    make = {
        "Watts-Strogatz": lambda s: nx.connected_watts_strogatz_graph(n, 4, 0.1, seed=s),
        "Barabasi-Albert m=3": lambda s: nx.barabasi_albert_graph(n, 3, seed=s),
        "powerlaw cluster": lambda s: nx.powerlaw_cluster_graph(n, 2, 0.3, seed=s),
    }[family]
    rng = np.random.default_rng(seed)
    return _batch([make(seed * 1000 + b) for b in range(count)], rng, own_weights=False)


def _batch(drawn, rng, own_weights: bool) -> graphs.WeightedGraphs:
    """Networkx graphs of one node count as a batch: nodes in a random order, a random source."""
    n = drawn[0].number_of_nodes()
    pairs, weights = [], []
    for g in drawn:
        order = rng.permutation(n)
        e = np.array(list(g.edges), np.int64).reshape(-1, 2)
        pairs.append(order[e])
        if own_weights:
            weights.append(np.array([g.edges[u, v].get("weight", 1.0) for u, v in g.edges], float))
        else:
            weights.append(1.0 - rng.random(len(e)))
    source = rng.integers(0, n, len(drawn))
    return graphs.from_edges(n, pairs, source, weights=weights)


def draw(name: str, n: int, count: int, seed: int) -> graphs.WeightedGraphs:
    """`count` graphs of the generator `name` (`GENERATORS`) or, for a real graph (`REAL`), that
    graph `count` times (`n` ignored), each with its own order, weights and source."""
    rng = np.random.default_rng(seed)
    if name in REAL:
        return _batch([_real(name)] * count, rng, own_weights=False)
    make = _generators()[name]
    return _batch([make(n, seed * 1000 + b) for b in range(count)], rng, own_weights=False)


def own_weights(name: str, count: int, seed: int) -> graphs.WeightedGraphs:
    """A real graph (`REAL`) `count` times with its own edge weights (1 where it has none)."""
    return _batch([_real(name)] * count, np.random.default_rng(seed), own_weights=True)
