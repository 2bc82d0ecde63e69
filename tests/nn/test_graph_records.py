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

from eqattn import graphs, nn

from ..checks import unchecked


def _records(weights: np.ndarray, k: int) -> np.ndarray:
    """The suffix maxima of a path's weights, the largest first, the first k, 0 past the end."""
    out = [w for i, w in enumerate(weights) if (w > weights[i + 1 :]).all()]
    return np.array((out + [0.0] * k)[:k])


def _solve(layer, senders, receivers, w, source, n):
    anchors = np.arange(n) == source
    x = jnp.ones((n, 1), jnp.float64)
    (lists, reached), eq = layer.forward(x, anchors, senders, receivers, w[:, None], budget=4 * n)
    scores = layer.scores(lists, reached, senders, receivers, jnp.asarray(w[:, None]))
    return lists, reached, eq, np.asarray(scores)


def _layer(k: int, units: int = 3):
    return nn.ImplicitGraphAttention(
        k, 1, 1, records=True, units=units, key=jax.random.key(0), dtype=jnp.float64
    )


@pytest.mark.parametrize("k", [3, 30])
def test_lists_are_the_records_of_each_path(k):
    """On a path graph every node's list is its path's records (mapped), the last ones dropped
    past k."""
    n, rng = 24, np.random.default_rng(k)
    w = rng.random(n - 1) + 0.05
    i = np.arange(n - 1)
    senders, receivers = np.concatenate([i, i + 1]), np.concatenate([i + 1, i])
    layer = _layer(k)
    lists, reached, eq, _ = _solve(layer, senders, receivers, np.concatenate([w, w]), 0, n)
    assert bool(eq.converged) and bool(reached.all())
    mapped = np.asarray(layer.cell.weight_map(jnp.asarray(w)))
    for node in range(n):
        np.testing.assert_allclose(np.asarray(lists[node]), _records(mapped[:node], k), rtol=1e-12)


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
    lists, reached, eq, scores = _solve(_layer(8), senders, receivers, ww, 0, n)
    assert bool(eq.converged)
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
        new, _ = moved(z, flag, s, r, edges)
        live = np.asarray(flag)[s] > 0.5
        return new, jnp.where(live, moved.scores(z, flag, s, r, edges), 0.0)

    args = (step.log_scale, step.offset, step.log_beta, jnp.asarray(e))
    check_grads(f, args, order=1, modes=["rev"], eps=1e-6)


def test_bad_input():
    with pytest.raises(ValueError, match="`edge_features` must be 1"):
        nn.ImplicitGraphAttention(4, 1, 2, records=True, key=jax.random.key(0))
    with pytest.raises(ValueError, match="`units` must be an int >= 1"):
        nn.GraphRecordsStep(4, key=jax.random.key(0), units=0)
    with pytest.raises(ValueError, match="`beta` must be > 0"):
        nn.GraphRecordsStep(4, key=jax.random.key(0), beta=-1.0)
    layer = _layer(4)
    s, r = jnp.array([0, 1]), jnp.array([1, 0])
    with unchecked(), pytest.raises(ValueError, match=r"`edge_features` must be \[E, 1\]"):
        layer.forward(jnp.ones((2, 1)), jnp.array([True, False]), s, r, jnp.ones((2, 2)))


def test_untrained_spanning_model_is_right_far_beyond_its_size():
    """The task's records DEQ, before training, names every tree parent of Delaunay graphs of
    512 nodes (the structure, not the training, carries the answer)."""
    model = graphs.GraphDEQ(4, "mst", key=jax.random.key(0))
    g = graphs.sample_weighted("delaunay", 512, 1, seed=3)
    prediction = graphs.predict(model, g.edges, g.source, weights=g.weights)
    assert prediction.converged.all()
    assert graphs.score_parents(g, prediction.parent, "mst").all()
