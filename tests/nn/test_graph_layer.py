"""`nn.ImplicitGraphAttention` and `nn.GraphAttentionStep`: with exact parameters the fixed point
is Dijkstra's distances (scipy) on a shift channel and the minimax (bottleneck) distances of a
float64 numpy reference on a bottleneck channel; a step against a dense float64 numpy
computation; gradients against finite differences; bad input."""

import heapq

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra

from eqattn import nn

from ..checks import unchecked


def _graph(seed, n=40, degree=3.0):
    """An undirected Erdős–Rényi graph (both directions of each edge), weights in (0, 1]."""
    rng = np.random.default_rng(seed)
    i, j = np.nonzero(np.triu(rng.random((n, n)) < degree / n, 1))
    w = 1.0 - rng.random(len(i))
    return np.concatenate([i, j]), np.concatenate([j, i]), np.concatenate([w, w])


def _minimax(senders, receivers, weights, source, n):
    """Bottleneck distances: min over paths of the largest weight (a Dijkstra on (min, max))."""
    out = np.full(n, np.inf)
    out[source] = -np.inf
    heap = [(-np.inf, source)]
    while heap:
        b, u = heapq.heappop(heap)
        if b > out[u]:
            continue
        for e in np.flatnonzero(senders == u):
            v, c = receivers[e], max(b, weights[e])
            if c < out[v]:
                out[v] = c
                heapq.heappush(heap, (c, v))
    return out


def _exact_layer(shifts: int, bottlenecks: int, beta: float = 1e6):
    """A layer whose shift channels add the weight, whose bottleneck channels floor at it, and
    whose scores read minus the first channel: Bellman-Ford (or its (min, max) twin) exactly."""
    width = shifts + bottlenecks
    layer = nn.ImplicitGraphAttention(
        width, 1, 1, key=jax.random.key(0), bottlenecks=bottlenecks, dtype=jnp.float64
    )
    query = jnp.zeros(width).at[0].set(-1.0)
    code_bias = jnp.concatenate([jnp.zeros(shifts), jnp.full(bottlenecks, -1e3)])
    return eqx.tree_at(
        lambda m: (
            m.cell.shift,
            m.cell.floor.weight,
            m.cell.floor.bias,
            m.cell.query,
            m.cell.log_beta,
            m.code.weight,
            m.code.bias,
        ),
        layer,
        (
            jnp.ones((shifts, 1), jnp.float64),
            jnp.ones((bottlenecks, 1), jnp.float64),
            jnp.zeros(bottlenecks, jnp.float64),
            query,
            jnp.log(jnp.float64(beta)),
            jnp.zeros((width, 1), jnp.float64),
            code_bias,
        ),
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shift_channel_is_dijkstra(seed):
    senders, receivers, w = _graph(seed)
    n = 40
    expected = dijkstra(csr_matrix((w, (receivers, senders)), shape=(n, n)), indices=0)
    layer = _exact_layer(1, 0)
    anchors = np.arange(n) == 0
    (states, reached), eq = layer.forward(
        jnp.ones((n, 1)), anchors, senders, receivers, w[:, None], budget=200
    )
    assert bool(eq.converged)
    assert (np.asarray(reached) == np.isfinite(expected)).all()
    got = np.asarray(states[:, 0])
    finite = np.isfinite(expected)
    np.testing.assert_allclose(got[finite], expected[finite], atol=1e-9)
    assert (got[~finite] == 0).all()  # unreached nodes keep the zero state


def test_bottleneck_channel_is_minimax():
    senders, receivers, w = _graph(3)
    n = 40
    layer = _exact_layer(0, 1)
    layer = eqx.tree_at(lambda m: m.cell.query, layer, -jnp.ones(1))
    anchors = np.arange(n) == 0
    (states, reached), eq = layer.forward(
        jnp.ones((n, 1)), anchors, senders, receivers, w[:, None], budget=200
    )
    expected = _minimax(senders, receivers, w, 0, n)
    reachable = np.isfinite(expected) & ~anchors
    assert bool(eq.converged)
    np.testing.assert_allclose(np.asarray(states[:, 0])[reachable], expected[reachable], atol=1e-9)


def test_step_against_numpy():
    """One step at a moderate beta: the softmax over flagged senders of `q . m`, by hand."""
    senders, receivers, w = _graph(4, n=12, degree=4.0)
    n = 12
    step = nn.GraphAttentionStep(3, 1, key=jax.random.key(1), beta=2.0, dtype=jnp.float64)
    rng = np.random.default_rng(0)
    z, flag = rng.standard_normal((n, 3)), (rng.random(n) < 0.6).astype(np.float64)
    new, got_flag = step(jnp.asarray(z), jnp.asarray(flag), senders, receivers, w[:, None])
    shift, q = np.asarray(step.shift)[:, 0], np.asarray(step.query)
    floor = np.asarray(step.floor.weight)[:, 0], np.asarray(step.floor.bias)
    for i in range(n):
        edges = [e for e in range(len(senders)) if receivers[e] == i and flag[senders[e]] > 0]
        if not edges:
            assert got_flag[i] == 0 and (np.asarray(new[i]) == 0).all()
            continue
        m = np.stack(
            [
                np.concatenate(
                    [
                        z[senders[e], :2] + shift * w[e],
                        np.maximum(z[senders[e], 2:], floor[0] * w[e] + floor[1]),
                    ]
                )
                for e in edges
            ]
        )
        p = np.exp(2.0 * m @ q - np.max(2.0 * m @ q))
        np.testing.assert_allclose(np.asarray(new[i]), (p / p.sum()) @ m, rtol=1e-10)
        assert got_flag[i] == 1


def test_step_gradients():
    senders, receivers, w = _graph(5, n=10, degree=4.0)
    step = nn.GraphAttentionStep(2, 1, key=jax.random.key(2), beta=1.5, dtype=jnp.float64)
    flag = jnp.ones(10)

    def f(z, edges, query):
        moved = eqx.tree_at(lambda s: s.query, step, query)
        return moved(z, flag, senders, receivers, edges)[0]

    z = jax.random.normal(jax.random.key(3), (10, 2), jnp.float64)
    check_grads(f, (z, jnp.asarray(w[:, None]), step.query), order=1, modes=["rev"])


def test_bad_input():
    layer = nn.ImplicitGraphAttention(4, 1, 1, key=jax.random.key(0))
    s, r, e = jnp.array([0, 1]), jnp.array([1, 0]), jnp.ones((2, 1))
    with unchecked(), pytest.raises(ValueError, match="`anchors` must be boolean"):
        layer.forward(jnp.ones((2, 1)), jnp.array([1, 0]), s, r, e)
    with unchecked(), pytest.raises(ValueError, match=r"`edge_features` must be \[E, 1\]"):
        layer.forward(jnp.ones((2, 1)), jnp.array([True, False]), s, r, jnp.ones((3, 1)))
    with unchecked(), pytest.raises(ValueError, match="`node_features` must be"):
        layer.forward(jnp.ones((2, 2)), jnp.array([True, False]), s, r, e)
    with pytest.raises(ValueError, match="`bottlenecks` must be in 0 .. width"):
        nn.GraphAttentionStep(2, 1, key=jax.random.key(0), bottlenecks=3)
    with pytest.raises(ValueError, match="`beta` must be > 0"):
        nn.GraphAttentionStep(2, 1, key=jax.random.key(0), beta=0.0)
    with pytest.raises(ValueError, match="`width` must be an int >= 1"):
        nn.ImplicitGraphAttention(0, 1, 1, key=jax.random.key(0))
