"""Soft shortest paths against the walk sum's closed form (float64 numpy), scipy's Dijkstra as
beta grows, finite differences, the shortest-path tree's edges; divergence, unreachable nodes
and bad input."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra

import eqattn

from ..checks import unchecked


def _digraph(seed, n=12, edges=30, low=0.5, high=1.5):
    """A random directed graph without duplicate edges or self-loops, weights in [low, high]."""
    rng = np.random.default_rng(seed)
    pairs = {(int(a), int(b)) for a, b in rng.integers(0, n, (3 * edges, 2)) if a != b}
    pairs = sorted(pairs)[:edges]
    senders, receivers = (np.array(x) for x in zip(*pairs))
    return senders, receivers, rng.uniform(low, high, len(pairs))


def _closed_form(senders, receivers, weights, source, n, beta):
    """-(1/beta) log((I - A^T)^{-1} e_source), A_ji = exp(-beta w_ji): the walk sum."""
    a = np.zeros((n, n))
    np.add.at(a, (senders, receivers), np.exp(-beta * weights))
    assert max(abs(np.linalg.eigvals(a))) < 1  # the series converges
    u = np.linalg.solve(np.eye(n) - a.T, np.eye(n)[source])
    with np.errstate(divide="ignore"):
        return np.where(u > 1e-300, -np.log(np.maximum(u, 1e-300)) / beta, np.inf)


def _solve(senders, receivers, weights, source, n, **kwargs):
    """`eqattn.soft_shortest_paths` on the edges given as arrays."""
    graph = eqattn.Graph(np.asarray(senders), np.asarray(receivers), num_nodes=n)
    return eqattn.soft_shortest_paths(graph, weights, source, **kwargs)


def _exact(senders, receivers, weights, source, n):
    graph = csr_matrix((weights, (senders, receivers)), shape=(n, n))
    return dijkstra(graph, indices=source, return_predecessors=True)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_fixed_point_is_the_walk_sums_closed_form(seed):
    senders, receivers, weights = _digraph(seed)
    eq = _solve(senders, receivers, weights, 3, 12, beta=2.0)
    assert bool(eq.converged)
    np.testing.assert_allclose(
        eq.value, _closed_form(senders, receivers, weights, 3, 12, 2.0), rtol=1e-9, atol=1e-10
    )


def test_it_tends_to_dijkstras_distances_from_below_as_beta_grows():
    """The soft minimum never exceeds the minimum, and the gap, (1/beta) log of the walks'
    weight relative to the shortest one's (each shortest path counts 1), falls as beta grows:
    below log(2)/beta once only unique shortest paths and longer walks remain."""
    senders, receivers, weights = _digraph(4, n=30, edges=90)
    exact, _ = _exact(senders, receivers, weights, 0, 30)
    reached = np.isfinite(exact)
    assert reached.sum() > 10
    gaps = []
    for beta in (5.0, 20.0, 100.0):
        soft = np.asarray(_solve(senders, receivers, weights, 0, 30, beta=beta).value)
        assert np.array_equal(np.isfinite(soft), reached)  # +inf exactly where no walk reaches
        gap = exact[reached] - soft[reached]
        assert gap.min() >= -1e-9  # from below
        gaps.append(gap.max())
    assert gaps[0] > gaps[1] > gaps[2] and gaps[2] <= np.log(2) / 100


def test_gradients_match_finite_differences_and_tend_to_the_shortest_path_tree():
    senders, receivers, weights = _digraph(5, n=8, edges=20)

    def distances(w, beta):
        d = _solve(senders, receivers, w, 0, 8, beta=beta).value
        return jnp.where(jnp.isfinite(d), d, 0.0)

    check_grads(distances, (weights, 1.5), order=1, modes=["rev"], atol=1e-6, rtol=1e-6)
    # at large beta, d d_i / d w_e is 1 for the edges on the shortest path to i, 0 elsewhere
    # (beta 2000: random weights leave near ties, here 0.016 apart, whose paths share the flow
    # as exp(-beta * gap))
    exact, predecessors = _exact(senders, receivers, weights, 0, 8)
    jac = np.asarray(jax.jacrev(lambda w: distances(w, 2000.0))(weights))
    edge = {(int(a), int(b)): e for e, (a, b) in enumerate(zip(senders, receivers))}
    for i in np.flatnonzero(np.isfinite(exact)):
        tree = np.zeros(len(weights))
        node = i
        while node != 0:
            tree[edge[int(predecessors[node]), int(node)]] = 1.0
            node = predecessors[node]
        np.testing.assert_allclose(jac[i], tree, atol=1e-3)


def test_a_divergent_walk_sum_is_reported_never_a_plausible_distance():
    """A cycle of weight 0.2 at beta 1: every walk around it adds e^{-0.2} to the sum, which
    diverges (spectral radius of A above 1): not converged, NaN distances; `throw` raises."""
    senders, receivers, weights = np.array([0, 1]), np.array([1, 0]), np.array([0.1, 0.1])
    eq = _solve(senders, receivers, weights, 0, 3, beta=1.0)
    assert not bool(eq.converged) and np.isnan(eq.value[:2]).all() and eq.value[2] == np.inf
    with pytest.raises(eqx.EquinoxRuntimeError):
        _solve(senders, receivers, weights, 0, 3, beta=1.0, throw=True).value.block_until_ready()
    # at beta 30 the same cycle's walks fade: a distance, and the unreachable node's stays inf
    eq = _solve(senders, receivers, weights, 0, 3, beta=30.0)
    assert bool(eq.converged) and abs(float(eq.value[1]) - 0.1) < 1e-3


def test_it_runs_under_jit_and_vmap_over_sources():
    senders, receivers, weights = _digraph(6)
    solve = jax.jit(jax.vmap(lambda s: _solve(senders, receivers, weights, s, 12, beta=2.0).value))
    got = solve(jnp.arange(3))
    for s in range(3):
        np.testing.assert_allclose(
            got[s], _closed_form(senders, receivers, weights, s, 12, 2.0), rtol=1e-9, atol=1e-10
        )


@pytest.mark.bad_input
def test_bad_input_is_a_graph_error_naming_the_argument():
    s, r, w = np.array([0, 1]), np.array([1, 2]), np.array([1.0, 1.0])
    graph = eqattn.Graph(s, r, num_nodes=3)
    for args, kwargs, match in [
        ((graph, np.array([1.0, -1.0]), 0), {}, "`weights` must be finite and >= 0"),
        ((graph, np.array([1.0, np.nan]), 0), {}, "`weights` must be finite and >= 0"),
        ((graph, w, 3), {}, "`source` must be a node in 0 .. 2"),
        ((graph, w[:1], 0), {}, r"one per edge \[2\]"),
        ((eqattn.Graph(s, np.array([1, 5]), num_nodes=3), w, 0), {}, "`receivers` must be nodes"),
        ((eqattn.Graph(s.astype(float), r, num_nodes=3), w, 0), {}, "must be integers"),
        ((graph, w, 0), {"beta": 0.0}, "`beta` .* must be finite and > 0"),
        ((graph, w, 0), {"beta": np.nan}, "`beta` .* must be finite and > 0"),
    ]:
        with unchecked(), pytest.raises(eqattn.GraphError, match=match):
            eqattn.soft_shortest_paths(*args, **{"beta": 1.0, **kwargs})
    with pytest.raises(eqattn.GraphError, match="`num_nodes` must be an int >= 1"):
        eqattn.Graph(s, r, num_nodes=0).check()
