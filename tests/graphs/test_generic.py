"""The generic graph models (`graphs.GenericGraphModel`): what they answer reads their scores as
the module says (reachability, forests), the twin has the DEQ's parameters, the loss's gradient
matches finite differences, and a DEQ trained a few dozen steps on BFS learns it."""

import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from eqattn import graphs, train


def _size(model) -> int:
    return sum(x.size for x in jax.tree.leaves(eqx.filter(model, eqx.is_array)))


@pytest.mark.parametrize("algorithm", ["bfs", "shortest-paths"])
def test_reached_and_best_follow_the_head_and_parents_form_a_forest(algorithm):
    """A node counts as reached where an incoming edge's score beats its own (the source
    always); its best edges are those of its top score; `graphs.predict`'s parents are a
    forest whose every named parent is a best candidate (numpy, from the head's raw scores)."""
    model = graphs.GenericGraphModel.deq(8, 2, algorithm, key=jax.random.key(3))
    g = graphs.sample_weighted("delaunay", 12, 3, seed=1)
    inputs, _ = graphs.examples(g, model.algorithm)
    p = jax.vmap(lambda x: model.predict(x, budget=40))(inputs)
    s = jax.tree.map(np.asarray, p.logits)
    senders, receivers = np.asarray(g.graph.senders), np.asarray(g.graph.receivers)
    real = receivers < 12  # padding edges: receiver n
    for b in range(3):
        r, e = receivers[b][real[b]], s.edges[b][real[b]]
        top = np.full(12, -np.inf)
        np.maximum.at(top, r, e)
        source = np.arange(12) == g.source[b]
        np.testing.assert_array_equal(s.reached[b], source | (top > s.own[b]))
        assert np.isneginf(e[source[r]]).all() and np.isfinite(e[~source[r]]).all()
    out = graphs.predict(model, g.graph, g.source, budget=40)
    assert graphs.is_forest(out.parent, g.source, out.reachable)
    for b, v in zip(*np.nonzero(out.parent >= 0)):
        if out.parent[b, v] != v:
            e = (receivers[b] == v) & (senders[b] == out.parent[b, v])
            assert s.edges[b][e].max() == s.edges[b][receivers[b] == v].max() > s.own[b, v]


def test_tied_best_candidates_are_unresolved_not_broken_by_the_tie_rule():
    """A model whose scores all tie (its head's weights zeroed, its own score below the edges')
    names no parent where a node has two candidates or more: the graph task's tie rule, the
    breadth-first order of tied edges, would be BFS itself."""
    model = graphs.GenericGraphModel.deq(8, 2, "bfs", key=jax.random.key(0))
    last = lambda m: m.head.edge.layers[-1]  # noqa: E731
    model = eqx.tree_at(lambda m: last(m).weight, model, jnp.zeros_like(last(model).weight))
    model = eqx.tree_at(lambda m: m.head.own.weight, model, jnp.zeros_like(model.head.own.weight))
    model = eqx.tree_at(lambda m: m.head.own.bias, model, last(model).bias - 1.0)
    g = graphs.sample_weighted("cycle", 10, 2, seed=0)  # every node has two neighbours
    out = graphs.predict(model, g.graph, g.source)
    source = np.arange(10) == g.source[:, None]
    assert out.reachable.all() and (out.parent[source] == g.source).all()
    assert (out.parent[~source] == -1).all()
    # the training statistic reads ties alike, whatever order would break them: a node counts
    # only if every candidate of the highest score is a valid parent (here every neighbour;
    # the source's only candidate is itself), counted in numpy from the hops
    inputs, targets = graphs.examples(g, model.algorithm)
    key = jax.random.key(0)
    _, (right, *_) = graphs.generic_loss(model, inputs, targets, key, steps=1, warm=0)
    hops, want = graphs.hops(g), []
    for b in range(2):
        snd, rcv = np.asarray(g.graph.senders[b]), np.asarray(g.graph.receivers[b])
        real = rcv < 10
        valid = hops[b][snd[real]] == hops[b][rcv[real]] - 1
        want += [v == g.source[b] or valid[rcv[real] == v].all() for v in range(10)]
    assert float(right) == pytest.approx(np.mean(want)) and 0 < np.mean(want) < 0.5


def test_the_twin_has_the_deqs_parameters_and_the_controls_refuse_what_they_cannot():
    deq = graphs.GenericGraphModel.deq(16, 4, "mst", key=jax.random.key(0))
    twin = graphs.GenericGraphModel.matched(deq, depth=16, key=jax.random.key(1))
    assert len(twin.core.steps) == 16 and abs(_size(twin) / _size(deq) - 1) <= 0.05
    assert twin.algorithm == deq.algorithm and not twin.is_deq
    g = graphs.sample_weighted("grid", 9, 1, seed=0)
    inputs, _ = graphs.examples(g, deq.algorithm)
    with pytest.raises(TypeError, match="explicit"):
        graphs.GenericGraphModel.matched(twin, depth=4, key=jax.random.key(1))
    with pytest.raises(TypeError, match="explicit"):
        twin.unrolled(jax.tree.map(lambda a: a[0], inputs), 3)
    with pytest.raises(ValueError, match="`depth` must be an int >= 1"):
        graphs.GenericGraphModel.explicit(8, 2, "bfs", depth=0, key=jax.random.key(0))


def test_the_loss_gradient_matches_finite_differences():
    """float64: the DEQ's loss (steps with gradient from a random start; no partial solve,
    whose parameters the gradient holds fixed by design) along a random direction of its
    parameters, against a central difference."""
    model = graphs.GenericGraphModel.deq(4, 2, "shortest-paths", key=jax.random.key(0))
    g = graphs.sample_weighted("path", 6, 2, seed=0)
    inputs, targets = graphs.examples(g, model.algorithm)
    key = jax.random.key(5)
    params, static = eqx.partition(model, eqx.is_array)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(9), len(leaves))
    direction = jax.tree.unflatten(
        tree, [jax.random.normal(k, a.shape, a.dtype) for k, a in zip(keys, leaves)]
    )

    @jax.jit
    def loss(p):
        m = eqx.combine(p, static)
        return graphs.generic_loss(m, inputs, targets, key, steps=3, warm=0)[0]

    grad = jax.jit(jax.grad(loss))(params)
    analytic = sum(
        jnp.vdot(a, b) for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(direction))
    )
    h = 1e-5
    shifted = lambda t: jax.tree.map(lambda p, d: p + t * d, params, direction)  # noqa: E731
    numeric = (loss(shifted(h)) - loss(shifted(-h))) / (2 * h)
    assert loss(params).dtype == jnp.float64
    np.testing.assert_allclose(analytic, numeric, rtol=1e-5)


@pytest.mark.float32
def test_a_deq_trained_on_small_graphs_learns_bfs():
    """40 steps on graphs of 8-16 nodes (the task's data, float32 as users train): most
    parents right on fresh graphs of 16 nodes where the untrained model gets few, every answer
    a forest."""
    model = graphs.GenericGraphModel.deq(16, 2, "bfs", key=jax.random.key(0))
    task = graphs.GraphTask(graphs.GraphConfig(batch_size=16, epoch_steps=40))
    g = graphs.sample_weighted("tree", 16, 8, seed=11)

    def right(m):
        out = graphs.predict(m, g.graph, g.source)
        assert graphs.is_forest(out.parent, g.source, out.reachable)
        return graphs.score_parents(g, out.parent, m.algorithm).mean()

    before = right(model)
    optimizer = optax.adam(3e-3)
    state = optimizer.init(eqx.filter(model, eqx.is_array))
    loss = lambda m, b, k: graphs.generic_loss(m, *b, k, steps=16, warm=16)  # noqa: E731
    update = train.reasoning_step(optimizer, loss)
    key = jax.random.key(0)
    for batch, _ in task.batches(np.random.default_rng(0), None):
        key, sub = jax.random.split(key)
        model, state, _, _ = update(model, state, batch, sub)
    after = right(model)
    assert before < 0.3 and after > 0.8, (before, after)


@pytest.mark.float32
def test_the_command_trains_each_generic_model(tmp_path, capsys):
    """`eqattn train --task generic-graphs` (a tiny run of each model): the runs' shapes, the
    twin within 5% of the DEQ's parameters and as deep as `--depth`; its checkpoint rebuilds
    the twin."""
    from eqattn.cli import main

    args = ["--task", "generic-graphs", "--algorithm", "shortest-paths", "--dim", "8"]
    args += ["--heads", "2", "--depth", "4", "--epochs", "1", "--epoch-steps", "3", "--no-progress"]
    for model in ("deq", "explicit"):
        assert main(["train", *args, "--model", model, "--out", str(tmp_path / model)]) == 0
        assert f"{model}: test accuracy" in capsys.readouterr().out
    runs = {k: json.loads((tmp_path / k / "metrics.json").read_text()) for k in ("deq", "explicit")}
    assert runs["deq"]["model_shape"] == {"dim": 8, "heads": 2}
    assert runs["explicit"]["model_shape"]["depth"] == 4
    assert abs(runs["explicit"]["params"] / runs["deq"]["params"] - 1) <= 0.05
    twin = train.load_model(tmp_path / "explicit", graphs.GenericGraphTask).model
    assert len(twin.core.steps) == 4 and twin.algorithm.name == "shortest-paths"
    # `graphs.load_model` reads either graph task's runs, by the task its header names
    deq = graphs.load_model(tmp_path / "deq", max_steps=77)
    assert isinstance(deq, graphs.GenericGraphModel) and deq.is_deq
    assert deq.core.solver.max_steps == 77
    assert eqx.tree_equal(graphs.load_model(tmp_path / "explicit"), twin)
