"""The graph data and models: the families' shapes, BFS against scipy's shortest paths, the BFS
parents and the task's targets, the API's refusals, and permutation equivariance of both models."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.sparse.csgraph import shortest_path

import eqattn
from eqattn import graphs


@pytest.mark.parametrize("family", graphs.FAMILIES)
def test_families(family):
    n = 23
    g = graphs.sample(family, n, 6, seed=4)
    a = g.adjacency
    assert a.shape == (6, n, n) and a.dtype == bool and g.source.shape == (6,)
    assert np.array_equal(a, a.transpose(0, 2, 1)) and not a[:, np.arange(n), np.arange(n)].any()
    edges = a.sum((1, 2)) // 2
    expected = {"path": n - 1, "tree": n - 1, "cycle": n, "ladder": 10 + 11 + 11}  # rails, rungs
    if family in expected:
        assert (edges == expected[family]).all(), edges
    if family == "grid":  # 4 rows of 6 cells, the last one of 5: 19 across, 17 down
        assert (edges == 36).all() and a.sum(-1).max() <= 4
    distance = shortest_path(a[0].astype(float), unweighted=True)
    if family != "erdos-renyi":
        assert np.isfinite(distance).all()  # connected
    assert not np.array_equal(a[0], a[1])  # each example its own order (and tree)
    again = graphs.sample(family, n, 6, seed=4)
    assert np.array_equal(again.adjacency, a) and np.array_equal(again.source, g.source)


def test_erdos_renyi_graphs_have_mean_degree_three_and_are_often_disconnected():
    g = graphs.sample("erdos-renyi", 200, 20, seed=0)
    assert 2.7 < g.adjacency.sum(-1).mean() < 3.3
    reachable, _ = graphs.bfs(*g)
    assert 0.8 < reachable.mean() < 0.99


@pytest.mark.parametrize("seed", range(4))
def test_bfs_matches_scipy_shortest_paths(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    a = np.triu(rng.random((5, n, n)) < rng.uniform(0.02, 0.2), 1)
    a = a | a.transpose(0, 2, 1)
    source = rng.integers(0, n, 5)
    reachable, distance = graphs.bfs(a, source)
    for b in range(5):
        ref = shortest_path(a[b].astype(np.float64), unweighted=True, indices=source[b])
        np.testing.assert_array_equal(reachable[b], np.isfinite(ref))
        np.testing.assert_array_equal(distance[b], np.where(np.isfinite(ref), ref, -1))


def test_valid_parents_are_the_neighbours_one_edge_closer():
    g = graphs.sample("erdos-renyi", 60, 8, seed=1)
    _, distance = graphs.bfs(*g)
    parents = graphs.valid_parents(g.adjacency, distance)
    for b in range(8):
        for i in range(60):
            chosen = np.flatnonzero(parents[b, i])
            if distance[b, i] <= 0:  # the source and the unreachable: themselves alone
                assert chosen.tolist() == [i]
            else:
                assert len(chosen) >= 1 and g.adjacency[b, i, chosen].all()
                assert (distance[b, chosen] == distance[b, i] - 1).all()


@pytest.mark.bad_input
def test_bad_graphs_are_refused_in_one_line():
    a = np.zeros((2, 4, 4), bool)
    a[:, 0, 1] = a[:, 1, 0] = True
    source = np.array([0, 1])
    cases = [
        ((a[:, :3], source), "`adjacency` must have shape [B, n, n]"),
        ((np.zeros((2, 0, 0), bool), source), "at least one node"),
        ((a.astype(float), source), "`adjacency` must be boolean"),
        ((a & np.triu(np.ones(4, bool)), source), "must be symmetric"),
        ((a | np.eye(4, dtype=bool), source), "no self-loops"),
        ((a, np.array([0, 4])), "`source` must be in 0 .. 3"),
        ((a, np.array([0.0, 1.0])), "`source` must be integers of shape [2]"),
        ((a, np.array([0])), "`source` must be integers of shape [2]"),
    ]
    model = graphs.GraphDEQ(4, "bfs", key=jax.random.key(0))
    for (adjacency, src), message in cases:
        calls = (
            graphs.bfs,
            lambda x, y: graphs.predict(model, graphs.from_adjacency(x), y),
        )
        for call in calls:
            with pytest.raises(eqattn.GraphError) as error:
                call(adjacency, src)
            assert message in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ValueError, match="`family` must be one of path"):
        graphs.sample("star", 5, 1, seed=0)
    with pytest.raises(ValueError, match="`n` must be an int >= 1"):
        graphs.sample("path", 0, 1, seed=0)


MODELS = {
    "deq": lambda k, algorithm: graphs.GraphDEQ(6, algorithm, key=k),
    "explicit": lambda k, algorithm: graphs.GraphStack(2, 3, algorithm, key=k),
}


def _float64(model):
    return jax.tree.map(lambda x: x.astype(jnp.float64) if eqx_float(x) else x, model)


def eqx_float(x) -> bool:
    return isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.floating)


@pytest.mark.parametrize("name", list(MODELS))
def test_models_are_permutation_equivariant(name):
    """Relabelling a graph's nodes (its edges kept in order) permutes each node's own score,
    leaves each edge's score as it was, and changes no solve's statistics (float64, an untrained
    model, random weights)."""
    model = _float64(MODELS[name](jax.random.key(0), "shortest-paths"))
    g = graphs.sample_weighted("erdos-renyi", 12, 1, seed=3)
    s, r = np.asarray(g.graph.senders[0]), np.asarray(g.graph.receivers[0])
    anchors = np.arange(12) == g.source[0]
    w = jnp.asarray(g.weights[0], jnp.float64)[:, None]
    order = np.random.default_rng(0).permutation(12)
    new = np.append(np.argsort(order), 12)  # old node -> its new index (12: padding stays)
    one = eqattn.Graph(s, r, num_nodes=12, edge_features=w)
    relabelled = eqattn.Graph(new[s], new[r], num_nodes=12, edge_features=w)
    p = model.predict((one, anchors), budget=60)
    q = model.predict((relabelled, anchors[order]), budget=60)
    np.testing.assert_allclose(q.logits.edges, p.logits.edges, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(q.logits.own, p.logits.own[order], rtol=1e-9, atol=1e-9)
    assert int(q.steps) == int(p.steps)


def test_predict_pads_inside_and_the_padding_changes_nothing():
    """The graphs of one call are padded to a power of two of nodes, edges and graphs (isolated
    nodes, padding edges, empty graphs): an untrained model's answers for a graph are the same
    in a call of its own size and padded to more nodes; an isolated node is unreachable."""
    model = graphs.GraphDEQ(6, "bfs", key=jax.random.key(2))
    g = graphs.sample("tree", 16, 3, seed=0)
    alone = graphs.predict(model, graphs.from_adjacency(g.adjacency), g.source)
    padded = np.zeros((3, 17, 17), bool)
    padded[:, :16, :16] = g.adjacency
    wide = graphs.predict(
        model, graphs.from_adjacency(padded), g.source, budget=graphs.budget_for(16)
    )
    np.testing.assert_array_equal(wide.parent[:, :16], alone.parent)
    np.testing.assert_array_equal(wide.reachable[:, :16], alone.reachable)
    np.testing.assert_array_equal(wide.steps, alone.steps)
    assert not wide.reachable[:, 16].any() and (wide.parent[:, 16] == 16).all()


def test_bfs_targets_are_the_numpy_bfs_parents_and_reachability_is_exact():
    """BFS is shortest paths on unit weights: the task's per-edge targets are the neighbours
    one edge closer (`valid_parents` of the numpy BFS), on graphs with unreachable nodes; and an
    untrained model's reachability is the numpy BFS's (the solve's flag), at any size."""
    model = graphs.GraphDEQ(6, "bfs", key=jax.random.key(0))
    for n in (12, 300):
        g = graphs.sample("erdos-renyi", n, 3, seed=0)
        reachable, distance = graphs.bfs(*g)
        assert not reachable.all()  # some nodes apart
        parents = graphs.valid_parents(g.adjacency, distance)
        weighted = graphs.from_edges(n, [np.argwhere(np.triu(a)) for a in g.adjacency], g.source)
        edge_ok, self_ok = graphs.ALGORITHMS["bfs"].targets(weighted)
        for b in range(3):
            real = weighted.graph.receivers[b] < n
            ri, si = weighted.graph.receivers[b][real], weighted.graph.senders[b][real]
            np.testing.assert_array_equal(edge_ok[b][real], parents[b, ri, si])
            np.testing.assert_array_equal(self_ok[b], parents[b, np.arange(n), np.arange(n)])
        out = graphs.predict(model, graphs.from_adjacency(g.adjacency), g.source)
        np.testing.assert_array_equal(out.reachable, reachable)


@pytest.mark.bad_input
def test_predict_reads_edge_lists_as_their_adjacency_and_refuses_bad_ones():
    """An edge list (with more padding than the rule's) gets its adjacency's answers, and the
    answers are the model's own on each graph; a malformed one is refused in one line naming
    what is wrong."""
    model = graphs.GraphDEQ(6, "shortest-paths", key=jax.random.key(3))
    small = graphs.sample("tree", 20, 2, seed=1)
    upper = np.triu(np.random.default_rng(0).uniform(0.1, 1.0, (2, 20, 20)), 1)
    dense_w = np.where(small.adjacency, upper + np.swapaxes(upper, 1, 2), 0.0)
    e = graphs.from_adjacency(small.adjacency, dense_w, edges=100)  # more padding than the rule's
    dense = graphs.from_adjacency(small.adjacency, dense_w)
    out = graphs.predict(model, e, small.source, budget=40)
    np.testing.assert_array_equal(
        out.parent, graphs.predict(model, dense, small.source, budget=40).parent
    )
    scores, _, converged = graphs._model.solve_graphs(
        model, (e, jnp.arange(20) == small.source[:, None]), jnp.asarray(40)
    )
    np.testing.assert_array_equal(
        out.parent, graphs.choose_parents(scores, e, small.source, np.asarray(converged))
    )
    model = graphs.GraphDEQ(6, "bfs", key=jax.random.key(3))
    one_way = np.asarray(e.receivers).copy()
    one_way[0, 0] = 20  # drop one direction of an edge
    s, r = np.asarray(e.senders), np.asarray(e.receivers)
    cases = [
        (eqattn.Graph(s, r, num_nodes=0), "`num_nodes` must be an int >= 1"),
        (eqattn.Graph(s[:, :-1], r, num_nodes=20), "integers of one shape"),
        (eqattn.Graph(s.astype(float), r, num_nodes=20), "integers of one shape"),
        (eqattn.Graph(s, r + 5, num_nodes=20), "`receivers` must be nodes in 0 .. 19"),
        (eqattn.Graph(s, np.where(r < 20, s, 20), num_nodes=20), "no self-loops"),
        (eqattn.Graph(s, one_way, num_nodes=20), "each edge's reverse must be listed too"),
        (eqattn.Graph(s[0], r[0], num_nodes=20), "must be a batch"),
    ]
    for graph, message in cases:
        with pytest.raises(eqattn.GraphError) as error:
            graphs.predict(model, graph, small.source)
        assert message in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(eqattn.GraphError, match="`source` must be in 0 .. 19"):
        graphs.predict(model, e, np.array([0, 20]))
    with pytest.raises(eqattn.GraphError, match="`model` must be a graph model"):
        graphs.predict(eqx.nn.Identity(), e, small.source)
    with pytest.raises(eqattn.GraphError, match="`graph` must be an eqattn.Graph"):
        graphs.predict(model, small.adjacency, small.source)
    with pytest.raises(ValueError, match="`algorithm` must be one of bfs"):
        graphs.GraphDEQ(6, "dfs", key=jax.random.key(0))
