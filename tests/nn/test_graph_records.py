"""`nn.GraphRecordsStep` and `nn.ImplicitGraphAttention(records=True)`: the fixed point's lists
against the records of each node's path computed in numpy, the parents its scores name against
scipy's minimum spanning tree, gradients against finite differences, bad input."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import breadth_first_order, minimum_spanning_tree

import eqattn
from eqattn import nn

from ..checks import unchecked


def _records(weights: np.ndarray, k: int) -> np.ndarray:
    """The suffix maxima of a path's weights, the largest first, the first k, 0 past the end."""
    out = [w for i, w in enumerate(weights) if (w > weights[i + 1 :]).all()]
    return np.array((out + [0.0] * k)[:k])


def _solve(layer, senders, receivers, w, source, n):
    anchors = np.arange(n) == source
    graph = eqattn.Graph(senders, receivers, num_nodes=n, edge_features=np.asarray(w)[:, None])
    state, eq = layer.forward(graph, anchors, budget=4 * n)
    scores = layer.scores(state, graph)
    return state.values, state.reached, eq, np.asarray(scores), layer.resolved(state, graph)


def _layer(k: int, units: int = 3):
    step = nn.GraphRecordsStep(k, key=jax.random.key(0), units=units, dtype=jnp.float64)
    return nn.ImplicitGraphAttention(step)


def test_the_extension_of_record_arrays_is_the_lists():
    """`extend` on `[E, k]` record arrays (0 past the end) against tuples: the records heavier
    than the weight, then the weight; a weight equal to a record drops it and ends the list."""
    from eqattn.nn._graph_records import extend

    def extended(path: tuple, w: float) -> tuple:
        return (*(x for x in path if x > w), w)

    rng = np.random.default_rng(0)
    lists = []
    for _ in range(64):
        path: tuple = ()
        for w in rng.random(rng.integers(0, 9)):
            path = extended(path, float(w))
        lists.append(path)
    weights = np.round(rng.random(64), 1)  # some equal to a record
    k = 5
    padded = np.array([(p + (0.0,) * k)[:k] for p in lists])
    got = np.asarray(extend(jnp.asarray(padded), jnp.asarray(weights)))
    want = [(extended(p, float(w)) + (0.0,) * k)[:k] for p, w in zip(lists, weights)]
    np.testing.assert_allclose(got, np.array(want))


@pytest.mark.parametrize("k", [3, 30])
def test_lists_are_the_records_of_each_path(k):
    """On a path graph every node's list is its path's records (mapped), the last ones dropped
    past k."""
    n, rng = 24, np.random.default_rng(k)
    w = rng.random(n - 1) + 0.05
    i = np.arange(n - 1)
    senders, receivers = np.concatenate([i, i + 1]), np.concatenate([i + 1, i])
    layer = _layer(k)
    lists, reached, eq, _, resolved = _solve(
        layer, senders, receivers, np.concatenate([w, w]), 0, n
    )
    assert bool(eq.converged) and bool(reached.all())
    mapped = np.asarray(layer.step.weight_map(jnp.asarray(w)))
    for node in range(n):
        np.testing.assert_allclose(np.asarray(lists[node]), _records(mapped[:node], k), rtol=1e-12)
    # past k records a node's child can tie with its parent: no parent is claimed there
    full = np.array(
        [len(_records(mapped[:node], n)[_records(mapped[:node], n) > 0]) for node in range(n)]
    )
    assert (np.asarray(resolved)[full < k]).all()


@pytest.mark.parametrize("seed", [0, 1])
def test_parents_are_the_minimum_spanning_tree(seed):
    """The best-scoring incoming edge's sender is the node's parent in scipy's tree rooted at
    the source (distinct weights: one tree); nodes the source does not reach hear nothing."""
    n, rng = 60, np.random.default_rng(seed)
    i, j = np.nonzero(np.triu(rng.random((n, n)) < 3.0 / n, 1))
    w = rng.random(len(i)) + 1e-3
    senders, receivers, ww = np.concatenate([i, j]), np.concatenate([j, i]), np.tile(w, 2)
    tree = minimum_spanning_tree(coo_matrix((w, (i, j)), shape=(n, n)))
    order, parent = breadth_first_order(tree + tree.T, 0, directed=False)
    lists, reached, eq, scores, resolved = _solve(_layer(8), senders, receivers, ww, 0, n)
    assert bool(eq.converged) and np.asarray(resolved).all()
    assert set(np.flatnonzero(np.asarray(reached))) == set(order.tolist())
    for node in order[1:]:
        into = np.flatnonzero(receivers == node)
        assert senders[into[np.argmax(scores[into])]] == parent[node]
        assert np.sum(scores[into] == 0) == 1  # one edge ties at every level
    assert (scores[~np.isin(senders, order)] == -np.inf).all()


def test_step_gradients():
    n, rng = 10, np.random.default_rng(5)
    i, j = np.nonzero(np.triu(rng.random((n, n)) < 0.5, 1))
    w = rng.random(len(i)) + 0.1
    s, r, e = np.concatenate([i, j]), np.concatenate([j, i]), np.tile(w, 2)[:, None]
    step = nn.GraphRecordsStep(3, key=jax.random.key(1), units=2, beta=5.0, dtype=jnp.float64)
    z = jnp.asarray(np.sort(rng.random((n, 3)), axis=1)[:, ::-1] + 1.0)
    flag = jnp.asarray(rng.random(n) < 0.7, jnp.float64)

    def f(log_scale, offset, log_beta, edges):
        moved = eqx.tree_at(lambda c: (c.log_scale, c.offset, c.log_beta), step,
                            (log_scale, offset, log_beta))  # fmt: skip
        graph = eqattn.Graph(s, r, num_nodes=n, edge_features=edges)
        state = nn.GraphState(z, flag)
        live = np.asarray(flag)[s] > 0.5
        return moved(state, graph).values, jnp.where(live, moved.scores(state, graph), 0.0)

    args = (step.log_scale, step.offset, step.log_beta, jnp.asarray(e))
    check_grads(f, args, order=1, modes=["rev"], eps=1e-6)


def test_lists_cut_at_k_that_tie_are_not_resolved():
    """A path whose weights fall away from the source: every edge a record, so past k = 3 a
    node's list (3 records or more) and its child's message back to it agree in their first 3
    records; those nodes are not resolved (their parent is not claimed), the first ones are,
    and so is the last (no child)."""
    n = 8
    i = np.arange(n - 1)
    w = np.linspace(2.0, 1.0, n - 1)  # decreasing from the source: each edge a record
    senders, receivers = np.concatenate([i, i + 1]), np.concatenate([i + 1, i])
    *_, scores, resolved = _solve(_layer(3), senders, receivers, np.concatenate([w, w]), 0, n)
    resolved = np.asarray(resolved)
    assert resolved[:3].all() and not resolved[3 : n - 1].any() and resolved[n - 1]


def test_more_records_keep_the_parameters():
    """`with_records` carries the same weight map and temperature in a longer list: on the
    falling path above, 3 records leave nodes unresolved, 8 none, the lists' first 3 the same."""
    n = 8
    i = np.arange(n - 1)
    w = np.linspace(2.0, 1.0, n - 1)
    senders, receivers = np.concatenate([i, i + 1]), np.concatenate([i + 1, i])
    short = _layer(3)
    longer = nn.ImplicitGraphAttention(short.step.with_records(8))
    assert longer.step.records == 8 and eqx.tree_equal(
        (short.step.log_scale, short.step.offset, short.step.log_beta),
        (longer.step.log_scale, longer.step.offset, longer.step.log_beta),
    )
    a = _solve(short, senders, receivers, np.concatenate([w, w]), 0, n)
    b = _solve(longer, senders, receivers, np.concatenate([w, w]), 0, n)
    assert not np.asarray(a[4]).all() and np.asarray(b[4]).all()
    np.testing.assert_allclose(np.asarray(b[0])[:, :3], np.asarray(a[0]), rtol=1e-12)


@pytest.mark.bad_input
def test_bad_input():
    with pytest.raises(ValueError, match="`units` must be an int >= 1"):
        nn.GraphRecordsStep(4, key=jax.random.key(0), units=0)
    with pytest.raises(ValueError, match="`beta` must be finite and > 0"):
        nn.GraphRecordsStep(4, key=jax.random.key(0), beta=-1.0)
    layer = _layer(4)
    s, r = jnp.array([0, 1]), jnp.array([1, 0])
    g = eqattn.Graph(s, r, num_nodes=2, edge_features=jnp.ones((2, 2)))
    with unchecked(), pytest.raises(eqattn.GraphError, match=r"`edge_features` must be"):
        layer.forward(g, jnp.array([True, False]))
