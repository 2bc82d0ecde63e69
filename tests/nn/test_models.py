"""The other layers and the models: Hopfield roles, energy descent, the explicit baseline,
multi-head attention against Equinox's, bad input, one convention for outputs and the initial
weights a seed gives."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqattn
import eqattn.nn as enn

from ..checks import unchecked
from .layers import F64, layers


def test_hopfield_retrieves_stored_patterns(getkey):
    d, m = 64, 20
    stored = jax.random.normal(getkey(), (m, d))
    layer = enn.Hopfield(
        d,
        d,
        1,
        key=getkey(),
        beta=1.0,
        injection=0.01,
        normalize_state=False,
        normalize_stored=False,
        normalize_projected=False,
        output_projection=False,
    )
    eye = jnp.eye(d)
    layer = eqx.tree_at(
        lambda m: (
            m.attention.query_proj.weight,
            m.attention.key_proj.weight,
            m.attention.value_proj.weight,
        ),
        layer,
        (eye, eye, eye),
    )
    idx = jnp.array([3, 7, 11])
    noise = jax.random.normal(getkey(), (3, d))
    noise = (
        0.2
        * noise
        / jnp.linalg.norm(noise, axis=-1, keepdims=True)
        * jnp.linalg.norm(stored[idx], axis=-1, keepdims=True)
    )
    out, eq = layer.forward(stored[idx] + noise, stored)
    assert eq.converged
    np.testing.assert_allclose(out, stored[idx], rtol=1e-4, atol=1e-4)
    assoc = layer.association(stored[idx] + noise, stored)
    assert assoc.shape == (1, 3, m)
    np.testing.assert_allclose(assoc.sum(-1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(jnp.argmax(assoc[0], -1), idx)
    # energy at equilibrium is below the energy at the (noisy) start
    xi0 = jnp.stack([stored[idx] + noise])
    assert layer.energy(stored[idx] + noise, stored) < layer.energy(
        stored[idx] + noise, stored, xi0
    )


def test_hopfield_pooling_and_lookup(getkey):
    pool = enn.HopfieldPooling(8, 2, key=getkey(), num_queries=3)
    stored = jax.random.normal(getkey(), (10, 8))
    pad = jnp.arange(10) < 6
    pooled = eqx.filter_jit(lambda p, s: p(s, padding_mask=pad))
    out = pooled(pool, stored)
    assert out.shape == (3, 8)
    # padded patterns are ignored
    np.testing.assert_allclose(out, pooled(pool, stored.at[6:].set(100.0)), rtol=1e-5, atol=1e-6)
    lookup = enn.HopfieldLayer(8, 16, 2, key=getkey())
    assert lookup(jax.random.normal(getkey(), (4, 8))).shape == (4, 8)
    g = eqx.filter_jit(eqx.filter_grad(lambda p: jnp.sum(pooled(p, stored) ** 2)))(pool)
    assert np.all(np.isfinite(g.queries)) and np.any(g.queries != 0)


def test_energy_descent_never_increases(getkey):
    layer = enn.EnergyAttention(16, 2, key=getkey(), num_memories=8, dtype=F64)
    x = jax.random.normal(getkey(), (6, 16), F64)
    mask = jnp.tril(jnp.ones((6, 6), bool))
    energy = eqx.filter_jit(layer.energy)
    z, energies = x, [energy(x, x, mask)]
    step = jax.jit(lambda z: layer.step(z, x, mask))
    for _ in range(60):
        z = step(z)
        energies.append(energy(z, x, mask))
    diffs = np.diff(np.asarray(energies))
    assert np.all(diffs <= 1e-12 * np.abs(energies[0])), diffs.max()
    eq = eqx.filter_jit(layer.equilibrium)(x, mask=mask)
    assert eq.converged
    np.testing.assert_allclose(
        eqx.filter_jit(lambda m, z: jax.grad(m.energy)(z, x, mask))(layer, eq.value), 0.0, atol=1e-3
    )


@pytest.mark.bad_input
def test_bad_shapes_and_options(getkey):
    with pytest.raises(ValueError, match="`num_heads` must divide `dim`"):
        enn.ImplicitAttention(10, 3, key=getkey())
    layer = enn.ImplicitAttention(8, 2, key=getkey())
    with pytest.raises(ValueError, match=r"`x` must have shape \[tokens, 8\]"):
        layer(jnp.ones((4, 6)))
    with pytest.raises(ValueError, match=r"`x` must have shape \[tokens, 8\].*use jax.vmap"):
        layer(jnp.ones((2, 4, 8)))
    with pytest.raises(ValueError, match=r"`mask` must be boolean and broadcast to \[4, 4\]"):
        layer(jnp.ones((4, 8)), mask=jnp.ones((3, 4), bool))
    with pytest.raises(ValueError, match="`norm`"):
        enn.DEQBlock(8, 2, key=getkey(), norm="batch")
    with pytest.raises(ValueError, match="exactly one of"):
        enn.DEQTransformer(2, 8, 2, key=getkey(), vocab_size=5, in_features=3)
    with pytest.raises(ValueError, match="`stem_depth` must be an int >= 0"):
        enn.DEQTransformer(2, 8, 2, key=getkey(), vocab_size=5, stem_depth=-1)
    with pytest.raises(ValueError, match="at most 4"):
        enn.DEQTransformer(2, 8, 2, key=getkey(), vocab_size=5, max_len=4)(jnp.zeros(6, int))
    hop = enn.Hopfield(8, 6, 2, key=getkey())
    with pytest.raises(ValueError, match=r"`stored` must have shape \[tokens, 6\]"):
        hop(jnp.ones((3, 8)), jnp.ones((5, 8)))
    with pytest.raises(ValueError, match="`padding_mask`"):
        hop(jnp.ones((3, 8)), jnp.ones((5, 6)), padding_mask=jnp.ones(4, bool))


def test_explicit_transformer_baseline(getkey):
    x = jax.random.normal(getkey(), (7, 6))
    model = enn.Transformer(3, 16, 2, 3, key=getkey(), in_features=6, max_len=8, pooling="cls")
    assert len(model.blocks) == 3 and eqx.filter_jit(model)(x).shape == (3,)
    # a block is DEQBlock's map without the injection: same weights, zero injection
    deq = enn.DEQBlock(16, 2, key=getkey())
    block = eqx.tree_at(
        lambda b: (b.attention, b.mlp_in, b.mlp_out),
        model.blocks[0],
        (deq.attention, deq.mlp_in, deq.mlp_out),
    )
    z = jax.random.normal(getkey(), (7, 16))
    np.testing.assert_allclose(
        eqx.filter_jit(block)(z),
        eqx.filter_jit(deq.step)(z, jnp.zeros_like(z)),
        rtol=1e-6,
        atol=1e-6,
    )
    tokens = enn.Transformer(5, 8, 2, 1, key=getkey(), vocab_size=11, pooling="none")
    assert eqx.filter_jit(tokens)(jnp.arange(4)).shape == (4, 5)
    grads = eqx.filter_jit(eqx.filter_grad(lambda m: jnp.sum(m(x) ** 2)))(model)
    assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
    with unchecked(), pytest.raises(ValueError, match="`depth` must be >= 1"):
        enn.Transformer(3, 16, 2, 0, key=getkey(), in_features=6)
    # a DEQ cell of depth 3: the first block's map (with the injection), then two explicit
    # blocks; its leaves are a depth-1 block's, then the cell's
    cell = enn.DEQBlock(16, 2, key=getkey(), depth=3, dropout=0.1)
    first = eqx.tree_at(lambda b: b.cell, cell, ())
    inj = jax.random.normal(getkey(), (7, 16))
    expected = cell.cell[1](cell.cell[0](first.step(z, inj), inference=True), inference=True)
    np.testing.assert_allclose(cell.step(z, inj), expected, rtol=1e-6, atol=1e-6)
    assert cell.depth == 3 and first.depth == 1
    leaves, first_leaves = jax.tree.leaves(cell), jax.tree.leaves(first)
    assert len(leaves) > len(first_leaves)
    assert all(a is b for a, b in zip(leaves, first_leaves))
    for bad in (0, 1.5, True):
        with unchecked(), pytest.raises(ValueError, match="`depth`"):
            enn.DEQBlock(16, 2, key=getkey(), depth=bad)
    with unchecked(), pytest.raises(ValueError, match="one KeyValues per block of the cell"):
        cell.equilibrium(z, prefix=cell.key_values(z))
    with unchecked(), pytest.raises(ValueError, match=r"`x` must have shape \[n, 6\]"):
        model(jnp.ones((7, 5)))


def _numpy_block_step(block, z, c, attend):
    """One post-norm step of `block` in float64 numpy from its weights:
    u = RN(z + MHA(a) + c), z' = RN(u + MLP(u)), with a = z + c (`attend`) or z."""
    w = lambda lin: np.asarray(lin.weight, np.float64)  # noqa: E731
    rn = lambda u: (u - u.mean(-1, keepdims=True)) / np.sqrt(u.var(-1, keepdims=True) + 1e-5)  # noqa: E731
    att = block.attention
    x = z + c if attend else z
    q, k, v = (
        np.split(x @ w(p).T, att.num_heads, -1)
        for p in (att.query_proj, att.key_proj, att.value_proj)
    )
    heads = []
    for h, beta in enumerate(np.exp(np.asarray(att.log_beta, np.float64))):
        s = beta * q[h] @ k[h].T
        p = np.exp(s - s.max(-1, keepdims=True))
        heads.append(p / p.sum(-1, keepdims=True) @ v[h])
    u = rn(z + np.concatenate(heads, -1) @ w(att.output_proj).T + c)
    pre = u @ w(block.mlp_in).T + np.asarray(block.mlp_in.bias)
    gelu = 0.5 * pre * (1 + np.tanh(np.sqrt(2 / np.pi) * (pre + 0.044715 * pre**3)))
    return rn(u + gelu @ w(block.mlp_out).T + np.asarray(block.mlp_out.bias))


def test_attend_input_step_matches_numpy(getkey):
    """`attend_input=True`: the attention reads the state plus the injection (its queries, keys
    and values), against float64 numpy; the default reads the state alone. The two blocks
    (built from one key) have the same leaves: checkpoints do not tell them apart."""
    key = getkey()
    attending = enn.DEQBlock(8, 2, key=key, attend_input=True, dtype=F64)
    plain = enn.DEQBlock(8, 2, key=key, dtype=F64)
    z, c = (jax.random.normal(k, (5, 8), F64) for k in jax.random.split(getkey()))
    for block, attend in ((attending, True), (plain, False)):
        np.testing.assert_allclose(
            eqx.filter_jit(lambda b: b.step(z, c))(block),
            _numpy_block_step(block, np.asarray(z), np.asarray(c), attend),
            rtol=1e-10,
            atol=1e-10,
        )
    assert np.abs(attending.step(z, c) - plain.step(z, c)).max() > 1e-3
    leaves = zip(jax.tree.leaves(attending), jax.tree.leaves(plain), strict=True)
    assert all(a is b or np.array_equal(a, b) for a, b in leaves)


@pytest.mark.parametrize("biases", [False, True])
def test_multihead_attention_carries_over_to_equinox(getkey, biases):
    """Equinox's positional order and field names: the same four projections in
    `eqx.nn.MultiheadAttention` (its fixed 1/sqrt(qk_size) scale is eqattn's initial beta) give
    the same output, for cross-attention with every size different and a mask."""
    sizes = dict(key_size=5, value_size=7, output_size=3, qk_size=4, vo_size=2)
    flags = (biases,) * 4
    ours = enn.MultiHeadAttention(3, 6, *sizes.values(), *flags, key=getkey(), dtype=F64)
    theirs = eqx.nn.MultiheadAttention(3, 6, *sizes.values(), *flags, key=getkey(), dtype=F64)
    for name in ("query_proj", "key_proj", "value_proj", "output_proj"):
        theirs = eqx.tree_at(lambda m: getattr(m, name), theirs, getattr(ours, name))
    q = jax.random.normal(getkey(), (4, 6), F64)
    k = jax.random.normal(getkey(), (9, 5), F64)
    v = jax.random.normal(getkey(), (9, 7), F64)
    mask = jax.random.bernoulli(getkey(), 0.7, (4, 9)).at[:, 0].set(True)
    np.testing.assert_allclose(
        ours(q, k, v, mask=mask), theirs(q, k, v, mask=mask), rtol=1e-12, atol=1e-14
    )
    for name, value in dict(num_heads=3, query_size=6, **sizes).items():
        assert getattr(ours, name) == getattr(theirs, name), name
    # the defaults agree too (values default to the keys: value_size defaults to key_size)
    ours, theirs = (
        enn.MultiHeadAttention(2, 8, key=getkey()),
        eqx.nn.MultiheadAttention(2, 8, key=getkey()),
    )
    assert jax.tree.map(jnp.shape, ours.query_proj) == jax.tree.map(jnp.shape, theirs.query_proj)
    assert jax.tree.map(jnp.shape, ours.output_proj) == jax.tree.map(jnp.shape, theirs.output_proj)
    with pytest.raises(ValueError, match="qk_size"):
        enn.MultiHeadAttention(4, 2, key=getkey())
    with pytest.raises(ValueError, match="without an output projection"):
        enn.MultiHeadAttention(2, 8, output_size=5, output_projection=False, key=getkey())


@pytest.mark.parametrize("bias", [True, False])
def test_per_token_linear_matches_numpy(getkey, bias):
    """The layers' token-wise linear maps (one matmul over the tokens, in place of
    `jax.vmap(eqx.nn.Linear)`): x W^T + b in float64 numpy, for leading batch axes too."""
    from eqattn.nn._tokens import per_token

    linear = eqx.nn.Linear(5, 3, use_bias=bias, key=getkey(), dtype=F64)
    x = np.asarray(jax.random.normal(getkey(), (2, 4, 5), F64))
    w = np.asarray(linear.weight)
    expected = x @ w.T + (np.asarray(linear.bias) if bias else 0.0)
    np.testing.assert_allclose(per_token(linear, x), expected, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(per_token(linear, x[0]), expected[0], rtol=1e-13, atol=1e-14)


def test_one_convention_for_outputs_with_statistics(getkey):
    """`layer(...)` is the output; `layer.forward(...)` is `(output, Equilibrium)` on every
    equilibrium layer and model, and the statistics describe the returned solve: the residual
    of the layer's own update at the solved state, recomputed here, is the reported one."""
    x = jax.random.normal(getkey(), (5, 8), F64)
    y = jax.random.normal(getkey(), (7, 6), F64)
    built = layers(getkey())
    kp, kl, kt = jax.random.split(getkey(), 3)
    pool = enn.HopfieldPooling(8, 2, key=kp, num_queries=3, dtype=F64)
    lookup = enn.HopfieldLayer(8, 4, 2, key=kl, dtype=F64)
    model = enn.DEQTransformer(3, 8, 2, key=kt, in_features=8, max_len=8, dtype=F64)
    calls = {name: (lambda f, n=name: f(x, y) if n == "Hopfield" else f(x)) for name in built}
    cases = [(built[n], calls[n]) for n in built] + [
        (pool, lambda f: f(y[:, :6] @ jnp.ones((6, 8)))),
        (lookup, lambda f: f(x)),
        (model, lambda f: f(x)),
    ]
    solved = []
    for layer, call in cases:  # one program per layer: forward and __call__ side by side
        (out, eq), plain = eqx.filter_jit(lambda m, call=call: (call(m.forward), call(m)))(layer)
        assert isinstance(eq, eqattn.Equilibrium), type(layer).__name__
        np.testing.assert_array_equal(out, plain)
        assert int(eq.steps) >= 1, type(layer).__name__
        solved.append((out, eq))
    for name in ("ImplicitAttention", "DEQBlock", "EnergyAttention"):
        layer = built[name]
        out, eq = solved[list(built).index(name)]
        np.testing.assert_array_equal(out, eq.value)  # the output is the solved state
        assert bool(eq.converged), name
        image = layer.step(out, x if name == "EnergyAttention" else layer.injection(x))
        residual = np.linalg.norm(np.asarray(image - out))
        np.testing.assert_allclose(eq.residual, residual, rtol=1e-6, atol=1e-13)
