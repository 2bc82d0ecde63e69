"""The graph data and models: the families' shapes, BFS against scipy's shortest paths, the BFS
parents, the API's refusals, and permutation equivariance of every model kind."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.sparse.csgraph import shortest_path

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
    model = graphs.GraphDEQ(8, key=jax.random.key(0))
    for (adjacency, src), message in cases:
        for call in (graphs.bfs, lambda x, y: graphs.predict(model, x, y)):
            with pytest.raises(ValueError) as error:
                call(adjacency, src)
            assert message in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ValueError, match="`family` must be one of path"):
        graphs.sample("star", 5, 1, seed=0)
    with pytest.raises(ValueError, match="`n` must be an int >= 1"):
        graphs.sample("path", 0, 1, seed=0)


MODELS = {
    "deq propagation": lambda k: graphs.GraphDEQ(8, key=k),
    "explicit propagation": lambda k: graphs.GraphStack(8, 3, key=k),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_models_are_permutation_equivariant(name):
    """Permuting a graph's nodes (with their inputs) permutes the reachability logits and the
    parent scores alike, and changes no solve's statistics (float64)."""
    model = MODELS[name](jax.random.key(0))
    model = jax.tree.map(lambda x: x.astype(jnp.float64) if eqx_float(x) else x, model)
    g = graphs.sample("erdos-renyi", 12, 1, seed=3)
    x = graphs.features(g.source, 12, jax.random.key(1)).astype(jnp.float64)[0]
    a = jnp.asarray(g.adjacency[0])
    order = np.random.default_rng(0).permutation(12)
    p = model.predict((x, a), budget=60)
    q = model.predict((x[order], a[order][:, order]), budget=60)
    np.testing.assert_allclose(q.logits[0], p.logits[0][order], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(q.logits[1], p.logits[1][order][:, order], rtol=1e-9, atol=1e-9)
    assert int(q.steps) == int(p.steps)


def eqx_float(x) -> bool:
    return isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.floating)


def test_predict_pads_inside_and_the_padding_changes_nothing():
    """The graphs of one call are padded to a power of two of nodes and of graphs (isolated
    nodes, empty graphs): an untrained model's answers for a graph are the same in a call of
    its own size and padded to twice its nodes and of several graphs, with the same inputs."""
    model = graphs.GraphDEQ(8, key=jax.random.key(2))
    g = graphs.sample("tree", 16, 3, seed=0)
    alone = graphs.predict(model, g.adjacency, g.source)
    padded = np.zeros((3, 17, 17), bool)
    padded[:, :16, :16] = g.adjacency
    wide = graphs.predict(model, padded, g.source, budget=graphs.budget_for(16))
    # the inputs (identity vectors) are drawn for the padded shape: compare the reachability,
    # which the propagation block reads from the source's code alone, and the steps
    np.testing.assert_array_equal(wide.reachable[:, :16], alone.reachable)
    assert not wide.reachable[:, 16].any() and (wide.parent[:, 16] == 16).all()


def test_the_edge_list_form_computes_the_dense_form():
    """Over an edge list (with padding edges), the block is dense attention masked by the
    adjacency, the parent scores are the dense ones per edge, `choose_parent` is the dense
    row's argmax over neighbours and self, and a permutation of the nodes permutes the answers
    (float64, an Erdős–Rényi graph with isolated nodes)."""
    model = graphs.GraphDEQ(6, key=jax.random.key(0))
    model = jax.tree.map(lambda x: x.astype(jnp.float64) if eqx_float(x) else x, model)
    g = graphs.sample("erdos-renyi", 14, 1, seed=5)
    a = jnp.asarray(g.adjacency[0])
    e = graphs.edge_list(g.adjacency, edges=int(a.sum()) + 5)  # five padding edges
    s, r = jnp.asarray(e.senders[0]), jnp.asarray(e.receivers[0])
    z = jax.random.normal(jax.random.key(1), (14, 6), jnp.float64)
    np.testing.assert_allclose(model.block(z, s, r), model.block(z, a), atol=1e-12)
    x = graphs.features(g.source, 14, jax.random.key(1)).astype(jnp.float64)[0]
    dense, sparse = model.predict((x, a), budget=60), model.predict((x, s, r), budget=60)
    assert int(dense.steps) == int(sparse.steps)
    np.testing.assert_allclose(sparse.logits[0], dense.logits[0], atol=1e-12)
    real = np.asarray(r) < 14
    np.testing.assert_allclose(
        sparse.logits[1][real], dense.logits[1][np.asarray(r)[real], np.asarray(s)[real]]
    )
    chosen = graphs.choose_parent(*sparse.logits[1:], s, r)
    np.testing.assert_array_equal(chosen, jnp.argmax(dense.logits[1], -1))
    order = np.random.default_rng(0).permutation(14)
    new = np.append(np.argsort(order), 14)  # old node -> its new index (14: padding stays)
    q = model.predict((x[order], jnp.asarray(new[s]), jnp.asarray(new[r])), budget=60)
    np.testing.assert_allclose(q.logits[0], sparse.logits[0][order], atol=1e-9)
    np.testing.assert_allclose(q.logits[1], sparse.logits[1], atol=1e-9)  # per edge


def test_predict_reads_large_graphs_and_edge_lists_as_edges_and_refuses_bad_ones():
    """A 200-node graph (read as edges) gets the dense model's answers; an edge list gets its
    adjacency's; a malformed one is refused in one line naming what is wrong."""
    model = graphs.GraphDEQ(8, key=jax.random.key(3))
    g = graphs.sample("grid", 200, 2, seed=1)
    out = graphs.predict(model, g.adjacency, g.source, budget=40)
    x = graphs.features(np.append(g.source, [0] * 6), 256, jax.random.key(0))[:2, :200]
    for b in range(2):
        p = model.predict((x[b], jnp.asarray(g.adjacency[b])), budget=40)
        np.testing.assert_array_equal(out.parent[b], np.argmax(p.logits[1], -1))
        np.testing.assert_array_equal(out.reachable[b], p.logits[0] > 0)
    small = graphs.sample("tree", 20, 2, seed=1)
    e = graphs.edge_list(small.adjacency, edges=100)  # more padding than the rule's
    np.testing.assert_array_equal(
        graphs.predict(model, e, small.source).parent,
        graphs.predict(model, small.adjacency, small.source).parent,
    )
    one_way = e.receivers.copy()
    one_way[0, 0] = 20  # drop one direction of an edge
    cases = [
        (e._replace(num_nodes=0), "`num_nodes` must be an int >= 1"),
        (e._replace(senders=e.senders[:, :-1]), "must be integers of one shape [B, E]"),
        (e._replace(senders=e.senders.astype(float)), "must be integers of one shape [B, E]"),
        (e._replace(receivers=e.receivers + 5), "edge ends must be nodes in 0 .. 19"),
        (e._replace(receivers=np.where(e.receivers < 20, e.senders, 20)), "no self-loops"),
        (e._replace(receivers=one_way), "each edge's reverse must be listed too"),
    ]
    for graph, message in cases:
        with pytest.raises(ValueError) as error:
            graphs.predict(model, graph, small.source)
        assert message in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ValueError, match="`source` must be in 0 .. 19"):
        graphs.predict(model, e, np.array([0, 20]))


def test_the_training_loss_over_edges_is_the_dense_loss():
    """Above 128 nodes `examples` gives edge lists: the loss and the answers' rightness are the
    dense form's on the same graphs (float64), and a training step on them runs."""
    from eqattn.graphs._data import draw, examples, node_scores

    model = graphs.GraphDEQ(6, key=jax.random.key(0))
    model = jax.tree.map(lambda x: x.astype(jnp.float64) if eqx_float(x) else x, model)
    rng = np.random.default_rng(0)
    adjacency, source, real = draw(rng, 3, (120, 130), graphs.FAMILIES, pad=130)
    (x, s, r), targets = examples(adjacency, source, real, np.random.default_rng(1))
    assert s.shape == (3, 8 * 130) and len(targets[1]) == 2  # edges: (edge_ok, self_ok)
    x = jnp.asarray(x, jnp.float64)

    def scored(*graph):
        logits = jax.vmap(lambda *a: model.predict(a, budget=20).logits)(x, *graph)
        return logits

    sparse = node_scores(scored(s, r), (x, s, r), targets)
    _, distance = graphs.bfs(adjacency, source)
    dense_targets = (targets[0], graphs.valid_parents(adjacency, distance), real)
    dense = node_scores(scored(jnp.asarray(adjacency)), (x, adjacency), dense_targets)
    np.testing.assert_allclose(sparse[0], dense[0], rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(sparse[1], dense[1])
    np.testing.assert_array_equal(sparse[2], dense[2])
    # one optimizer step of the task on these edge lists (float32, as training runs)
    import optax

    from eqattn.graphs._task import make_train_step

    optimizer = optax.adam(1e-3)
    model32 = graphs.GraphDEQ(6, key=jax.random.key(0))
    step = make_train_step(graphs.GraphConfig(), optimizer)
    inputs = (jnp.asarray(x, jnp.float32), s, r)
    state = optimizer.init(eqx.filter(model32, eqx.is_array))
    new, _, loss, _, _ = eqx.filter_jit(step)(model32, state, inputs, targets, None, None)
    assert np.isfinite(float(loss)) and not np.allclose(new.block.first, model32.block.first)
