"""Exact on every input, or reported: the graph models over weight distributions that tie, span
twelve orders of magnitude, have heavy tails, near ties and zeros, on the task's families and
networkx's generators; the spanning tree under the tie rule against Kruskal written here,
shortest paths against scipy's Dijkstra (float64). Every prediction of the suite is also checked
to form a forest rooted at the source (`tests/conftest.py`)."""

import jax
import numpy as np
import pytest

from benchmarks import _generators
from benchmarks._generators import DISTRIBUTIONS, reweighted, sample
from benchmarks._graph_parts import exact
from eqattn import graphs

pytestmark = pytest.mark.float32

EXACT = [name for name in DISTRIBUTIONS if name != "uniform"]
"""The distributions tried (uniform weights are every other test's)."""


def kruskal(g: graphs.WeightedGraphs, b: int) -> np.ndarray:
    """Graph `b`'s spanning tree under the tie rule (edges by weight, smaller end, larger end;
    union-find), rooted at the source by a walk: each node's parent (the source and the nodes
    of other components: themselves)."""
    s, r = np.asarray(g.graph.senders[b]), np.asarray(g.graph.receivers[b])
    n, w = g.graph.num_nodes, g.weights[b].astype(np.float64)
    edges = sorted({(w[e], min(s[e], r[e]), max(s[e], r[e])) for e in np.flatnonzero(r < n)})
    root = list(range(n))

    def find(u):
        while root[u] != u:
            root[u] = root[root[u]]
            u = root[u]
        return u

    tree = [[] for _ in range(n)]
    for _, u, v in edges:
        a, c = find(u), find(v)
        if a != c:
            root[a] = c
            tree[u].append(v)
            tree[v].append(u)
    parent, stack = np.arange(n), [int(g.source[b])]
    seen = {stack[0]}
    while stack:
        u = stack.pop()
        for v in tree[u]:
            if v not in seen:
                seen.add(v)
                parent[v] = u
                stack.append(v)
    return parent


def exact_paths() -> graphs.GraphDEQ:
    """The shortest-path DEQ at its exact parameters (its shift adds the weight, its scores
    read minus it): Bellman-Ford with each node's temperature relative to its distance."""
    return exact(graphs.GraphDEQ(2, "shortest-paths", key=jax.random.key(0)))


@pytest.fixture(scope="module")
def models():
    """The spanning-tree DEQ untrained (its records name the tree whatever its fitted map) and
    the shortest-path DEQ at its exact parameters, in float32 (a module fixture runs outside
    the tests' float32 marker)."""
    with jax.enable_x64(False):
        return {
            "mst": graphs.GraphDEQ(4, "mst", key=jax.random.key(0)),
            "shortest-paths": exact_paths(),
        }


def _families():
    return [*graphs.WEIGHTED_FAMILIES, *(_generators.MORE if _generators.available() else ())]


@pytest.mark.parametrize("distribution", EXACT)
def test_the_spanning_tree_is_kruskals_under_the_tie_rule_on_every_input(models, distribution):
    """Every family at 64 nodes, two graphs each: every parent is Kruskal's (ties broken by the
    tie rule), every solve converges, and no node is left unresolved."""
    for family in _families():
        g = reweighted(sample(family, 64, 2, seed=3), distribution, seed=1)
        out = graphs.predict(models["mst"], g.graph, g.source)
        assert out.converged.all(), (family, distribution)
        for b in range(2):
            np.testing.assert_array_equal(out.parent[b], kruskal(g, b), err_msg=family)
        assert graphs.score_parents(g, out.parent, "mst").all()


@pytest.mark.parametrize("distribution", EXACT)
def test_every_shortest_path_parent_is_on_a_shortest_path(models, distribution):
    """Every family at 64 nodes: every parent on a shortest path (relative 1e-6, Dijkstra in
    float64), every solve converged, nothing unresolved."""
    for family in _families():
        g = reweighted(sample(family, 64, 2, seed=4), distribution, seed=2)
        out = graphs.predict(models["shortest-paths"], g.graph, g.source)
        assert out.converged.all(), (family, distribution)
        right = graphs.score_parents(g, out.parent, "shortest-paths")
        assert right.all(), (family, distribution, np.argwhere(~right)[:5])


@pytest.mark.parametrize(
    ("family", "n", "distribution"),
    [
        ("path", 1024, "1 or 2"),
        ("cycle", 1024, "equal"),
        ("delaunay", 1024, "near ties"),
        ("grid", 4096, "lognormal 3"),
    ],
)
def test_exact_on_large_graphs(models, family, n, distribution):
    """The hardest combinations on large graphs: a 1023-edge path with tied weights and a
    cycle of equal ones (the most records a list must hold), near ties on 1024 nodes and heavy
    tails on 4096. (The graphs benchmark's table by weight distribution covers every family
    and distribution to 4096 nodes.)"""
    g = reweighted(sample(family, n, 1, seed=5), distribution, seed=3)
    for name in ("mst", "shortest-paths"):
        out = graphs.predict(models[name], g.graph, g.source)
        assert out.converged.all() and graphs.score_parents(g, out.parent, name).all(), name


def test_lists_longer_than_the_model_carries_are_solved_again_with_more(models):
    """A path whose weights fall away from the source holds every edge as a record: 199 of
    them, more than the 32 the model carries. The lists cut short tie; the prediction solves
    again with twice the records until none is cut (a graded mesh's paths are such), and every
    parent is Kruskal's. With `refine=False` the cut lists stay unresolved (-1), none wrong."""
    n = 200
    pairs = [(i, i + 1) for i in range(n - 1)]
    g = graphs.from_edges(n, [pairs], [0], weights=[np.linspace(2.0, 1.0, n - 1)])
    model = models["mst"]
    assert model.layer.step.records == 32 and model.refined().layer.step.records == 64
    out = graphs.predict(model, g.graph, g.source)
    assert out.converged.all()
    np.testing.assert_array_equal(out.parent[0], kruskal(g, 0))
    kept = graphs.predict(model, g.graph, g.source, refine=False)
    answered = kept.parent[0] >= 0
    assert kept.converged.all() and 0 < (~answered).sum() < n
    np.testing.assert_array_equal(kept.parent[0][answered], kruskal(g, 0)[answered])


def test_barabasi_albert_with_weights_1_or_2_converges():
    """Barabási-Albert graphs (500 nodes, m = 3) with weights in {1, 2}: a spanning-tree solve
    that never converged when ties were broken by nothing."""
    pytest.importorskip("networkx")
    g = reweighted(sample("Barabasi-Albert m=3", 500, 2, seed=0), "1 or 2", seed=0)
    out = graphs.predict(graphs.GraphDEQ(4, "mst", key=jax.random.key(0)), g.graph, g.source)
    assert out.converged.all() and graphs.score_parents(g, out.parent, "mst").all()


def test_a_solve_it_cannot_finish_is_reported_never_a_silent_parent(models):
    """A budget below the graph's depth: the solve says it did not converge, and the nodes its
    front had not reached get no answer (-1), not the answer of an unreachable node."""
    g = graphs.sample_weighted("path", 64, 1, seed=0)
    depth = graphs.hops(g).max()
    out = graphs.predict(models["mst"], g.graph, g.source, budget=int(depth) // 2)
    assert not out.converged.any()
    right = graphs.score_parents(g, out.parent, "mst")
    assert (out.parent[~right] == -1).all() and right.any()  # unreached: no answer, not itself
