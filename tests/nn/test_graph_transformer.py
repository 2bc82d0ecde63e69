"""The generic graph-transformer block (`nn.GraphTransformerStep`) against a float64 numpy
reference of its formula, its fixed point (`nn.ImplicitGraphTransformer`) and its implicit
gradient against finite differences, its explicit twin, and its refusals."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqattn
from eqattn import nn
from eqattn._solve import Picard

# a multi-edge (0 -> 1 twice), a self-loop (2 -> 2), node 4 with no incoming edge, one padding
SENDERS = np.array([0, 0, 1, 2, 3, 2, 1, 0])
RECEIVERS = np.array([1, 1, 2, 2, 0, 3, 0, 5])
N, DIM, HEADS, F = 5, 8, 2, 3


def _graph(rng):
    return eqattn.Graph(
        SENDERS, RECEIVERS, num_nodes=N, edge_features=rng.normal(size=(len(SENDERS), F))
    )


def _layer_norm(a, norm):
    mu, var = a.mean(-1, keepdims=True), a.var(-1, keepdims=True)
    return (a - mu) / np.sqrt(var + norm.eps) * np.asarray(norm.weight) + np.asarray(norm.bias)


def _linear(lin, a):
    w = np.asarray(lin.weight)
    return a @ w.T + (0 if lin.bias is None else np.asarray(lin.bias))


def _reference_step(step, z, x, graph):
    """The module docstring's formula, node by node, in float64 numpy."""
    u = _layer_norm(z + x, step.norms[0])
    q, k, v = (_linear(lin, u) for lin in (step.to_query, step.to_key, step.to_value))
    f = np.asarray(graph.edge_features)
    dh = DIM // HEADS
    att = np.zeros((N, DIM))
    for i in range(N):
        edges = [e for e in range(len(SENDERS)) if RECEIVERS[e] == i]
        if not edges:
            continue  # no incoming edge: the attention adds nothing
        ke = np.stack([k[SENDERS[e]] + _linear(step.edge_to_key, f[e]) for e in edges])
        ve = np.stack([v[SENDERS[e]] + _linear(step.edge_to_value, f[e]) for e in edges])
        for h in range(HEADS):
            cols = slice(h * dh, (h + 1) * dh)
            beta = np.exp(np.asarray(step.log_gamma)[h]) / np.sqrt(dh)
            s = beta * ke[:, cols] @ q[i, cols]
            p = np.exp(s - s.max())
            att[i, cols] = (p / p.sum()) @ ve[:, cols]
    h = _layer_norm(u + _linear(step.to_out, att), step.norms[1])
    w1, w2 = step.mlp.layers
    hidden = np.asarray(jax.nn.gelu(_linear(w1, h)))
    return _layer_norm(h + _linear(w2, hidden), step.norms[2])


def _randomized(module, seed):
    """`module` with every floating-point leaf drawn at random (norms' and temperatures' too)."""
    leaves, tree = jax.tree.flatten(module)
    rng = np.random.default_rng(seed)
    out = [0.5 * rng.normal(size=np.shape(x)) if eqx.is_inexact_array(x) else x for x in leaves]
    return jax.tree.unflatten(tree, out)


def test_the_step_is_its_formula(rng):
    step = _randomized(
        nn.GraphTransformerStep(DIM, HEADS, edge_features=F, key=jax.random.key(0)), 1
    )
    graph = _graph(rng)
    z, x = rng.normal(size=(N, DIM)), rng.normal(size=(N, DIM))
    got = eqx.filter_jit(step)(z, x, graph)
    np.testing.assert_allclose(got, _reference_step(step, z, x, graph), rtol=1e-10, atol=1e-10)
    # without edge features the keys and values are the senders' alone
    plain = nn.GraphTransformerStep(DIM, HEADS, key=jax.random.key(2))
    g = eqattn.Graph(SENDERS, RECEIVERS, num_nodes=N)
    assert plain.edge_features == 0 and plain(z, x, g).shape == (N, DIM)


def _step(key):
    return nn.GraphTransformerStep(DIM, HEADS, edge_features=F, key=key)


def _solved():
    solver = Picard(rtol=1e-12, atol=0.0, max_steps=500)
    return nn.ImplicitGraphTransformer(_step(jax.random.key(3)), solver=solver)


def test_the_layer_solves_to_the_steps_fixed_point_and_differentiates_implicitly(rng):
    layer, graph = _solved(), _graph(rng)
    x = rng.normal(size=(N, DIM))
    z, eq = eqx.filter_jit(layer.forward)(x, graph)
    assert bool(eq.converged)
    np.testing.assert_allclose(layer.step(z, x, graph), z, atol=1e-10)
    np.testing.assert_allclose(layer.iterate(x, graph, int(eq.steps) + 50), z, atol=1e-9)
    c = rng.normal(size=(N, DIM))

    @eqx.filter_jit
    def loss(layer, x):
        return jnp.sum(layer(x, graph) * c)

    gx, gl = jax.grad(loss, argnums=1)(layer, x), eqx.filter_grad(loss)(layer, x)
    for _ in range(3):  # the input's gradient by central differences, a random direction
        d = rng.normal(size=x.shape)
        fd = (loss(layer, x + 1e-6 * d) - loss(layer, x - 1e-6 * d)) / 2e-6
        np.testing.assert_allclose(np.sum(gx * d), fd, rtol=1e-5)
    # a parameter's: the first head's temperature
    gamma = lambda t: eqx.tree_at(lambda m: m.step.log_gamma, layer, layer.step.log_gamma + t)  # noqa: E731
    t = jnp.array([1e-6, 0.0])
    fd = (loss(gamma(t), x) - loss(gamma(-t), x)) / 2e-6
    np.testing.assert_allclose(gl.step.log_gamma[0], fd, rtol=1e-5)


def test_training_from_a_partial_solve_differentiates_only_the_last_steps(rng):
    """`iterate` from `z0`, with a traced count: 3 steps then 4 are 7 from zeros; the recipe of
    training from a random, partly solved start (Anil et al. 2022), a traced number of steps
    under `stop_gradient` and then 4 with gradient, differentiates as the 4 steps alone from
    that start held fixed (central differences)."""
    layer, graph = _solved(), _graph(rng)
    x, c = rng.normal(size=(N, DIM)), rng.normal(size=(N, DIM))
    three = layer.iterate(x, graph, 3)
    np.testing.assert_allclose(layer.iterate(x, graph, 4, z0=three), layer.iterate(x, graph, 7))

    @eqx.filter_jit
    def loss(layer, x, warm):
        params, static = eqx.partition(layer, eqx.is_array)
        frozen = eqx.combine(jax.lax.stop_gradient(params), static)
        start = frozen.iterate(jax.lax.stop_gradient(x), graph, warm)  # traced: forward only
        return jnp.sum(layer.iterate(x, graph, 4, z0=start) * c)

    warm = jnp.asarray(3)
    gx = jax.grad(loss, argnums=1)(layer, x, warm)
    d = rng.normal(size=x.shape)
    held = lambda x: jnp.sum(layer.iterate(x, graph, 4, z0=three) * c)  # noqa: E731
    fd = (held(x + 1e-6 * d) - held(x - 1e-6 * d)) / 2e-6
    np.testing.assert_allclose(np.sum(gx * d), fd, rtol=1e-6)
    np.testing.assert_allclose(loss(layer, x, warm), held(x))


@pytest.mark.float32
def test_batches_under_vmap_and_a_short_budget_is_reported(rng):
    layer = nn.ImplicitGraphTransformer(_step(jax.random.key(4)))
    graphs = jax.tree.map(lambda *a: jnp.stack(a), _graph(rng), _graph(rng))
    x = jnp.asarray(rng.normal(size=(2, N, DIM)), jnp.float32)
    solve = eqx.filter_jit(
        lambda x, g, b: jax.vmap(lambda x, g: layer.forward(x, g, budget=b))(x, g)
    )
    z, eq = solve(x, graphs, None)
    assert z.dtype == jnp.float32 and eq.converged.all()
    _, short = solve(x, graphs, jnp.asarray(1))
    assert not short.converged.any()  # never a plausible answer from a solve cut short
    stack = nn.ExplicitGraphTransformer(map(_step, jax.random.split(jax.random.key(5), 3)))
    assert jax.vmap(stack)(x, graphs).shape == (2, N, DIM)


def test_the_explicit_twin_applies_its_steps_in_turn(rng):
    """The untied steps run as a scan over their stacked parameters (steps of one shape), or
    one by one (MLPs of different widths): both are the steps applied in turn from zeros; the
    scan's gradient is theirs."""
    graph, x = _graph(rng), jnp.asarray(rng.normal(size=(N, DIM)))
    keys = jax.random.split(jax.random.key(6), 3)
    same = [_step(k) for k in keys]
    mixed = [*same[:2], nn.GraphTransformerStep(DIM, HEADS, edge_features=F, key=keys[2], hidden=5)]

    def in_turn(steps):
        z = jnp.zeros_like(x)
        for step in steps:
            z = step(z, x, graph)
        return jnp.sum(jnp.sin(z))

    def stacked(steps):
        return jnp.sum(jnp.sin(nn.ExplicitGraphTransformer(steps)(x, graph)))

    both = lambda f: eqx.filter_jit(eqx.filter_value_and_grad(f))  # noqa: E731
    (value, grads), (want, want_grads) = both(stacked)(same), both(in_turn)(same)
    np.testing.assert_allclose(value, want, rtol=1e-12)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(stacked(mixed), in_turn(mixed), rtol=1e-12)


@pytest.mark.bad_input
def test_refusals(rng):
    with pytest.raises(ValueError, match="`num_heads` \\(3\\) must divide `dim` \\(8\\)"):
        nn.GraphTransformerStep(8, 3, key=jax.random.key(0))
    with pytest.raises(TypeError, match="`steps` must be one or more GraphTransformerSteps"):
        nn.ExplicitGraphTransformer([])
    with pytest.raises(ValueError, match="`steps` must share one width"):
        nn.ExplicitGraphTransformer(
            [_step(jax.random.key(0)), nn.GraphTransformerStep(8, 4, key=jax.random.key(1))]
        )
    with pytest.raises(TypeError, match="`step` must be a GraphTransformerStep; got int"):
        nn.ImplicitGraphTransformer(3)
    layer = nn.ImplicitGraphTransformer(_step(jax.random.key(0)))
    graph = _graph(rng)
    with pytest.raises(eqattn.GraphError, match=r"`x` must be \[5, 8\] .*got \[5, 4\]"):
        layer(np.zeros((N, 4)), graph)
    for steps in (2.5, -1, jnp.ones(2, int), jnp.asarray(1.0)):
        with pytest.raises(ValueError, match="`steps` must be an int >= 0 or a traced integer"):
            layer.iterate(np.zeros((N, DIM)), graph, steps)
    with pytest.raises(eqattn.GraphError, match=r"`z0` must be \[5, 8\]; got \[5, 3\]"):
        layer.iterate(np.zeros((N, DIM)), graph, 2, z0=np.zeros((N, 3)))
    with pytest.raises(eqattn.GraphError, match="edge_features"):
        layer(np.zeros((N, DIM)), eqattn.Graph(SENDERS, RECEIVERS, num_nodes=N))
