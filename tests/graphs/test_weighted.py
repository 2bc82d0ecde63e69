"""The weighted algorithms: the families, the targets against float64 numpy references written
here (Bellman-Ford, Prim under the tie rule), `graphs.predict` with weights (the shortest-path
model at its exact parameters against Dijkstra's parents at 4096 nodes; dense and edge lists
alike), its refusals, and one optimizer step."""

import heapq

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import eqattn
from benchmarks._graph_parts import exact
from eqattn import graphs

from ..checks import unchecked

PATHS, TREE = graphs.ALGORITHMS["shortest-paths"], graphs.ALGORITHMS["mst"]


def _lists(g, b):
    s, r, n = np.asarray(g.graph.senders), np.asarray(g.graph.receivers), g.graph.num_nodes
    real = r[b] < n
    return s[b][real], r[b][real], g.weights[b][real].astype(np.float64), n


def _bellman_ford(s, r, w, source, n):
    d = np.full(n, np.inf)
    d[source] = 0.0
    for _ in range(n):
        d = np.minimum(d, np.full(n, np.inf))
        np.minimum.at(d, r, d[s] + w)
    return d


def _prim(s, r, w, source, n):
    """Prim's tree from `source`, edges compared by the tie rule: (weight, smaller end, larger
    end)."""
    parent, done = np.arange(n), np.zeros(n, bool)
    heap = [((0.0, -1, -1), source, source)]
    while heap:
        _, u, p = heapq.heappop(heap)
        if done[u]:
            continue
        done[u], parent[u] = True, p
        for e in np.flatnonzero(s == u):
            if not done[r[e]]:
                key = (w[e], min(s[e], r[e]), max(s[e], r[e]))
                heapq.heappush(heap, (key, r[e], u))
    return parent


@pytest.mark.parametrize("family", graphs.WEIGHTED_FAMILIES)
def test_families_and_targets(family):
    g = graphs.sample_weighted(family, 24, 3, seed=7)
    again = graphs.sample_weighted(family, 24, 3, seed=7)
    assert (np.asarray(g.graph.senders) == np.asarray(again.graph.senders)).all()
    assert (g.weights == again.weights).all()
    edge_ok, self_ok = PATHS.targets(g)
    mst_ok, mst_self = TREE.targets(g)
    prim = TREE.reference(g)
    for b in range(3):
        s, r, w, n = _lists(g, b)
        both = dict(zip(zip(s.tolist(), r.tolist()), w.tolist()))
        assert all(both[(j, i)] == x for (i, j), x in both.items())  # undirected
        assert (w > 0).all() and (family in ("geometric", "delaunay") or (w <= 1).all())
        d = _bellman_ford(s, r, w, g.source[b], n)
        with np.errstate(invalid="ignore"):  # inf - inf on edges nothing reaches
            tight = np.isfinite(d[r]) & (np.abs(d[s] + w - d[r]) <= 1e-9) & (r != g.source[b])
        real = np.asarray(g.graph.receivers[b]) < n
        assert (edge_ok[b][real] == tight).all()
        assert (self_ok[b] == (~np.isfinite(d) | (np.arange(n) == g.source[b]))).all()
        assert (prim[b] == _prim(s, r, w, g.source[b], n)).all()
        chosen = prim[b][r] == s
        assert (mst_ok[b][real] == chosen).all()
        assert (mst_self[b] == (prim[b] == np.arange(n))).all()


def test_targets_with_zero_length_edges_and_ties():
    """Edges of weight 0 (a real road network has them) are edges: scipy's spanning tree drops
    them, the targets must not. A bridge and a cycle's edge of length 0, against Prim; and a
    4-cycle of equal weights, whose tree the tie rule picks (the smaller ends first)."""
    pairs = np.array([(0, 1), (1, 2), (2, 3), (3, 1), (3, 4), (4, 5)])
    w = np.array([0.5, 0.0, 0.7, 0.2, 0.0, 0.3])
    g = graphs.from_edges(6, [pairs], [0], weights=[w])
    s, r, w2, n = _lists(g, 0)
    prim = _prim(s, r, w2, 0, n)
    assert (prim == [0, 0, 1, 1, 3, 4]).all()
    assert (TREE.reference(g)[0] == prim).all()
    edge_ok, self_ok = TREE.targets(g)
    assert (self_ok[0] == (np.arange(6) == 0)).all()
    d = _bellman_ford(s, r, w2, 0, n)
    assert np.allclose(d, [0.0, 0.5, 0.5, 0.7, 0.7, 1.0])
    edge_ok, self_ok = PATHS.targets(g)
    assert (self_ok[0] == (np.arange(6) == 0)).all()
    square = graphs.from_edges(4, [[(0, 1), (1, 2), (2, 3), (3, 0)]], [2])
    # ranks by (1, smaller, larger): 0-1, 0-3, 1-2 are the tree, 2-3 (the largest) is not
    assert TREE.reference(square)[0].tolist() == [1, 2, 2, 0]


def _exact_model():
    """The shortest-path DEQ at its exact parameters (the graphs suite's): its first shift
    channel adds the weight and its scores read minus it: Bellman-Ford, each node's temperature
    relative to its distance (float32)."""
    return exact(graphs.GraphDEQ(2, "shortest-paths", key=jax.random.key(0)))


def _share_right(out, g, algorithm):
    return graphs.score_parents(g, out.parent, algorithm).mean()


@pytest.mark.float32
def test_predict_with_weights_on_4096_nodes():
    model = _exact_model()
    g = graphs.sample_weighted("delaunay", 4096, 1, seed=3)
    out = graphs.predict(model, g.graph, g.source)
    assert out.converged.all() and out.reachable.all()
    assert _share_right(out, g, "shortest-paths") == 1.0


@pytest.mark.float32
def test_answers_do_not_change_when_every_weight_is_scaled():
    """The models read each weight over its graph's mean edge weight: scaled by a power of two
    (exact in floating point) every answer of an untrained model is the same; the exact model
    answers road-map lengths (mean edge 1e-3) as right as unit-square ones."""
    g = graphs.sample_weighted("delaunay", 200, 2, seed=5)
    for model in (graphs.GraphDEQ(6, "mst", key=jax.random.key(2)),
                  graphs.GraphStack(2, 4, "mst", key=jax.random.key(2)),
                  graphs.GraphDEQ(6, "shortest-paths", key=jax.random.key(2))):  # fmt: skip
        base = graphs.predict(model, g.graph, g.source)
        scaled = g.with_weights(g.weights * 1024.0)
        scaled = graphs.predict(model, scaled.graph, scaled.source)
        assert (base.parent == scaled.parent).all() and (base.steps == scaled.steps).all()
    small = g.with_weights(g.weights * 1e-2)
    out = graphs.predict(_exact_model(), small.graph, small.source)
    assert _share_right(out, small, "shortest-paths") == 1.0


@pytest.mark.float32
def test_predict_dense_equals_edges():
    model = graphs.GraphDEQ(6, "shortest-paths", key=jax.random.key(1))  # untrained: any map
    g = graphs.sample_weighted("geometric", 30, 2, seed=4)
    s, r, n = np.asarray(g.graph.senders), np.asarray(g.graph.receivers), g.graph.num_nodes
    adjacency = np.zeros((2, n, n), bool)
    weights = np.zeros((2, n, n), np.float32)
    for b in range(2):
        real = r[b] < n
        adjacency[b, r[b][real], s[b][real]] = True
        weights[b, r[b][real], s[b][real]] = g.weights[b][real]
    dense = graphs.predict(model, graphs.from_adjacency(adjacency, weights), g.source)
    edges = graphs.predict(model, g.graph, g.source)
    assert (dense.parent == edges.parent).all() and (dense.steps == edges.steps).all()


@pytest.mark.float32
def test_the_evaluation_answers_alike_with_the_families_in_one_padded_shape(monkeypatch):
    """`evaluate_sizes` pads a size's families to one shape (one compiled solve): every row,
    the sweep against the budget included, is the one each family's own shape gives."""
    from eqattn.graphs import _evaluation

    model = graphs.GraphDEQ(6, "mst", key=jax.random.key(3))  # untrained: any map
    config = graphs.GraphConfig(algorithm="mst")
    sizes = {16: 3}
    shared = graphs.evaluate_sizes(model, config, sizes=sizes)
    monkeypatch.setattr(_evaluation, "SHARED_EDGES", 0)
    assert graphs.evaluate_sizes(model, config, sizes=sizes) == shared
    g = graphs.sample_weighted("path", 5, 2, seed=0)
    wide = g.padded(64)
    assert wide.graph.senders.shape == (2, 64) and wide.graph.real.sum() == g.graph.real.sum()
    assert (wide.weights[:, :8] == g.weights).all() and not wide.weights[:, 8:].any()
    with pytest.raises(eqattn.GraphError, match=r"`edges` \(4\) is fewer than the batch's 8"):
        g.padded(4)


@pytest.mark.float32
def test_predict_refusals():
    weighted = graphs.GraphDEQ(4, "shortest-paths", key=jax.random.key(0))
    g = graphs.sample("path", 4, 1, seed=0)
    w = g.adjacency.astype(np.float32)
    cases = [
        (lambda: graphs.from_adjacency(g.adjacency, np.triu(w)), "`weights` must be 0 where|symmetric"),
        (lambda: graphs.from_adjacency(g.adjacency, -w), "finite and non-negative"),
        (lambda: graphs.from_adjacency(g.adjacency, np.where(w > 0, np.inf, 0)), "finite and non-negative"),
        (lambda: graphs.from_adjacency(g.adjacency, w + np.eye(4, dtype=np.float32)), "0 where the adjacency"),
        (lambda: graphs.from_adjacency(g.adjacency, w[:, :3]), "the adjacency's shape"),
        (lambda: graphs.predict(weighted, graphs.from_adjacency(g.adjacency), g.source), r"edge_features.*got None"),
    ]  # fmt: skip
    for call, match in cases:
        with unchecked(), pytest.raises(eqattn.GraphError, match=match):
            call()
    e = graphs.from_adjacency(g.adjacency, w, edges=8)
    s, r = np.asarray(e.senders), np.asarray(e.receivers)
    one_way = np.where(r < 4, np.arange(8, dtype=np.float32) + 1, 0)[..., None]
    negative = -np.asarray(e.edge_features)
    for features, match in ((one_way, "equal both ways"), (negative, "non-negative")):
        bad = eqattn.Graph(s, r, num_nodes=4, edge_features=features)
        with pytest.raises(eqattn.GraphError, match=match):
            graphs.predict(weighted, bad, g.source)


def test_each_algorithm_sets_its_defaults_and_rule():
    """The configuration's `dim` and `rtol` default to the algorithm's (an explicit value is
    kept); BFS's weight rule reads every real edge as 1, shortest paths' the weight over the
    mean, the spanning tree's the rank under the tie rule (numpy's `tie_ranks` alike)."""
    from eqattn.graphs._references import tie_ranks

    for name, algorithm in graphs.ALGORITHMS.items():
        config = graphs.GraphConfig(algorithm=name)
        assert (config.dim, config.rtol) == (algorithm.dim, algorithm.rtol)
        assert config.learned is algorithm and config.training_families == algorithm.families
    assert graphs.GraphConfig(algorithm="mst", rtol=1e-3, dim=5).rtol == 1e-3
    g = graphs.from_edges(
        4, [[(0, 1), (1, 2), (2, 3), (3, 0)]], [0], weights=[[2.0, 2.0, 1.0, 4.0]]
    )
    one = jax.tree.map(lambda x: x[0], g.graph)
    real = np.asarray(one.real)
    assert set(np.asarray(graphs.ALGORITHMS["bfs"].edge_features(one))[real, 0]) == {1.0}
    relative = np.asarray(PATHS.edge_features(one))[real, 0]
    np.testing.assert_allclose(relative, g.weights[0][real] / 2.25)
    ranks = np.asarray(TREE.edge_features(one))[real, 0]
    s, r = np.asarray(one.senders)[real], np.asarray(one.receivers)[real]
    assert ranks.tolist() == tie_ranks(s, r, g.weights[0][real]).tolist()
    assert sorted(set(ranks.tolist())) == [1, 2, 3, 4]  # 2-3 (1.0), 0-1, 1-2 (2.0, ends), 3-0


@pytest.mark.float32
@pytest.mark.parametrize("algorithm", ["bfs", "shortest-paths", "mst"])
def test_one_training_step(algorithm):
    """One optimizer step of the task runs and moves the model (BFS's batch: every weight 1;
    mst's: nothing to move)."""
    task = graphs.GraphTask(graphs.GraphConfig(algorithm=algorithm, batch_size=4))
    inputs, targets = task.example_batch()
    model = task.build_model(task.config, jax.random.key(0))
    assert model.algorithm is graphs.ALGORITHMS[algorithm]
    optimizer = optax.adam(1e-2)
    step = graphs.GraphTask.train_step(task.config, optimizer)
    state = optimizer.init(eqx.filter(model, eqx.is_array))
    data = jax.tree.map(jnp.asarray, inputs), tuple(map(jnp.asarray, targets))
    new, _, loss, stats, _ = eqx.filter_jit(step)(model, state, *data, None, None)
    assert np.isfinite(float(loss)) and 0 <= float(stats[0]) <= 1
    if algorithm == "mst":  # the records answer every training graph from the start, by a
        # margin that leaves nothing to learn: the loss is 0 and the step moves nothing
        assert float(loss) < 1e-6 and float(stats[0]) == 1.0
        return
    moved = jax.tree.map(
        lambda a, b: not np.allclose(a, b),
        eqx.filter(new, eqx.is_array),
        eqx.filter(model, eqx.is_array),
    )
    assert any(jax.tree.leaves(moved))


def test_runs_of_the_weighted_algorithms_have_their_own_folder():
    assert graphs.GraphTask.run_folder({}) == "graphs"
    assert graphs.GraphTask.run_folder({"algorithm": "mst"}) == "graphs/mst"


@pytest.mark.float32
def test_from_edges_against_networkx():
    """A networkx graph through `from_edges`: the targets agree with networkx's own Dijkstra and
    minimum spanning tree, and the exact model answers it right."""
    nx = pytest.importorskip("networkx")
    rng = np.random.default_rng(0)
    g = nx.connected_watts_strogatz_graph(200, 4, 0.2, seed=1)
    for u, v in g.edges:
        g.edges[u, v]["weight"] = float(1.0 - rng.random())
    pairs = np.array(list(g.edges))
    w = [g.edges[u, v]["weight"] for u, v in pairs]
    batch = graphs.from_edges(200, [pairs], [5], weights=[w])  # distinct weights: one tree
    lengths = nx.single_source_dijkstra_path_length(g, 5)
    parents = {
        v: {u for u in g[v] if abs(lengths[u] + g.edges[u, v]["weight"] - lengths[v]) < 1e-9}
        for v in g
        if v != 5
    }
    tree = nx.dfs_predecessors(nx.minimum_spanning_tree(g), 5)
    for node in (17, 123, 199):
        chosen = np.full((1, 200), node)  # `node` as every node's parent
        right = graphs.score_parents(batch, chosen, "shortest-paths")[0]
        assert set(np.flatnonzero(right)) == {v for v, p in parents.items() if node in p}
        right = graphs.score_parents(batch, chosen, "mst")[0]
        assert set(np.flatnonzero(right)) == {v for v, p in tree.items() if p == node}
    out = graphs.predict(_exact_model(), batch.graph, batch.source)
    assert _share_right(out, batch, "shortest-paths") == 1.0


def test_from_edges_refusals():
    path = [np.array([(0, 1), (1, 2)])]
    cases = [
        (dict(pairs=path, source=[3]), "`source` must be in 0 .. 2"),
        (dict(pairs=path, source=[0, 1]), "`source` must hold one node per graph"),
        (dict(pairs=[np.array([(0, 3)])], source=[0]), r"`pairs\[0\]` holds a node outside 0 .. 2"),
        (dict(pairs=[np.array([(1, 1)])], source=[0]), "self-loop"),
        (dict(pairs=[np.array([(0, 1), (1, 0)])], source=[0]), "an edge twice"),
        (dict(pairs=[np.array([0.0, 1.0])], source=[0]), r"node pairs \[E, 2\]"),
        (dict(pairs=path, source=[0], weights=[[1.0]]), r"`weights\[0\]` must have one per"),
        (dict(pairs=path, source=[0], weights=[[1.0, -1.0]]), "finite and non-negative"),
        (dict(pairs=path, source=[0], weights=[]), "one array per graph"),
    ]
    for kwargs, match in cases:
        with pytest.raises(eqattn.GraphError, match=match):
            graphs.from_edges(3, **kwargs)
    one = graphs.from_edges(1, [np.zeros((0, 2), int)], [0])  # one node, no edge
    assert one.graph.senders.shape == (1, 8) and (one.graph.receivers == 1).all()
    none = graphs.from_edges(3, [[]], [1])  # no edge at all: three nodes apart
    out = graphs.predict(graphs.GraphDEQ(2, "bfs", key=jax.random.key(0)), none.graph, none.source)
    assert out.parent.tolist() == [[0, 1, 2]] and out.reachable.tolist() == [[False, True, False]]
