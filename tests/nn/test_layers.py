"""Equilibrium layers and the DEQ transformer: implicit gradients against unrolled and finite
differences, training under jit and vmap, dropout, warm starts, fixed-point correction and the
Jacobian penalty."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import eqattn
import eqattn.nn as enn

from .layers import F64, apply, layers, tight_adjoint, with_adjoint


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
    layer = layers(getkey())[name]
    x = jax.random.normal(getkey(), (5, 8), F64)
    y = jax.random.normal(getkey(), (7, 6), F64)
    shape = eqx.filter_eval_shape(lambda layer: apply(name, layer, x, y), layer).shape
    c = jax.random.normal(getkey(), shape, F64)

    @eqx.filter_jit
    def loss(layer):
        return jnp.sum(jnp.sin(apply(name, layer, x, y)) * c)

    g_imp = eqx.filter_grad(loss)(with_adjoint(layer, tight_adjoint()))
    g_unr = eqx.filter_grad(loss)(with_adjoint(layer, eqattn.Unrolled()))
    leaves_imp = jax.tree.leaves(eqx.filter(g_imp, eqx.is_inexact_array))
    leaves_unr = jax.tree.leaves(eqx.filter(g_unr, eqx.is_inexact_array))
    assert len(leaves_imp) == len(leaves_unr) > 0
    for a, b in zip(leaves_imp, leaves_unr):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(b))) + 1e-12)

    # finite differences on the first entries of the first two parameter arrays
    params, static = eqx.partition(with_adjoint(layer, tight_adjoint()), eqx.is_inexact_array)
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


def test_attention_over_a_cache_matches_float64_numpy(getkey):
    """Multi-head attention with a key/value cache (`prefix`), computed as two parts merged by
    their log-sum-exps: against float64 numpy over the joined keys (a mask with a fully masked
    row, causal), its gradients against finite differences, and bfloat16 inputs."""
    from jax.test_util import check_grads

    from tests import reference

    heads, dim, p, n = 2, 8, 5, 3
    mha = enn.MultiHeadAttention(heads, dim, key=getkey(), causal=True, dtype=jnp.float64)
    x = jax.random.normal(getkey(), (p + n, dim), jnp.float64)
    mask = np.array(jax.random.bernoulli(getkey(), 0.6, (n, p + n)))
    mask[1] = False  # a query that sees nothing: 0, not NaN
    out = mha(x[p:], x[p:], mask=mask, prefix=mha.key_values(x[:p]))

    def split(w):  # `[m, dim] @ w` as heads `[heads, m, dim // heads]`, in float64
        w = np.asarray(w.weight, np.float64).T
        return lambda y: (np.asarray(y) @ w).reshape(len(y), heads, -1).transpose(1, 0, 2)

    q, k, v = (split(w) for w in (mha.query_proj, mha.key_proj, mha.value_proj))
    causal = np.arange(p + n)[None] <= np.arange(n)[:, None] + p
    ref, _ = reference.attention_with_lse(
        q(x[p:]), k(x), v(x), np.exp(np.asarray(mha.log_beta)), mask & causal
    )
    ref = ref.transpose(1, 0, 2).reshape(n, dim) @ np.asarray(mha.output_proj.weight).T
    np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-12)
    assert np.all(out[1] == 0)

    def f(new, keys, values):  # gradients to the new tokens and to the cache
        new, cache = jnp.asarray(new), enn.KeyValues(jnp.asarray(keys), jnp.asarray(values))
        return mha(new, new, mask=mask, prefix=cache)

    cache = mha.key_values(x[:p])
    check_grads(f, (x[p:], *cache), order=1, modes=["rev"])
    half = lambda a: a.astype(jnp.bfloat16) if eqx.is_inexact_array(a) else a  # noqa: E731
    mha, x = jax.tree.map(half, (mha, x))
    low = mha(x[p:], x[p:], mask=mask, prefix=mha.key_values(x[:p]))
    assert low.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(low, np.float64), ref, atol=0.1)


def test_a_block_cache_is_read_up_to_its_length(getkey):
    """A generation cache's slot (`BlockCache`: positions last, the first `length` in use,
    anything finite after them) as a `prefix` gives what the same tokens' `KeyValues` give, and
    `over_cache` (the new token's keys and values written first) gives the full pass's row."""
    heads, dim, p, n, room = 2, 8, 5, 1, 9
    mha = enn.MultiHeadAttention(heads, dim, key=getkey(), causal=True, dtype=jnp.float64)
    x = jax.random.normal(getkey(), (p + n, dim), jnp.float64)

    def slot(kv, length):  # [heads, m, d] -> [heads, d, room], finite garbage past `length`
        pad = jax.random.normal(getkey(), (heads, room - length, kv.shape[-1]), kv.dtype)
        return jnp.swapaxes(jnp.concatenate([kv[:, :length], 1e3 * pad], axis=1), 1, 2)

    kv = mha.key_values(x)
    mask = np.ones((n, room + n), bool)
    mask[:, 2] = False  # the mask still applies to the positions in use
    cache = enn.BlockCache(slot(kv.keys, p), slot(kv.values, p), jnp.asarray(p))
    prefix = enn.KeyValues(kv.keys[:, :p], kv.values[:, :p])
    plain = mha(x[p:], x[p:], mask=np.delete(mask, np.s_[p:room], axis=1), prefix=prefix)
    out = mha(x[p:], x[p:], mask=mask, prefix=cache)
    np.testing.assert_allclose(out, plain, rtol=1e-12, atol=1e-12)
    written = enn.BlockCache(slot(kv.keys, p + n), slot(kv.values, p + n), jnp.asarray(p + n))
    np.testing.assert_allclose(mha.over_cache(x[p:], written), mha(x, x)[p:], atol=1e-12)
