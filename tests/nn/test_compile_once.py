"""A user's training step traces once: every parameter leaf has a concrete dtype, so neither the
first optimizer update (which makes a weakly typed leaf strong in the model) nor the second (in
Adam's state) changes what `eqx.filter_jit` sees; and a model called outside `jit` is one
program."""

import logging

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import pytest

import eqattn.nn as enn

DIM, HEADS, TOKENS = 8, 2, 5


def _models(key):
    k = iter(jax.random.split(key, 16))
    return {
        "MultiHeadAttention": enn.MultiHeadAttention(HEADS, DIM, key=next(k)),
        "causal MultiHeadAttention": enn.MultiHeadAttention(HEADS, DIM, key=next(k), causal=True),
        "ImplicitAttention": enn.ImplicitAttention(DIM, HEADS, key=next(k)),
        "DEQBlock": enn.DEQBlock(DIM, HEADS, key=next(k)),
        "EnergyAttention": enn.EnergyAttention(DIM, HEADS, key=next(k), num_memories=4),
        "Hopfield": enn.Hopfield(DIM, DIM, HEADS, key=next(k)),
        "HopfieldPooling": enn.HopfieldPooling(DIM, HEADS, key=next(k), num_queries=2),
        "HopfieldLayer": enn.HopfieldLayer(DIM, 4, HEADS, key=next(k)),
        "TransformerBlock": enn.TransformerBlock(DIM, HEADS, key=next(k)),
        # the README's training example's model
        "DEQTransformer": enn.DEQTransformer(2, DIM, HEADS, key=next(k), in_features=3, max_len=8),
        "Transformer": enn.Transformer(2, DIM, HEADS, 2, key=next(k), in_features=3, max_len=8),
    }


def _apply(name, model, x):
    if name.endswith("MultiHeadAttention"):
        return model(x, x)
    if name == "Hopfield":
        return model(x, x)
    if name.endswith("Transformer"):
        return model(x[:, :3])
    return model(x)


@pytest.mark.float32
@pytest.mark.parametrize("name", list(_models(jax.random.key(0))))
def test_training_step_traces_once(name):
    model = _models(jax.random.key(0))[name]
    x = jax.random.normal(jax.random.key(1), (TOKENS, DIM))
    for leaf in jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array)):
        assert not leaf.weak_type, (name, leaf.shape)
    opt = optax.adam(1e-2)
    state = opt.init(eqx.filter(model, eqx.is_inexact_array))
    traces = []

    def loss(m):  # against a random target (a normalised output's mean square is constant)
        out = _apply(name, m, x)
        return jnp.mean((out - jax.random.normal(jax.random.key(2), out.shape)) ** 2)

    @eqx.filter_jit
    def step(model, state):
        traces.append(1)
        value, grads = eqx.filter_value_and_grad(loss)(model)
        updates, state = opt.update(grads, state, eqx.filter(model, eqx.is_inexact_array))
        return eqx.apply_updates(model, updates), state, value

    values = []
    for _ in range(3):
        model, state, value = step(model, state)
        values.append(float(value))
    assert len(traces) == 1, (name, len(traces))
    assert values[-1] != values[0]  # the parameters moved


@pytest.mark.float32
@pytest.mark.parametrize("name", ["ImplicitAttention", "Hopfield", "DEQTransformer"])
def test_jax_grad_over_a_layer(name):
    """`jax.grad` over a model (the solver's tolerances are float leaves; Equinox's `inference`
    flags are bools, hence `allow_int`) gives `eqx.filter_grad`'s parameter gradients, and none
    to the settings."""
    model = _models(jax.random.key(0))[name]
    x = jax.random.normal(jax.random.key(1), (TOKENS, DIM))
    loss = lambda m: jnp.mean(_apply(name, m, x) ** 2)  # noqa: E731
    plain = jax.jit(jax.grad(loss, allow_int=True))(model)
    filtered = eqx.filter_jit(eqx.filter_grad(loss))(model)

    def compare(f, g):
        if f is None:  # a setting (tolerance, flag): no gradient
            assert g is None or g.dtype == jax.dtypes.float0 or not jnp.any(g), (name, g)
        else:
            assert jnp.allclose(f, g, rtol=1e-5, atol=1e-7), name
            assert jnp.any(f != 0), name

    jax.tree.map(compare, filtered, plain, is_leaf=lambda a: a is None)


def _compiles(caplog, call) -> int:
    """The programs JAX compiles while `call()` runs."""
    caplog.clear()
    with jax.log_compiles(True), caplog.at_level(logging.WARNING):
        jax.block_until_ready(call())
    return sum(r.getMessage().startswith("Compiling") for r in caplog.records)


@pytest.mark.float32
@pytest.mark.parametrize("name", ["ImplicitAttention", "HopfieldPooling", "DEQTransformer"])
def test_a_call_outside_jit_is_one_program(name, caplog):
    """Called outside `jax.jit`, a model (and a transformer's `predict`) runs as one compiled
    program, which the next call of the same shapes reuses (operation by operation, a DEQ's
    first call compiled about a hundred small programs)."""
    model = _models(jax.random.key(0))[name]
    x = jax.random.normal(jax.random.key(1), (TOKENS, DIM))
    calls = [lambda: _apply(name, model, x)]
    if name == "DEQTransformer":
        calls.append(lambda: model.predict(x[:, :3]).logits)
    for call in calls:
        assert _compiles(caplog, call) <= 2, name
        assert _compiles(caplog, call) == 0, name
