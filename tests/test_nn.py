import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import eqattn
import eqattn.nn as enn

F64 = jnp.float64
TIGHT = dict(rtol=1e-11, atol=0.0)


def _tight_adjoint():
    return eqattn.ImplicitAdjoint(
        linear_solver=eqattn.Anderson(**TIGHT, max_steps=300, history_size=8)
    )


def _layers(key):
    k1, k2, k3, k4 = jax.random.split(key, 4)
    solver = eqattn.Anderson(**TIGHT, max_steps=200)
    return {
        "ImplicitAttention": enn.ImplicitAttention(8, 2, key=k1, solver=solver, dtype=F64),
        "DEQBlock": enn.DEQBlock(8, 2, key=k2, solver=solver, dtype=F64),
        # a cell of two untied blocks (the second without the injection)
        "DEQBlock cell": enn.DEQBlock(8, 2, key=k2, solver=solver, depth=2, dtype=F64),
        # the attention reads the state plus the injection
        "DEQBlock attend_input": enn.DEQBlock(
            8, 2, key=k2, solver=solver, attend_input=True, dtype=F64
        ),
        "Hopfield": enn.Hopfield(8, 6, 2, key=k3, solver=solver, dtype=F64),
        "EnergyAttention": enn.EnergyAttention(
            8, 2, key=k4, num_memories=4, solver=eqattn.Picard(**TIGHT, max_steps=400), dtype=F64
        ),
    }


def _apply(name, layer, x, y):
    return layer(x, y) if name == "Hopfield" else layer(x)


def _with_adjoint(layer, adjoint):
    return eqx.tree_at(lambda m: m.adjoint, layer, adjoint)


@pytest.mark.parametrize(
    "name",
    [
        "ImplicitAttention",
        "DEQBlock",
        "DEQBlock cell",
        "DEQBlock attend_input",
        "Hopfield",
        "EnergyAttention",
    ],
)
def test_implicit_gradient_matches_unrolled_and_finite_differences(getkey, name):
    layer = _layers(getkey())[name]
    x = jax.random.normal(getkey(), (5, 8), F64)
    y = jax.random.normal(getkey(), (7, 6), F64)
    shape = eqx.filter_eval_shape(lambda layer: _apply(name, layer, x, y), layer).shape
    c = jax.random.normal(getkey(), shape, F64)

    @eqx.filter_jit
    def loss(layer):
        return jnp.sum(jnp.sin(_apply(name, layer, x, y)) * c)

    g_imp = eqx.filter_grad(loss)(_with_adjoint(layer, _tight_adjoint()))
    g_unr = eqx.filter_grad(loss)(_with_adjoint(layer, eqattn.Unrolled()))
    leaves_imp = jax.tree.leaves(eqx.filter(g_imp, eqx.is_inexact_array))
    leaves_unr = jax.tree.leaves(eqx.filter(g_unr, eqx.is_inexact_array))
    assert len(leaves_imp) == len(leaves_unr) > 0
    for a, b in zip(leaves_imp, leaves_unr):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(b))) + 1e-12)

    # finite differences on the first entries of the first two parameter arrays
    params, static = eqx.partition(_with_adjoint(layer, _tight_adjoint()), eqx.is_inexact_array)
    flat, unflatten = jax.flatten_util.ravel_pytree(params)
    grad_flat = jax.flatten_util.ravel_pytree(eqx.filter(g_imp, eqx.is_inexact_array))[0]
    h = 1e-6
    for i in (0, 1, flat.size // 2, flat.size - 1):
        e = jnp.zeros_like(flat).at[i].set(h)
        lp = loss(eqx.combine(unflatten(flat + e), static))
        lm = loss(eqx.combine(unflatten(flat - e), static))
        np.testing.assert_allclose(grad_flat[i], (lp - lm) / (2 * h), rtol=1e-5, atol=1e-8)


@pytest.mark.float32
def test_jit_vmap_and_training_with_optax(getkey):
    # A synthetic task: is the sum of the first feature over the tokens positive?
    x = jax.random.normal(getkey(), (128, 10, 6))
    y = (x[..., 0].sum(-1) > 0).astype(jnp.int32)
    model = enn.DEQTransformer(2, 16, 2, key=getkey(), in_features=6, max_len=10)
    assert x.dtype == model.readout.head.weight.dtype == jnp.float32  # as users run it
    opt = optax.adamw(1e-3)
    state = opt.init(eqx.filter(model, eqx.is_inexact_array))

    @eqx.filter_jit
    def step(model, state):
        def loss(model):
            logits, eq = jax.vmap(model.forward)(x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), eq

        (value, eq), grads = eqx.filter_value_and_grad(loss, has_aux=True)(model)
        updates, state = opt.update(grads, state, eqx.filter(model, eqx.is_inexact_array))
        return eqx.apply_updates(model, updates), state, value, eq

    losses = []
    for _ in range(30):
        model, state, value, eq = step(model, state)
        losses.append(float(value))
    assert eq.steps.shape == (128,) and eq.converged.shape == (128,)  # per example
    # the default float32 solve (rtol 1e-3, 30 steps) keeps converging while the model trains
    assert np.mean(eq.converged) >= 0.95, np.mean(eq.converged)
    assert losses[-1] < 0.6 * losses[0], losses


def test_token_task_and_padding(getkey):
    model = enn.DEQTransformer(5, 8, 2, key=getkey(), vocab_size=11, max_len=12, pooling="none")
    tokens = jnp.array([1, 4, 2, 0, 0])
    pad = jnp.array([True, True, True, False, False])
    logits = model(tokens, padding_mask=pad)
    assert logits.shape == (5, 5) and np.all(np.isfinite(logits))
    cls_model = enn.DEQTransformer(
        3,
        8,
        2,
        key=getkey(),
        vocab_size=11,
        pooling="cls",
        solver=eqattn.Anderson(rtol=1e-10, max_steps=100),
    )
    # padding tokens do not change the pooled output (at convergence: Anderson mixes all tokens'
    # iterates, so at a loose tolerance padded tokens nudge the others within that tolerance)
    a = cls_model(tokens, padding_mask=pad)
    b = cls_model(jnp.array([1, 4, 2, 7, 9]), padding_mask=pad)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.float32
def test_non_convergence_is_reported(getkey):
    key, solver = getkey(), eqattn.Anderson(rtol=1e-12, atol=0.0, max_steps=3)
    layer = enn.ImplicitAttention(8, 2, key=key, solver=solver)
    x = jax.random.normal(getkey(), (4, 5, 8))
    eq = jax.vmap(layer.equilibrium)(x)
    assert not np.any(eq.converged) and np.all(eq.steps == 3)
    loud = enn.ImplicitAttention(8, 2, key=key, solver=solver, throw=True)
    with pytest.raises(eqx.EquinoxRuntimeError, match="did not converge"):
        jax.block_until_ready(eqx.filter_jit(jax.vmap(loud))(x))


@pytest.mark.float32
def test_explicit_transformer_dropout(getkey):
    key = getkey()
    model = enn.Transformer(3, 8, 2, 2, key=key, in_features=4, max_len=6, dropout=0.5)
    x = jax.random.normal(getkey(), (6, 4))
    k1, k2 = jax.random.split(getkey())
    assert not np.allclose(model(x, key=k1), model(x, key=k2))
    np.testing.assert_allclose(model(x, key=k1), model(x, key=k1))
    plain = enn.Transformer(3, 8, 2, 2, key=key, in_features=4, max_len=6)  # same weights
    np.testing.assert_allclose(model(x, inference=True), plain(x))
    with pytest.raises(ValueError, match="needs `key`"):
        model(x)
    with pytest.raises(ValueError, match=r"`dropout` must be in \[0, 1\)"):
        enn.Transformer(3, 8, 2, 2, key=key, in_features=4, dropout=1.0)


@pytest.mark.float32
def test_inference_mode_turns_dropout_off(getkey):
    # eqx.nn.inference_mode switches every dropout of a model off, like Equinox's own layers;
    # the model then equals the same weights without dropout, and a call's `inference=False`
    # still overrides it (as eqx.nn.Dropout's call argument does).
    key, x = getkey(), jax.random.normal(getkey(), (6, 4))
    solver = eqattn.Picard(rtol=1e-6, max_steps=200)
    for make in (
        lambda rate: enn.Transformer(3, 8, 2, 2, key=key, in_features=4, max_len=6, dropout=rate),
        lambda rate: enn.DEQTransformer(
            3, 8, 2, key=key, in_features=4, max_len=6, dropout=rate, solver=solver
        ),
        lambda rate: enn.DEQTransformer(  # the stem's blocks too
            3, 8, 2, key=key, in_features=4, max_len=6, dropout=rate, solver=solver, stem_depth=1
        ),
    ):
        model, plain = make(0.3), make(0.0)
        with pytest.raises(ValueError, match="needs `key`"):
            model(x)
        frozen = eqx.nn.inference_mode(model)
        np.testing.assert_allclose(frozen(x), plain(x), rtol=1e-6, atol=1e-6)
        k = getkey()
        dropped = frozen(x, key=k, inference=False)
        assert not np.allclose(dropped, plain(x), rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(dropped, model(x, key=k), rtol=1e-6, atol=1e-6)
        with pytest.raises(ValueError, match="needs `key`"):
            eqx.nn.inference_mode(frozen, value=False)(x)


def test_variational_dropout_keeps_one_mask_per_solve(getkey):
    key, solver = getkey(), eqattn.Anderson(rtol=1e-6, max_steps=100)
    block = enn.DEQBlock(8, 2, key=key, dropout=0.3, solver=solver)
    x = jax.random.normal(getkey(), (6, 8))
    k1, k2 = jax.random.split(getkey())
    a, b = block.equilibrium(x, key=k1), block.equilibrium(x, key=k2)
    # a fixed mask gives a fixed map, so the solve converges (a mask redrawn every iteration would not)
    assert a.converged and b.converged
    assert not np.allclose(a.value, b.value)
    again = block.equilibrium(x, key=k1)
    np.testing.assert_allclose(a.value, again.value)
    plain = block.equilibrium(x, inference=True)
    no_dropout = enn.DEQBlock(8, 2, key=key, solver=solver)  # same weights
    np.testing.assert_allclose(plain.value, no_dropout.equilibrium(x).value)
    with pytest.raises(ValueError, match="needs `key`"):
        block(x)


@pytest.mark.float32
def test_deq_transformer_warm_start(getkey):
    # Starting from the previous fixed point gives the same fixed point in fewer steps.
    model = enn.DEQTransformer(
        3, 8, 2, key=getkey(), in_features=4, max_len=6, solver=eqattn.Picard(rtol=1e-8)
    )
    x = jax.random.normal(getkey(), (6, 4))
    cold_logits, cold = model.forward(x)
    warm_logits, warm = model.forward(x, z0=cold.value)
    assert cold.converged and warm.converged and warm.steps < cold.steps
    # float32: the two solves stop at different iterates within the solver's tolerance
    np.testing.assert_allclose(warm.value, cold.value, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(warm_logits, cold_logits, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"`z0` must have the shape \(6, 8\)"):
        model.forward(x, z0=jnp.zeros((5, 8)))


def test_fixed_point_correction_trajectory(getkey):
    # The pieces of `trajectory` against a plain Python loop of the block's map (Picard takes
    # z <- f(z); each piece's value is its last image), and each piece's gradient against that of
    # one application of f at the piece's (constant) start point: the one-step phantom gradient.
    block = enn.DEQBlock(8, 2, key=getkey(), dropout=0.2, dtype=F64)
    block = eqx.tree_at(lambda b: b.solver, block, eqattn.Picard(rtol=1e-14, max_steps=50))
    x = jax.random.normal(getkey(), (5, 8), F64)
    key = getkey()
    injection, _, drop = block._prepare(x, None, key, False)
    f = jax.jit(lambda z, b=block: b.step(z, injection, None, drop))
    pieces = eqx.filter_jit(block.trajectory)(x, (3, 2, 4), key=key)
    # a piece of k evaluations of f ends at its start's (k-1)-th image (the last point it
    # measured a residual at)
    z, points = jnp.zeros((5, 8), F64), []
    for k in (3, 2, 4):
        for _ in range(k - 1):
            z = f(z)
        points.append(z)
    assert [int(eq.steps) for eq in pieces] == [3, 2, 4]
    for eq, point in zip(pieces, points):
        np.testing.assert_allclose(eq.value, point, rtol=1e-12, atol=1e-12)
    # each piece's end depends on the parameters through one application of f at that end,
    # every point of the solve held constant: the one-step phantom gradient
    v = jax.random.normal(getkey(), (5, 8), F64)
    loss = lambda b, i: jnp.vdot(v, b.trajectory(x, (3, 2, 4), key=key)[i].value)  # noqa: E731
    # one compiled program for the three pieces' gradients (eagerly, each took seconds)
    grads = eqx.filter_jit(lambda b: [jax.grad(loss, allow_int=True)(b, i) for i in range(3)])(
        block
    )
    for i, point in enumerate(points):
        g = grads[i]
        expected = jax.grad(
            lambda b: jnp.vdot(v, b.step(point, b.injection(x), None, drop)), allow_int=True
        )(block)
        for a, b in zip(
            jax.tree.leaves(eqx.filter(g, eqx.is_inexact_array)),
            jax.tree.leaves(eqx.filter(expected, eqx.is_inexact_array)),
            strict=True,
        ):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    for bad in ((), (3, 1)):
        with pytest.raises(ValueError, match="`segments` must be"):
            block.trajectory(x, bad, key=key)
    # the model: per-piece logits under vmap, with per-example statistics
    model = enn.DEQTransformer(
        3, 8, 2, key=getkey(), in_features=4, max_len=6, dtype=F64,
        solver=eqattn.Picard(rtol=1e-10, max_steps=300),
    )  # fmt: skip
    xs = jax.random.normal(getkey(), (4, 6, 4), F64)
    logits, eqs = jax.vmap(lambda xi: model.trajectory(xi, (2, 200), inference=True))(xs)
    full, eq = jax.vmap(lambda xi: model.forward(xi, inference=True))(xs)
    assert len(logits) == 2 and logits[1].shape == (4, 3) and eqs[0].steps.shape == (4,)
    assert np.all(eqs[0].steps == 2) and np.all(eqs[1].converged) and np.all(eq.converged)
    np.testing.assert_allclose(logits[1], full, rtol=1e-8, atol=1e-9)


def test_jacobian_penalty_against_the_full_jacobian(getkey):
    # The Hutchinson estimate of |df/dz|_F^2 / size, averaged over many probes, against the
    # Frobenius norm of the Jacobian built column by column (jax.jacrev), at the fixed point.
    block = enn.DEQBlock(8, 2, key=getkey())
    x = jax.random.normal(getkey(), (5, 8))
    z = eqx.filter_jit(block)(x)
    injection = block.injection(x)
    jac = jax.jit(jax.jacrev(lambda z: block.step(z, injection)))(z).reshape(z.size, z.size)
    exact = float(np.sum(np.asarray(jac) ** 2) / z.size)
    estimate = eqx.filter_jit(block.jacobian_penalty)(x, z, probe_key=getkey(), samples=4000)
    assert abs(float(estimate) - exact) < 0.05 * exact
    grads = eqx.filter_jit(
        jax.grad(lambda b: b.jacobian_penalty(x, z, probe_key=jax.random.key(0)), allow_int=True)
    )(block)
    leaves = jax.tree.leaves(eqx.filter(grads, eqx.is_inexact_array))
    assert all(np.all(np.isfinite(g)) for g in leaves)
    assert any(np.any(g != 0) for g in leaves)  # it reaches the parameters
    # with dropout, the penalty is that of the map the solve used (the same masks from `key`)
    dropped = enn.DEQBlock(8, 2, key=getkey(), dropout=0.3)
    k = getkey()
    zd = eqx.filter_jit(dropped)(x, key=k)
    jitted = eqx.filter_jit(dropped.jacobian_penalty)
    penalty = lambda **kw: jitted(x, zd, probe_key=jax.random.key(1), **kw)  # noqa: E731
    assert penalty(key=k) == penalty(key=k) != penalty(inference=True)
    with pytest.raises(ValueError, match="needs `key`"):
        penalty()
    model = enn.DEQTransformer(3, 8, 2, key=getkey(), in_features=4, max_len=6, stem_depth=1)
    xt = jax.random.normal(getkey(), (6, 4))
    _, eq = eqx.filter_jit(model.forward)(xt)
    assert float(eqx.filter_jit(model.jacobian_penalty)(xt, eq.value, probe_key=getkey())) > 0
    # with a stem, the penalty's map is the block's at the stem's output: it trains the stem too
    stem_grads = eqx.filter_jit(
        jax.grad(
            lambda m: m.jacobian_penalty(xt, eq.value, probe_key=jax.random.key(0)),
            allow_int=True,
        )
    )(model).stem
    assert any(np.any(g != 0) for g in jax.tree.leaves(eqx.filter(stem_grads, eqx.is_array)))


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
    with pytest.raises(ValueError, match="`depth` must be >= 1"):
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
        with pytest.raises(ValueError, match="`depth`"):
            enn.DEQBlock(16, 2, key=getkey(), depth=bad)
    with pytest.raises(ValueError, match="one KeyValues per block of the cell"):
        cell.equilibrium(z, prefix=cell.key_values(z))
    with pytest.raises(ValueError, match=r"`x` must have shape \[n, 6\]"):
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
    layers = _layers(getkey())
    kp, kl, kt = jax.random.split(getkey(), 3)
    pool = enn.HopfieldPooling(8, 2, key=kp, num_queries=3, dtype=F64)
    lookup = enn.HopfieldLayer(8, 4, 2, key=kl, dtype=F64)
    model = enn.DEQTransformer(3, 8, 2, key=kt, in_features=8, max_len=8, dtype=F64)
    calls = {name: (lambda f, n=name: f(x, y) if n == "Hopfield" else f(x)) for name in layers}
    cases = [(layers[n], calls[n]) for n in layers] + [
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
        layer = layers[name]
        out, eq = solved[list(layers).index(name)]
        np.testing.assert_array_equal(out, eq.value)  # the output is the solved state
        assert bool(eq.converged), name
        image = layer.step(out, x if name == "EnergyAttention" else layer.injection(x))
        residual = np.linalg.norm(np.asarray(image - out))
        np.testing.assert_allclose(eq.residual, residual, rtol=1e-6, atol=1e-13)


def test_a_seed_gives_the_initial_weights_it_gave_before_the_models_were_composed():
    """Results files and transcripts name a seed: the composed models (TokenEmbedding, ReadOut)
    draw the same initial weights from it as the earlier layout did (sums of every leaf,
    recorded by that code)."""
    from pathlib import Path

    fixture = json.loads((Path(__file__).parent / "fixtures/initial_weights.json").read_text())
    key = jax.random.key(0)
    models = {
        "DEQTransformer(10, 16, 2, in_features=8, max_len=8, pooling='cls')": enn.DEQTransformer(
            10, 16, 2, key=key, in_features=8, max_len=8, pooling="cls"
        ),
        "Transformer(10, 16, 2, 3, vocab_size=12, max_len=8)": enn.Transformer(
            10, 16, 2, 3, key=key, vocab_size=12, max_len=8
        ),
    }
    for name, model in models.items():
        leaves = jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array))
        sums = [float(np.asarray(leaf, np.float64).sum()) for leaf in leaves]
        np.testing.assert_allclose(sums, fixture["sums"][name], rtol=1e-12, atol=1e-12)
