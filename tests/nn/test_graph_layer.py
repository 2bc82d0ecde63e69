"""`nn.ImplicitGraphAttention`, `nn.ExplicitGraphAttention` and `nn.GraphAttentionStep`: with exact
parameters the fixed point is Dijkstra's distances (scipy) on a shift channel, with relative
scores on weights from 1e-6 to 1e6 in float32 too, and the minimax (bottleneck) distances of a
float64 numpy reference on a bottleneck channel; a step against a dense float64 numpy
computation; gradients against finite differences; a solve stopped with a front still moving
is reported; bad input."""

import heapq

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra

import eqattn
from eqattn import Picard, nn

from ..checks import unchecked


def _graph(seed, n=40, degree=3.0):
    """An undirected Erdős–Rényi graph (both directions of each edge), weights in (0, 1]."""
    rng = np.random.default_rng(seed)
    i, j = np.nonzero(np.triu(rng.random((n, n)) < degree / n, 1))
    w = 1.0 - rng.random(len(i))
    return np.concatenate([i, j]), np.concatenate([j, i]), np.concatenate([w, w])


def _g(senders, receivers, w, n):
    return eqattn.Graph(senders, receivers, num_nodes=n, edge_features=np.asarray(w)[:, None])


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
    kc, ks = jax.random.split(jax.random.key(0))
    layer = nn.ImplicitGraphAttention(
        nn.GraphAttentionStep(width, 1, key=ks, bottlenecks=bottlenecks, dtype=jnp.float64),
        encoder=eqx.nn.Linear(1, width, key=kc, dtype=jnp.float64),
    )
    query = jnp.zeros(width).at[0].set(-1.0)
    code_bias = jnp.concatenate([jnp.zeros(shifts), jnp.full(bottlenecks, -1e3)])
    return eqx.tree_at(
        lambda m: (
            m.step.shift,
            m.step.floor.weight,
            m.step.floor.bias,
            m.step.query,
            m.step.log_beta,
            m.encoder.weight,
            m.encoder.bias,
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
    state, eq = layer.forward(_g(senders, receivers, w, n), anchors, jnp.ones((n, 1)), budget=200)
    assert bool(eq.converged) and eq.stats["settled"].all()
    assert (np.asarray(state.reached) == np.isfinite(expected)).all()
    got = np.asarray(state.values[:, 0])
    finite = np.isfinite(expected)
    np.testing.assert_allclose(got[finite], expected[finite], atol=1e-9)
    assert (got[~finite] == 0).all()  # unreached nodes keep the zero state


def test_bottleneck_channel_is_minimax():
    senders, receivers, w = _graph(3)
    n = 40
    layer = _exact_layer(0, 1)
    layer = eqx.tree_at(lambda m: m.step.query, layer, -jnp.ones(1))
    anchors = np.arange(n) == 0
    state, eq = layer.forward(_g(senders, receivers, w, n), anchors, jnp.ones((n, 1)), budget=200)
    expected = _minimax(senders, receivers, w, 0, n)
    reachable = np.isfinite(expected) & ~anchors
    assert bool(eq.converged)
    np.testing.assert_allclose(
        np.asarray(state.values[:, 0])[reachable], expected[reachable], atol=1e-9
    )


def test_step_against_numpy():
    """One step at a moderate beta: the softmax over flagged senders of `q . m`, by hand."""
    senders, receivers, w = _graph(4, n=12, degree=4.0)
    n = 12
    step = nn.GraphAttentionStep(3, 1, key=jax.random.key(1), beta=2.0, dtype=jnp.float64)
    rng = np.random.default_rng(0)
    z, flag = rng.standard_normal((n, 3)), (rng.random(n) < 0.6).astype(np.float64)
    out = step(nn.GraphState(jnp.asarray(z), jnp.asarray(flag)), _g(senders, receivers, w, n))
    new, got_flag = out.values, out.flag
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
        graph = eqattn.Graph(senders, receivers, num_nodes=10, edge_features=edges)
        return moved(nn.GraphState(z, flag), graph).values

    z = jax.random.normal(jax.random.key(3), (10, 2), jnp.float64)
    check_grads(f, (z, jnp.asarray(w[:, None]), step.query), order=1, modes=["rev"])
    relative = nn.GraphAttentionStep(
        2, 1, key=jax.random.key(2), bottlenecks=0, relative=True, dtype=jnp.float64
    )
    z = jnp.abs(z) + 1.0  # distances: one sign, away from 0
    graph = eqattn.Graph(senders, receivers, num_nodes=10, edge_features=jnp.asarray(w[:, None]))
    check_grads(
        lambda z, q: (
            eqx.tree_at(lambda s: s.query, relative, q)(nn.GraphState(z, flag), graph).values
        ),
        (z, -jnp.abs(relative.query)),
        order=1,
        modes=["rev"],
    )


@pytest.mark.float32
def test_relative_scores_are_bellman_ford_on_weights_from_1e_minus_6_to_1e6():
    """A shift channel with relative scores, the anchor at distance 0 (no encoder), float32:
    every distance within 1e-6 of scipy's Dijkstra (float64) on weights spanning 12 orders of
    magnitude and near ties, and every node's best edge on a shortest path."""
    n, rng = 200, np.random.default_rng(3)
    senders, receivers, _ = _graph(7, n=n, degree=5.0)
    half = len(senders) // 2
    for w in (10.0 ** rng.uniform(-6, 6, half), 1.0 + rng.uniform(0, 1e-3, half)):
        w = np.concatenate([w, w])
        step = nn.GraphAttentionStep(1, 1, key=jax.random.key(0), bottlenecks=0, relative=True)
        step = eqx.tree_at(lambda s: (s.shift, s.query), step, (jnp.ones((1, 1)), -jnp.ones(1)))
        layer = nn.ImplicitGraphAttention(step)
        graph = _g(senders, receivers, w.astype(np.float32), n)
        state, eq = layer.forward(graph, np.arange(n) == 0, budget=4 * n)
        expected = dijkstra(csr_matrix((w, (senders, receivers)), shape=(n, n)), indices=0)
        reached = np.isfinite(expected)
        assert bool(eq.converged) and (np.asarray(state.reached) == reached).all()
        got = np.asarray(state.values[:, 0], np.float64)
        np.testing.assert_allclose(got[reached], expected[reached], rtol=1e-6)
        scores = np.asarray(layer.scores(state, graph))
        assert np.asarray(layer.resolved(state, graph)).all()
        for i in np.flatnonzero(reached)[1:]:
            into = np.flatnonzero(receivers == i)
            e = into[np.argmax(scores[into])]
            tight = expected[senders[e]] + w[e] - expected[i]
            assert tight <= 1e-6 * expected[i], (i, tight)


def test_a_solve_stopped_on_the_whole_state_with_a_front_still_moving_is_reported():
    """A star of 500 leaves with a tail of 40 light edges hung on a leaf, solved with the
    whole-state test (rtol 0.1): the solver stops while the tail's front still moves, a small
    change against the whole state; the layer says so (`RESULTS.unsettled`, per node in
    `stats["settled"]`, and `throw` raises). Its default, the elementwise test, runs until
    every node has settled."""
    leaves, tail = 500, 40
    star = [(0, i) for i in range(1, leaves + 1)]
    path = [(leaves + k, leaves + k + 1) for k in range(tail)]
    pairs = np.array(star + path)
    w = np.concatenate([np.ones(leaves), np.full(tail, 1e-3)])
    n = leaves + tail + 1
    i, j = pairs[:, 0], pairs[:, 1]
    graph = _g(np.concatenate([i, j]), np.concatenate([j, i]), np.concatenate([w, w]), n)
    layer = _exact_layer(1, 0)
    anchors, x = np.arange(n) == 0, jnp.ones((n, 1))
    coarse = eqx.tree_at(lambda m: m.solver, layer, Picard(rtol=0.1, max_steps=1000))
    state, eq = coarse.forward(graph, anchors, x)
    assert not bool(eq.converged) and eq.result == eqattn.RESULTS.unsettled
    assert not eq.stats["settled"].all() and int(eq.steps) < tail
    thrown = nn.ImplicitGraphAttention(
        coarse.step, encoder=coarse.encoder, solver=coarse.solver, throw=True
    )
    with pytest.raises(eqx.EquinoxRuntimeError, match="still moved"):
        jax.block_until_ready(thrown.forward(graph, anchors, x)[0].values)
    state, eq = layer.forward(graph, anchors, x, budget=2 * n)
    assert bool(eq.converged) and eq.stats["settled"].all() and state.reached.all()
    expected = np.concatenate([[0.0], np.ones(leaves), 1 + 1e-3 * np.arange(1, tail + 1)])
    np.testing.assert_allclose(state.values[:, 0], expected, atol=1e-9)


def test_the_explicit_stack_answers_within_its_depth():
    """Untied steps applied once each: a node 4 edges on is reached by 4 steps, not by 3."""
    n = 8
    i = np.arange(n - 1)
    graph = _g(np.concatenate([i, i + 1]), np.concatenate([i + 1, i]), np.ones(2 * (n - 1)), n)
    keys = jax.random.split(jax.random.key(0), 4)
    for depth in (3, 4):
        stack = nn.ExplicitGraphAttention(
            [nn.GraphAttentionStep(2, 1, key=k) for k in keys[:depth]]
        )
        state = stack(graph, np.arange(n) == 0)
        assert state.reached.tolist() == [True] * (depth + 1) + [False] * (n - depth - 1)


@pytest.mark.bad_input
def test_bad_input():
    kc, ks = jax.random.split(jax.random.key(0))
    layer = nn.ImplicitGraphAttention(
        nn.GraphAttentionStep(4, 1, key=ks), encoder=eqx.nn.Linear(1, 4, key=kc)
    )
    s, r, e = jnp.array([0, 1]), jnp.array([1, 0]), jnp.ones((2, 1))
    g = eqattn.Graph(s, r, num_nodes=2, edge_features=e)
    x = jnp.ones((2, 1))
    for call, match in [
        (lambda: layer.forward(g, jnp.array([1, 0]), x), "`anchors` must be boolean"),
        (lambda: layer.forward(eqattn.Graph(s, r, num_nodes=2, edge_features=jnp.ones((2, 2))), jnp.array([True, False]), x), r"`edge_features` must be floating-point \[\*batch, E, 1\]"),
        (lambda: layer.forward(g, jnp.array([True, False]), jnp.ones((3, 1))), "`node_features` must be"),
        (lambda: layer.forward(g, jnp.array([True, False]), None), "`node_features` must be"),
        (lambda: layer.forward(g, jnp.array([True, False, False]), jnp.ones((3, 1))), "`anchors` must be \\[2\\]"),
        (lambda: nn.ImplicitGraphAttention(layer.step).forward(g, jnp.array([True, False]), x), "no encoder|read by an encoder"),
    ]:  # fmt: skip
        with unchecked(), pytest.raises(eqattn.GraphError, match=match):
            call()
    with pytest.raises(ValueError, match="`bottlenecks` must be in 0 .. width"):
        nn.GraphAttentionStep(2, 1, key=jax.random.key(0), bottlenecks=3)
    for beta in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="`beta` must be finite and > 0"):
            nn.GraphAttentionStep(2, 1, key=jax.random.key(0), beta=beta)
    with pytest.raises(ValueError, match="`width` must be an int >= 1"):
        nn.GraphAttentionStep(0, 1, key=jax.random.key(0))
    with pytest.raises(TypeError, match="`step` must be a graph step"):
        nn.ImplicitGraphAttention(eqx.nn.Linear(1, 1, key=kc))
