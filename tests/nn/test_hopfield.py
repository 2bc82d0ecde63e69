import json
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import logsumexp, softmax

import eqattn

from ..checks import unchecked


def _reference_energy(xi, X, beta):
    m = X.shape[0]
    M = np.max(np.linalg.norm(X, axis=-1))
    return -logsumexp(beta * X @ xi) / beta + 0.5 * xi @ xi + np.log(m) / beta + 0.5 * M**2


def test_energy_and_update_match_reference(rng):
    X, xi = rng.normal(size=(10, 4)), rng.normal(size=4)
    for beta in (0.1, 1.0, 7.0):
        np.testing.assert_allclose(
            eqattn.hopfield_energy(xi, X, beta=beta), _reference_energy(xi, X, beta), rtol=1e-13
        )
        np.testing.assert_allclose(
            eqattn.hopfield_update(xi, X, beta=beta), X.T @ softmax(beta * X @ xi), rtol=1e-13
        )


def test_update_is_a_gradient_step_on_the_energy(rng):
    # grad E = xi - update(xi): the update is the CCCP / unit gradient step.
    X, xi = rng.normal(size=(12, 5)), rng.normal(size=(3, 5))
    grad = jax.grad(lambda s: jnp.sum(eqattn.hopfield_energy(s, X, beta=2.0)))(xi)
    np.testing.assert_allclose(xi - grad, eqattn.hopfield_update(xi, X, beta=2.0), rtol=1e-12)


def test_energy_never_increases(rng):
    d, m, trials, steps = 16, 40, 200, 8
    patterns = rng.normal(size=(trials, m, d))
    state = rng.normal(size=(trials, d)) * rng.uniform(0.1, 3, size=(trials, 1))
    beta = np.exp(rng.uniform(np.log(0.01), np.log(10), size=trials))
    energy = jax.jit(lambda s: eqattn.hopfield_energy(s, patterns, beta=beta))
    update = jax.jit(lambda s: eqattn.hopfield_update(s, patterns, beta=beta))
    e = energy(state)
    assert np.all(e >= 0)
    for _ in range(steps):
        state = update(state)
        e_new = energy(state)
        assert np.all(e_new >= 0)
        assert np.max(e_new - e) <= 1e-12
        e = e_new


def test_one_step_retrieval(rng):
    d, m, beta = 64, 1000, 32.0
    X = rng.normal(size=(m, d))
    X /= np.linalg.norm(X, axis=-1, keepdims=True)
    idx = rng.choice(m, size=20, replace=False)
    # 20% noise: |noise| = 0.2 |x|
    noise = rng.normal(size=(20, d))
    noise *= 0.2 / np.linalg.norm(noise, axis=-1, keepdims=True)
    retrieved = eqattn.hopfield_update(X[idx] + noise, X, beta=beta)
    assert np.max(np.abs(retrieved - X[idx])) < 1e-6


def test_masks_drop_the_masked_patterns(rng):
    # Per batch element a different mask (and NaN in the masked patterns): energy, update and
    # the energy's gradient equal the float64 reference on the kept patterns alone.
    b, m, d = 4, 9, 5
    X, xi = rng.normal(size=(b, m, d)), rng.normal(size=(b, d))
    mask = rng.uniform(size=(b, m)) < 0.6
    mask[:, 0] = True
    poisoned = np.where(mask[..., None], X, np.nan)
    beta = np.array([0.3, 1.0, 2.5, 7.0])
    energy = eqattn.hopfield_energy(xi, poisoned, beta=beta, mask=mask)
    update = eqattn.hopfield_update(xi, poisoned, beta=beta, mask=mask)
    grad_x, grad_xi = jax.grad(
        lambda p, s: jnp.sum(eqattn.hopfield_energy(s, p, beta=beta, mask=mask)), argnums=(0, 1)
    )(poisoned, xi)
    for i in range(b):
        kept = X[i][mask[i]]
        np.testing.assert_allclose(energy[i], _reference_energy(xi[i], kept, beta[i]), rtol=1e-12)
        expected = kept.T @ softmax(beta[i] * kept @ xi[i])
        np.testing.assert_allclose(update[i], expected, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(grad_xi[i], xi[i] - expected, rtol=1e-10, atol=1e-12)
    assert np.all(grad_x[~mask] == 0) and np.all(np.isfinite(grad_x))
    # one mask for the whole batch broadcasts; every pattern masked: update 0, energy NaN
    shared = eqattn.hopfield_update(xi, X, beta=2.0, mask=mask[0])
    np.testing.assert_allclose(shared[1], X[1][mask[0]].T @ softmax(2.0 * X[1][mask[0]] @ xi[1]))
    none = np.zeros(m, bool)
    assert np.all(eqattn.hopfield_update(xi, X, mask=none) == 0)
    assert np.all(np.isnan(eqattn.hopfield_energy(xi, X, mask=none)))
    with (
        unchecked(),
        pytest.raises(ValueError, match=r"`mask` must be boolean .* m = 9 .* got float64 \(9,\)"),
    ):
        eqattn.hopfield_update(xi, X, mask=np.ones(m))
    with unchecked(), pytest.raises(ValueError, match=r"batch \(4,\) .* got bool \(3, 9\)"):
        eqattn.hopfield_energy(xi, X, mask=np.ones((3, m), bool))
    with unchecked(), pytest.raises(ValueError, match=r"state \(3,\), patterns \(5, 4\)"):
        eqattn.hopfield_energy(np.ones(3), np.ones((5, 4)))


def test_layer_energy_counts_only_unpadded_patterns(rng):
    # Padding the stored patterns changes neither the layer's equilibrium nor its energy (the
    # energy used to count the padded patterns).
    layer = eqattn.nn.Hopfield(6, 5, 2, key=jax.random.key(3), dtype=jnp.float64)
    state, stored = rng.normal(size=(3, 6)), rng.normal(size=(7, 5))
    padded = np.concatenate([stored, np.full((2, 5), 1e3)])
    keep = np.arange(9) < 7
    np.testing.assert_allclose(
        layer.energy(state, padded, padding_mask=keep), layer.energy(state, stored), rtol=1e-9
    )


def _plain_updates(q0, k, beta, injection, steps):
    """numpy float64: `steps` plain updates xi <- (K^T softmax(beta K xi) + a xi0) / (1 + a) per
    head from xi0 = q0, and the layer's energy there (independent of eqattn)."""
    q0, k = np.asarray(q0, np.float64), np.asarray(k, np.float64)
    beta = np.asarray(beta, np.float64)[:, None, None]
    xi = q0
    for _ in range(steps):
        p = softmax(beta * np.einsum("hnd,hmd->hnm", xi, k), axis=-1)
        xi = (np.einsum("hnm,hmd->hnd", p, k) + injection * q0) / (1 + injection)
    return xi, _layer_energy(xi, q0, k, beta[:, 0, 0], injection)


def _layer_energy(xi, q0, k, beta, injection):
    xi, q0, k = (np.asarray(a, np.float64) for a in (xi, q0, k))
    energy = sum(
        _reference_energy(xi[h, i], k[h], beta[h])
        for h in range(xi.shape[0])
        for i in range(xi.shape[1])
    )
    return energy + 0.5 * injection * np.sum((xi - q0) ** 2)


# The Hopfield retrieval bug's reproducer (beta 0.25, 16-dim patterns, 12 stored, 3 states: Anderson
# left the basin in 7 of 20 seeds), at small beta (a mixture) and large beta (one pattern).
RETRIEVAL_BETAS = [0.05, 0.25, 1.0, 4.0]


def _retrieval_problems(dtype):
    for beta in RETRIEVAL_BETAS:
        for seed in range(12):
            kl, ks, kp = jax.random.split(jax.random.key(seed), 3)
            s, y = jax.random.normal(ks, (3, 16), dtype), jax.random.normal(kp, (12, 16), dtype)
            yield beta, seed, kl, s, y


@pytest.mark.slow
def test_the_layer_reaches_the_fixed_point_of_repeated_updates():
    """float64, 12 seeds x 4 betas: the default solver (plain iteration), run to a tight
    tolerance, lands within 1e-6 of 5,000 plain updates of the update rule (numpy), at an energy
    not above theirs, with `energy_rose` False; and at its default tolerance within 1e-2."""
    equilibrium = eqx.filter_jit(lambda layer, s, y: layer.equilibrium(s, y))
    worst = 0.0
    for beta, seed, kl, s, y in _retrieval_problems(jnp.float64):
        layer = eqattn.nn.Hopfield(16, 16, 1, key=kl, beta=beta, dtype=jnp.float64)
        tight = eqx.tree_at(
            lambda m: m.solver, layer, eqattn.Picard(rtol=1e-13, atol=0.0, max_steps=5000)
        )
        q0, k, _, _ = layer._patterns(s, y, None, None)
        ref, ref_energy = _plain_updates(q0, k, layer.attention.beta, layer.injection, 5000)
        eq = equilibrium(tight, s, y)
        gap = np.linalg.norm(eq.value - ref) / np.linalg.norm(ref)
        assert gap < 1e-6, (beta, seed, gap)
        energy = _layer_energy(eq.value, q0, k, np.asarray(layer.attention.beta), layer.injection)
        assert energy <= ref_energy + 1e-9 * abs(ref_energy), (beta, seed)
        assert not bool(eq.stats["energy_rose"]), (beta, seed)
        default = equilibrium(layer, s, y)
        assert bool(default.converged) and not bool(default.stats["energy_rose"]), (beta, seed)
        worst = max(worst, np.linalg.norm(default.value - ref) / np.linalg.norm(ref))
    assert worst < 1e-2, worst


@pytest.mark.float32
def test_the_default_solve_retrieves_in_float32_and_says_when_the_energy_rose():
    """float32 (as users run it): the default solve converges, never raises the energy and lands
    within 1e-2 of 5,000 plain updates (numpy, float64, from the same projected patterns).
    `energy_rose` agrees with the float64 energies: for Anderson's points, and for a solve cut
    off at its start (above the first plain update's energy: it must say so)."""
    equilibrium = eqx.filter_jit(lambda layer, s, y: layer.equilibrium(s, y))
    anderson, cut = eqattn.Anderson(rtol=1e-4), eqattn.Picard(max_steps=1)
    for beta, seed, kl, s, y in _retrieval_problems(jnp.float32):
        layer = eqattn.nn.Hopfield(16, 16, 1, key=kl, beta=beta)
        q0, k, _, _ = layer._patterns(s, y, None, None)
        b = np.asarray(layer.attention.beta)
        ref, _ = _plain_updates(q0, k, b, layer.injection, 5000)
        first, first_energy = _plain_updates(q0, k, b, layer.injection, 1)
        eq = equilibrium(layer, s, y)
        assert eq.value.dtype == jnp.float32
        assert bool(eq.converged) and not bool(eq.stats["energy_rose"]), (beta, seed)
        gap = np.linalg.norm(np.asarray(eq.value, np.float64) - ref) / np.linalg.norm(ref)
        assert gap < 1e-2, (beta, seed, gap)
        for solver in (anderson, cut):
            other = equilibrium(eqx.tree_at(lambda m: m.solver, layer, solver), s, y)
            energy = _layer_energy(other.value, q0, k, b, layer.injection)
            if bool(other.stats["energy_rose"]):
                assert energy > first_energy, (beta, seed, solver)
            if energy > first_energy + 1e-4 * abs(first_energy):
                assert bool(other.stats["energy_rose"]), (beta, seed, solver)
        assert bool(other.stats["energy_rose"]) or np.allclose(first, q0, atol=1e-5), (beta, seed)


def _hopfield_update_steps_reference(
    params, state, stored, beta, heads, steps, eps, drop=None, extra=None, values=None
):
    """A dense float64 formula of the update-steps mode (projections, `steps` plain updates
    per head with the association-change stop, output), written without eqattn."""
    wq, wk, wv, wo = params
    split = lambda x: x.reshape(x.shape[0], heads, -1).transpose(1, 0, 2)  # noqa: E731
    values = stored if values is None else values
    xi, k, v = split(state @ wq.T), split(stored @ wk.T), split(values @ wv.T)
    if extra is not None:  # extra projected keys [h, e, d] and values [h, e, dv]
        k, v = jnp.concatenate([k, extra[0]], 1), jnp.concatenate([v, extra[1]], 1)
    assoc = lambda xi: jax.nn.softmax(beta * jnp.einsum("hnd,hmd->hnm", xi, k), -1)  # noqa: E731
    a = assoc(xi)
    active = jnp.full(heads, steps > 0)
    for t in range(1, steps + 1):
        new_xi = jnp.einsum("hnm,hmd->hnd", a, k)
        new_a = assoc(new_xi)
        change = jnp.sqrt(jnp.sum(jax.lax.stop_gradient(new_a - a) ** 2, axis=(1, 2)))
        xi = jnp.where(active[:, None, None], new_xi, xi)
        a = jnp.where(active[:, None, None], new_a, a)
        active = active & (change > eps) & (t < steps)
    if drop is not None:  # (keep mask [h, n, m], rate): inverted dropout on the association
        keep, rate = drop
        a = a * keep / (1 - rate)
    out = jnp.einsum("hnm,hmd->hnd", a, v).transpose(1, 0, 2).reshape(state.shape[0], -1)
    return out @ wo.T


def _update_steps_layer(steps, eps, key=jax.random.key(0), value_dim=8, dtype=jnp.float64, **kw):
    return eqattn.nn.Hopfield(
        6, 5, 2, key=key, hidden_dim=6, value_dim=value_dim, out_dim=7, beta=1.5,
        normalize_state=False, normalize_stored=False, normalize_projected=False,
        update_steps=steps, update_steps_eps=eps, dtype=dtype, **kw,
    )  # fmt: skip


def _projections(layer):
    a = layer.attention
    return (a.query_proj.weight, a.key_proj.weight, a.value_proj.weight, a.output_proj.weight)


def test_update_steps_mode_against_a_dense_formula_and_its_gradients(rng):
    state, stored = rng.normal(size=(3, 6)), rng.normal(size=(8, 5))
    for steps in range(5):
        layer = _update_steps_layer(steps, 0.0)
        params = _projections(layer)
        beta = float(layer.attention.beta[0])
        expected = _hopfield_update_steps_reference(params, state, stored, beta, 2, steps, 0.0)
        out, eq = layer.forward(state, stored)
        np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-14)
        assert int(eq.steps) == steps and not bool(eq.converged)
        # gradients with respect to every projection, against autodiff of the dense formula
        g = eqx.filter_grad(lambda lay: jnp.sum(jnp.sin(lay(state, stored))))(layer)
        g_ref = jax.grad(
            lambda p: jnp.sum(
                jnp.sin(_hopfield_update_steps_reference(p, state, stored, beta, 2, steps, 0.0))
            )
        )(params)
        for got, ref in zip(_projections(g), g_ref, strict=True):
            np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-13)
            assert np.any(np.asarray(got) != 0)  # the query projection too
    # a large eps stops every head after its first update, as the dense formula does
    layer = _update_steps_layer(4, 10.0)
    out, eq = layer.forward(state, stored)
    expected = _hopfield_update_steps_reference(
        _projections(layer), state, stored, float(layer.attention.beta[0]), 2, 4, 10.0
    )
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-14)
    assert int(eq.steps) == 1 and bool(eq.converged)
    for bad in (-1, 1.5, True):
        with (
            unchecked(),
            pytest.raises(ValueError, match="`update_steps` must be None or an int >= 0"),
        ):
            _update_steps_layer(bad, 0.0)


@pytest.mark.parametrize(
    "dtype", [jnp.float64, pytest.param(jnp.float32, marks=pytest.mark.float32)], ids=str
)
def test_update_steps_mode_matches_hopfield_layers(dtype):
    # Outputs of hopfield-layers' PyTorch `Hopfield` for update_steps_max = 0..4, computed once
    # with copied weights (tests/fixtures/make_hflayers_update_steps.py), float64; the layer in
    # float64 and, as users run it, float32.
    fixture = json.loads(
        (Path(__file__).parent.parent / "fixtures/hflayers_update_steps.json").read_text()
    )
    w = {name: jnp.asarray(v, dtype) for name, v in fixture["weights"].items()}
    state, stored = (np.asarray(fixture[k], dtype) for k in ("state", "stored"))
    tol = dict(rtol=1e-11, atol=1e-14) if dtype == jnp.float64 else dict(rtol=2e-5, atol=2e-6)
    for steps, expected in fixture["outputs"].items():
        layer = _update_steps_layer(int(steps), fixture["update_steps_eps"], dtype=dtype)
        layer = eqx.tree_at(_projections, layer, (w["query"], w["key"], w["value"], w["output"]))
        out = layer(state, stored)
        assert out.dtype == dtype
        np.testing.assert_allclose(out, expected, **tol)


def test_association_dropout(rng):
    # Dropout on the output's association weights (hopfield-layers' `dropout`): with a key, the
    # dense formula with the association multiplied by the Bernoulli keep-mask / (1 - rate);
    # under eqx.nn.inference_mode, the same weights without dropout.
    state, stored = rng.normal(size=(3, 6)), rng.normal(size=(8, 5))
    layer, plain = _update_steps_layer(2, 0.0, dropout=0.4), _update_steps_layer(2, 0.0)
    with pytest.raises(ValueError, match="needs `key`"):
        layer(state, stored)
    np.testing.assert_allclose(eqx.nn.inference_mode(layer)(state, stored), plain(state, stored))
    key = jax.random.key(5)
    keep = jax.random.bernoulli(key, 0.6, (2, 3, 8))  # the layer's draw: [heads, n, m]
    expected = _hopfield_update_steps_reference(
        _projections(layer), state, stored, float(layer.attention.beta[0]), 2, 2, 0.0,
        drop=(keep, 0.4),
    )  # fmt: skip
    np.testing.assert_allclose(layer(state, stored, key=key), expected, rtol=1e-12, atol=1e-14)
    assert not np.allclose(expected, plain(state, stored))
    pooling = eqattn.nn.HopfieldPooling(5, 1, key=jax.random.key(1), dropout=0.4)
    with pytest.raises(ValueError, match="needs `key`"):
        pooling(stored)
    assert pooling(stored, key=key).shape == (1, 5)
    with pytest.raises(ValueError, match=r"`dropout` must be in \[0, 1\)"):
        _update_steps_layer(2, 0.0, dropout=1.0)


@pytest.mark.parametrize("option", ["add_zero_association", "input_bias"])
def test_options_match_hopfield_layers(option):
    # hopfield-layers' add_zero_association and input_bias (2 update steps, copied weights and
    # biases; tests/fixtures/make_hflayers_update_steps.py), and padding of the stored patterns
    # still equal to cutting them.
    fixture = json.loads(
        (Path(__file__).parent.parent / "fixtures/hflayers_update_steps.json").read_text()
    )
    entry = fixture["options"][option]
    w = {name: jnp.asarray(v) for name, v in entry["weights"].items()}
    state, stored = np.asarray(fixture["state"]), np.asarray(fixture["stored"])
    kw = {
        "add_zero_association": dict(add_zero_association=True),
        "input_bias": dict(use_bias=True),
    }
    layer = _update_steps_layer(
        2, fixture["update_steps_eps"], value_dim=entry["value_dim"], **kw[option]
    )
    layer = eqx.tree_at(_projections, layer, (w["query"], w["key"], w["value"], w["output"]))
    if option == "input_bias":
        b = np.asarray(entry["in_proj_bias"])
        a = layer.attention
        layer = eqx.tree_at(
            lambda lay: tuple(
                getattr(lay.attention, p).bias
                for p in ("query_proj", "key_proj", "value_proj", "output_proj")
            ),
            layer,
            (b[:6], b[6:12], b[12:], np.asarray(entry["out_proj_bias"])),
        )
        assert a.query_proj.bias.shape == (6,) and a.value_proj.bias.shape == (8,)
    np.testing.assert_allclose(layer(state, stored), entry["output"], rtol=1e-11, atol=1e-14)
    padded = np.concatenate([stored, np.full((2, stored.shape[1]), 1e3)])
    keep = np.arange(len(padded)) < len(stored)
    np.testing.assert_allclose(
        layer(state, padded, padding_mask=keep), entry["output"], rtol=1e-11, atol=1e-14
    )
    extra = option == "add_zero_association"
    assert layer.association(state, stored).shape == (2, 3, len(stored) + extra)


def test_bias_patterns_against_a_dense_formula(rng):
    # concat_bias_pattern: a learned projected key and value appended to the stored patterns'
    # (then the zero pattern, when both are on), in the solve and in the output.
    state, stored = rng.normal(size=(3, 6)), rng.normal(size=(8, 5))
    layer = _update_steps_layer(2, 0.0, concat_bias_pattern=True, add_zero_association=True)
    bias_key, bias_value = rng.normal(size=6), rng.normal(size=8)
    layer = eqx.tree_at(lambda lay: (lay.bias_key, lay.bias_value), layer, (bias_key, bias_value))
    extra = (
        np.stack([bias_key.reshape(2, 3), np.zeros((2, 3))], axis=1),
        np.stack([bias_value.reshape(2, 4), np.zeros((2, 4))], axis=1),
    )
    expected = _hopfield_update_steps_reference(
        _projections(layer), state, stored, float(layer.attention.beta[0]), 2, 2, 0.0,
        extra=extra,
    )  # fmt: skip
    np.testing.assert_allclose(layer(state, stored), expected, rtol=1e-12, atol=1e-14)
    plain = _update_steps_layer(2, 0.0)
    assert not np.allclose(plain(state, stored), expected)


def test_activation_and_fixed_patterns(rng):
    # association_activation applies to the output; trainable=False stops the gradient at the
    # pooling queries / lookup patterns and nowhere else.
    state, stored = rng.normal(size=(3, 6)), rng.normal(size=(8, 5))
    plain = _update_steps_layer(2, 0.0)
    relu = _update_steps_layer(2, 0.0, association_activation=jax.nn.relu)
    np.testing.assert_allclose(
        eqx.filter_jit(relu)(state, stored), np.maximum(eqx.filter_jit(plain)(state, stored), 0)
    )
    x = jnp.asarray(rng.normal(size=(4, 5)))
    for cls, arg, field in (
        (eqattn.nn.HopfieldPooling, x, "queries"),
        (eqattn.nn.HopfieldLayer, x[:3], "patterns"),
    ):
        extra = (6,) if cls is eqattn.nn.HopfieldLayer else ()
        for trainable in (True, False):
            model = cls(5, *extra, key=jax.random.key(2), trainable=trainable, dtype=jnp.float64)
            g = eqx.filter_jit(eqx.filter_grad(lambda m, x: jnp.sum(jnp.sin(m(x)))))(model, arg)
            assert np.any(np.asarray(getattr(g, field)) != 0) == trainable
            assert np.any(np.asarray(g.hopfield.attention.query_proj.weight) != 0)


def test_lookup_with_separate_targets(rng):
    # HopfieldLayer(separate_targets=True): keys from the lookup patterns, values from the
    # targets (the dense formula with values projected from the targets); each table fixed by
    # its flag.
    state = jnp.asarray(rng.normal(size=(3, 6)))
    kw = dict(
        hidden_dim=6, value_dim=8, out_dim=7, beta=1.5, normalize_state=False,
        normalize_stored=False, normalize_projected=False, update_steps=2,
        update_steps_eps=0.0, dtype=jnp.float64,
    )  # fmt: skip
    layer = eqattn.nn.HopfieldLayer(6, 5, 2, key=jax.random.key(4), separate_targets=True, **kw)
    expected = _hopfield_update_steps_reference(
        _projections(layer.hopfield), state, layer.patterns, 1.5, 2, 2, 0.0, values=layer.targets
    )
    np.testing.assert_allclose(layer(state), expected, rtol=1e-12, atol=1e-14)
    same = eqattn.nn.HopfieldLayer(6, 5, 2, key=jax.random.key(4), **kw)
    assert not np.allclose(same(state), expected)  # without targets: values from the patterns
    for trainable, targets_trainable in ((True, False), (False, True)):
        fixed = eqattn.nn.HopfieldLayer(
            6, 5, 2, key=jax.random.key(4), separate_targets=True, trainable=trainable,
            targets_trainable=targets_trainable, **kw,
        )  # fmt: skip
        g = eqx.filter_grad(lambda m: jnp.sum(jnp.sin(m(state))))(fixed)
        assert np.any(np.asarray(g.patterns) != 0) == trainable
        assert np.any(np.asarray(g.targets) != 0) == targets_trainable
    with pytest.raises(ValueError, match="`values` must have as many rows"):
        layer.hopfield(state, layer.patterns, values=layer.targets[:3])


@pytest.mark.parametrize(
    "option",
    [
        "static_state",
        "static_stored",
        "static_values",
        "connected_values",
        "connected_static_values",
    ],
)
def test_static_patterns_match_hopfield_layers(option):
    # hopfield-layers' state/stored_pattern_as_static and pattern_projection_as_static: the raw
    # patterns in every head (2 update steps, copied weights of the projections it uses).
    fixture = json.loads(
        (Path(__file__).parent.parent / "fixtures/hflayers_update_steps.json").read_text()
    )
    entry = fixture["options"][option]
    state, stored = np.asarray(entry["state"]), np.asarray(entry["stored"])
    flags = {
        "connected_static_values": dict(connected_values=True, static_values=True),
    }.get(option, {option: True})
    layer = eqattn.nn.Hopfield(
        state.shape[1], stored.shape[1], 2, key=jax.random.key(0), hidden_dim=6, value_dim=6,
        out_dim=7, beta=fixture["beta"], normalize_state=False, normalize_stored=False,
        normalize_projected=False, update_steps=2, update_steps_eps=fixture["update_steps_eps"],
        dtype=jnp.float64, **flags,
    )  # fmt: skip
    names = {
        "query": "query_proj",
        "key": "key_proj",
        "value": "value_proj",
        "output": "output_proj",
    }
    for name, w in entry["weights"].items():
        layer = eqx.tree_at(
            lambda lay, n=names[name]: getattr(lay.attention, n).weight, layer, jnp.asarray(w)
        )
    np.testing.assert_allclose(layer(state, stored), entry["output"], rtol=1e-11, atol=1e-14)
    if option.startswith("static"):
        with pytest.raises(ValueError, match=f"`{option}=True` uses the raw patterns"):
            eqattn.nn.Hopfield(5, 5, 2, key=jax.random.key(0), hidden_dim=6, **flags)


def test_hopfield_options_and_their_keywords_build_the_same_layer():
    """hopfield-layers' options through `HopfieldOptions` or as keywords (the compatibility
    path): the same layer; an unknown keyword or a bad option is refused."""
    options = eqattn.nn.HopfieldOptions(value_dim=4, use_bias=True, add_zero_association=True)
    a = eqattn.nn.Hopfield(8, 6, 2, key=jax.random.key(0), options=options)
    b = eqattn.nn.Hopfield(8, 6, 2, key=jax.random.key(0), value_dim=4, use_bias=True,
                     add_zero_association=True)  # fmt: skip
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert np.array_equal(x, y)
    assert a.attention.value_proj.out_features == 4 and a.zero_association
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['update_step'\\]"):
        eqattn.nn.Hopfield(8, key=jax.random.key(0), update_step=3)
    with pytest.raises(ValueError, match="`update_steps` must be None or an int >= 0"):
        eqattn.nn.HopfieldOptions(update_steps=-1)
