"""Mazes' data against networkx: a drawn maze is a spanning tree of the grid, the target is the
one path between its ends, and the graph's edges and sides are the passages'."""

from __future__ import annotations

import jax
import networkx as nx
import numpy as np
import pytest

from eqattn import mazes


@pytest.mark.parametrize("size", [2, 5, 13])
def test_a_maze_is_a_spanning_tree_of_the_grid_and_its_target_the_path(size):
    rng = np.random.default_rng(size)
    batch = mazes.draw_mazes(rng, 4, size)
    grid = nx.grid_2d_graph(size, size)
    for inputs, targets, passages in zip(batch.inputs, batch.targets, batch.passages):
        tree = nx.Graph([tuple(divmod(int(c), size)) for c in p] for p in passages)
        assert nx.is_tree(tree) and tree.number_of_nodes() == size * size
        assert all(grid.has_edge(a, b) for a, b in tree.edges)  # passages join grid neighbours
        start, goal = np.flatnonzero(inputs)
        path = nx.shortest_path(tree, divmod(int(start), size), divmod(int(goal), size))
        want = np.zeros(size * size, int)
        want[[r * size + c for r, c in path]] = 1
        np.testing.assert_array_equal(targets, want)


def test_the_graph_holds_each_passage_both_ways_with_its_side_and_a_loop_per_cell():
    size = 6
    batch = mazes.draw_mazes(np.random.default_rng(0), 2, size)
    g = batch.graph
    assert g.num_nodes == 36 and g.senders.shape == (2, 2 * 35 + 36)
    sides = {
        (-1, 0): 0,
        (1, 0): 1,
        (0, -1): 2,
        (0, 1): 3,
        (0, 0): 4,
    }  # the sender from the receiver
    for b, passages in enumerate(batch.passages):
        want = {(int(a), int(c)) for a, c in passages} | {(int(c), int(a)) for a, c in passages}
        want |= {(i, i) for i in range(36)}
        got = set(zip(g.senders[b].tolist(), g.receivers[b].tolist()))
        assert got == want and len(got) == g.num_edges
        for s, r, f in zip(g.senders[b], g.receivers[b], g.edge_features[b]):
            (rs, cs), (rr, cr) = divmod(int(s), size), divmod(int(r), size)
            assert f.tolist() == np.eye(5)[sides[(rs - rr, cs - cr)]].tolist()
    assert g.check(edge_features=len(mazes.EDGE_KINDS)) is g


def test_the_same_seed_draws_the_same_mazes():
    a, b = (mazes.draw_mazes(np.random.default_rng(7), 3, 9) for _ in range(2))
    c = mazes.draw_mazes(np.random.default_rng(8), 3, 9)
    for name in ("inputs", "targets", "passages"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.passages, c.passages)


@pytest.mark.bad_input
def test_refusals():
    rng = np.random.default_rng(0)
    for bad in (1, 2.0, True):
        with pytest.raises(ValueError, match="`size` must be an int >= 2"):
            mazes.draw_passages(rng, bad)
    with pytest.raises(ValueError, match="`count` must be an int >= 1"):
        mazes.draw_mazes(rng, 0, 4)
    with pytest.raises(ValueError, match=r"`passages` must be \[\*batch, 15, 2\]"):
        mazes.maze_graph(np.zeros((14, 2), int), 4)
    with pytest.raises(ValueError, match="no path joins cells 0 and 3"):
        mazes.path_between(np.array([[0, 1], [0, 1], [2, 3]]), 2, 0, 3)
    with pytest.raises(TypeError, match="`mazes` must be a mazes.Mazes batch"):
        mazes.loss(mazes.deq(8, 2, key=jax.random.key(0)), (1, 2), jax.random.key(0))  # type: ignore[arg-type]
