"""Bad input gets a clear error or the reference's answer, never a plausible wrong number: masked
entries are inert, beta is checked, NaN propagates, solvers do not diverge; and a property-based
suite over shapes, dtypes, masks, beta and NaN placement (bounded: a fixed example budget)."""

from functools import partial

import equinox as eqx
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import eqattn
from eqattn._solve._loop import iterate

from .. import reference

IMPLEMENTATIONS = ["xla", "chunked", "pallas"]  # pallas runs in interpret mode on the CPU


def _some_poison(k, v, q, seed):
    """NaN in one key, inf in one value and NaN in one query (picked by `seed`), mask or not."""
    k, v, q = k.copy(), v.copy(), q.copy()
    k[..., seed % k.shape[-2], 0] = np.nan
    v[..., (seed // 7) % v.shape[-2], -1:] = np.inf
    q[..., (seed // 3) % q.shape[-2], -1] = np.nan
    return k, v, q


def _call(impl, q, k, v, beta, mask):
    extra = {"chunk_size": 3} if impl == "chunked" else {}
    return eqattn.attention_with_lse(q, k, v, beta=beta, mask=mask, implementation=impl, **extra)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_masked_keys_values_and_queries_are_inert(impl):
    """NaN/inf in keys and values that no query may see, and in queries that may see nothing:
    output, lse and gradients equal those of the clean problem."""
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 7, 4)), rng.normal(size=(2, 7, 3))
    mask = np.ones((2, 5, 7), bool)
    mask[0, :, 5:] = False  # padding keys of example 0
    mask[1, :, 0] = False
    mask[1, 3, :] = False  # a query that sees nothing
    dirty_k, dirty_v, dirty_q = k.copy(), v.copy(), q.copy()
    dirty_k[0, 5:], dirty_v[0, 6], dirty_k[1, 0] = np.nan, np.inf, np.inf
    dirty_v[1, 0], dirty_q[1, 3] = np.nan, np.nan

    out, lse = _call(impl, dirty_q, dirty_k, dirty_v, 1.0, mask)
    ref_out, ref_lse = reference.removed_attention_with_lse(q, k, v, 1.0, mask)
    np.testing.assert_allclose(out, ref_out, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-12)
    assert np.isneginf(lse[1, 3]) and np.all(out[1, 3] == 0)

    def loss(q, k, v):
        out, lse = _call(impl, q, k, v, 1.0, mask)
        return jnp.sum(jnp.sin(out)) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0))

    dirty = jax.grad(loss, argnums=(0, 1, 2))(dirty_q, dirty_k, dirty_v)
    clean = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    for g, c in zip(dirty, clean):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, c, atol=1e-12)
    # the masked entries get no gradient
    assert (
        np.all(dirty[1][0, 5:] == 0) and np.all(dirty[2][1, 0] == 0) and np.all(dirty[0][1, 3] == 0)
    )


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_keys_masked_for_some_queries_only_are_inert_for_those(impl):
    """NaN/inf in a query, key or value that a per-query mask hides from some queries: the
    queries that see it get NaN (as the float64 reference), the others the answer without it;
    gradients of a loss over the others equal the clean problem's (the dense float64 formula)."""
    from tests.reference import dense_attention_with_lse

    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(2, 6, 4)), rng.normal(size=(2, 7, 4)), rng.normal(size=(2, 7, 3))
    mask = np.tril(np.ones((6, 7), bool), 1) | (rng.random((2, 6, 7)) > 0.7)
    mask[1, 2] = False  # a query that sees nothing
    mask[0, 0, 4], mask[0, 0, 5] = False, True  # query 0 sees the inf value, not the NaN key
    dq, dk, dv = q.copy(), k.copy(), v.copy()
    dk[0, 4, 1], dv[0, 5, 2], dk[1, 6, 0] = np.nan, np.inf, np.nan
    dq[0, 1, 0], dq[1, 2, 3] = np.nan, np.nan
    ref_out, ref_lse = reference.removed_attention_with_lse(dq, dk, dv, 1.0, mask)
    hit = ~np.isfinite(ref_out).all(-1)
    assert np.isnan(ref_lse).any() and (hit & np.isfinite(ref_lse)).any() and (~hit).sum() > 4
    out, lse = _call(impl, dq, dk, dv, 1.0, mask)
    reference.assert_matches_removed(out, lse, ref_out, ref_lse, 1e-12)
    assert np.all(np.isnan(np.asarray(out)[hit]))  # the whole row
    g_out = rng.normal(size=out.shape) * ~hit[..., None]
    g_lse = rng.normal(size=lse.shape) * (~hit & mask.any(-1))

    def loss(fn, q, k, v):
        out, lse = fn(q, k, v)
        return jnp.sum(out * g_out) + jnp.sum(jnp.where(g_lse != 0, lse, 0.0) * g_lse)

    ours = jax.grad(partial(loss, lambda *a: _call(impl, *a, 1.0, mask)), (0, 1, 2))(dq, dk, dv)
    dense = partial(dense_attention_with_lse, beta=1.0, mask=mask)
    ref = jax.grad(partial(loss, dense), (0, 1, 2))(q, k, v)
    for got, want in zip(ours, ref):
        np.testing.assert_allclose(got, want, atol=1e-11)


@pytest.mark.parametrize("bad", [0.0, -1.0, np.inf, np.nan])
def test_beta_must_be_finite_and_positive(bad):
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(3, 4)), rng.normal(size=(5, 4))
    with pytest.raises(ValueError, match="finite and > 0"):
        eqattn.attention(q, k, beta=bad)
    with pytest.raises(ValueError, match="finite and > 0"):
        eqattn.attention(np.stack([q, q]), k, beta=np.array([1.0, bad]))  # per batch element
    # traced: not a runtime error (see guard_beta: it could not be exported, and would abort a
    # program over several devices), a loud NaN
    for impl in ("xla", "chunked"):
        out, lse = jax.jit(lambda b: _call(impl, q, k, k, b, None))(bad)
        assert np.all(np.isnan(out)) and np.all(np.isnan(lse))
        good = jax.jit(lambda b: _call(impl, q, k, k, b, None))(0.5)
        ref = reference.removed_attention_with_lse(q, k, k, 0.5, np.ones((3, 5), bool))
        np.testing.assert_allclose(good[0], ref[0], atol=1e-12)
    # with jax_debug_nans, JAX stops at a NaN beta, and reruns a call that made NaN op by op:
    # beta is concrete there, and named
    error = FloatingPointError if np.isnan(bad) else ValueError
    with jax.debug_nans(True), pytest.raises(error, match="nan" if np.isnan(bad) else "> 0"):
        jax.jit(lambda b: _call("xla", q, k, k, b, None))(bad)
    mesh = jax.sharding.Mesh(jax.devices()[:2], ("seq",))
    for fn in (eqattn.parallel.ring_attention_with_lse, eqattn.parallel.sharded_attention_with_lse):
        out = jax.jit(lambda b: fn(k[:4], k[:4], mesh=mesh, axis="seq", beta=b))(bad)
        assert np.all(np.isnan(out[0])) and np.all(np.isnan(out[1]))


@pytest.mark.parametrize("impl", ["chunked", "auto"])
def test_log_normalizer_gradient_on_the_chunked_path(impl, monkeypatch):
    """d/dq log Z(q) = E_p[k] (the chunked backward with no values used to divide by zero)."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")  # "auto" chunks off CPU only
    rng = np.random.default_rng(1)
    q, k = rng.normal(size=(32, 2)), rng.normal(size=(64, 2))
    # "auto" chunks (16 keys) at this size
    extra = dict(tiling=eqattn.Tiling(auto_chunk_logits=64, chunk_size=16))
    extra = {"chunk_size": 16} if impl == "chunked" else extra
    g = jax.grad(lambda q: eqattn.log_normalizer(q, k, implementation=impl, **extra).sum())(q)
    s = q @ k.T
    p = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(g, (p / p.sum(-1, keepdims=True)) @ k, atol=1e-12)


def test_fixed_point_gradient_with_respect_to_a_python_float():
    """z = tanh(b z + 1): dz/db = z (1 - z^2) / (1 - b (1 - z^2)), in args and closed over."""
    f = lambda z, b: jnp.tanh(b * z + 1.0)  # noqa: E731
    tight = eqattn.Anderson(rtol=1e-13, atol=0.0)

    def closed_form(b):
        z = 0.0
        for _ in range(500):
            z = np.tanh(b * z + 1.0)
        return z * (1 - z**2) / (1 - b * (1 - z**2))

    for adjoint in (eqattn.ImplicitAdjoint(), eqattn.Unrolled()):
        # (jitted: eager calls compile op by op; the float is traced as in an eager jax.grad)
        in_args = jax.jit(
            jax.grad(
                lambda b: (
                    eqattn.fixed_point(f, jnp.zeros(()), b, solver=tight, adjoint=adjoint).value
                )
            )
        )(0.5)
        closed = jax.jit(
            jax.grad(
                lambda b: (
                    eqattn.fixed_point(
                        lambda z, _: f(z, b), jnp.zeros(()), solver=tight, adjoint=adjoint
                    ).value
                )
            )
        )(0.5)
        np.testing.assert_allclose(in_args, closed_form(0.5), rtol=1e-10)
        np.testing.assert_allclose(closed, closed_form(0.5), rtol=1e-10)


def test_nan_input_gives_nan_output_and_says_so():
    layer = eqattn.nn.ImplicitAttention(8, 2, key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (5, 8)).at[2, 3].set(jnp.nan)
    eq = eqx.filter_jit(layer.equilibrium)(x)
    assert eq.result == eqattn.RESULTS.nonfinite and not bool(eq.converged)
    assert np.all(np.isnan(eqx.filter_jit(layer)(x)))
    # the other equilibrium layers, NaN or inf in an input
    key, y = jax.random.key(0), jax.random.normal(jax.random.key(2), (7, 8))
    bad = x.at[2, 3].set(jnp.inf)
    for layer, args in (
        (eqattn.nn.DEQBlock(8, 2, key=key, inference=True), (x,)),
        (eqattn.nn.EnergyAttention(8, 2, key=key), (bad,)),
        (eqattn.nn.Hopfield(8, 8, 2, key=key), (x, y)),
        (eqattn.nn.Hopfield(8, 8, 2, key=key), (y[:5], bad)),  # in the stored patterns
    ):
        assert np.all(np.isnan(eqx.filter_jit(layer)(*args)))
    strict = eqattn.nn.ImplicitAttention(8, 2, key=jax.random.key(0), throw=True)
    with pytest.raises(eqx.EquinoxRuntimeError, match="did not converge"):
        jax.block_until_ready(eqx.filter_jit(strict)(x))


def test_broyden_does_not_diverge_below_rounding():
    """A tolerance no float64 evaluation can meet: the iterates stall near the best residual
    instead of growing (they reached 1e130 before the restart safeguard)."""
    layer = eqattn.nn.DEQBlock(16, 2, key=jax.random.key(0), dtype=jnp.float64)
    x = jax.random.normal(jax.random.key(0), (12, 16), jnp.float64)
    injection = layer.injection(x)

    def g(z):
        return layer.step(z.reshape(12, 16), injection).reshape(-1)

    solver = eqattn.Broyden(rtol=1e-17, atol=0.0, max_steps=300)
    it = jax.jit(lambda: iterate(solver, g, jnp.zeros(192), 300))()
    last = float(jnp.linalg.norm(g(it.x) - it.x))
    assert int(it.step) == 300 and float(it.best_residual) < 1e-14
    assert last < 1e3 * float(it.best_residual), last
    with pytest.raises(ValueError, match="restart_factor"):
        eqattn.Broyden(restart_factor=1.0)


# --- property-based: every case is a clear error or the float64 reference's answer -------------

DTYPES = {"float32": (np.float32, 2e-5), "float64": (np.float64, 1e-12), "bfloat16": (None, 3e-2)}


@st.composite
def problems(draw):
    batch = draw(st.sampled_from([(), (1,), (2,), (2, 1)]))
    n, m = draw(st.integers(1, 6)), draw(st.integers(1, 7))
    d, dv = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    mask_shape = draw(
        st.sampled_from(
            [None, (m,), (n, m), (1, m), (1, n, m)] + ([batch + (n, m)] if batch else [])
        )
    )
    if mask_shape is not None and len(mask_shape) > len(batch) + 2:
        mask_shape = mask_shape[1:]  # a mask may not add batch axes
    mask = None if mask_shape is None else draw(hnp.arrays(bool, mask_shape))
    beta = draw(st.sampled_from([0.5, 1.0, 3.0, 0.0, -1.0, np.inf, np.nan]))
    dtype = draw(st.sampled_from(list(DTYPES)))
    huge = draw(st.booleans())  # huge logits
    # NaN in every entry nobody may see ("unseen"), or in one query, key and value whatever the
    # mask says ("some": a key hidden from some queries only is seen by others)
    poison = draw(st.sampled_from([None, "unseen", "some"]))
    seed = draw(st.integers(0, 2**16))
    return batch, n, m, d, dv, mask, beta, dtype, huge, poison, seed


@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(problems(), st.sampled_from(["xla", "chunked"]))
def test_fuzz_attention(problem, impl):
    _fuzz_case(problem, impl)


@settings(
    max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(problems())
def test_fuzz_attention_pallas(problem):
    """The fused kernel, in Pallas interpret mode on the CPU (slow per shape: a smaller budget)."""
    _fuzz_case(problem, "pallas")


def _fuzz_case(problem, impl):
    batch, n, m, d, dv, mask, beta, dtype, huge, poison, seed = problem
    rng = np.random.default_rng(seed)
    q = rng.normal(size=batch + (n, d)) * (30.0 if huge else 1.0)
    k = rng.normal(size=batch + (m, d)) * (30.0 if huge else 1.0)
    v = rng.normal(size=batch + (m, dv))
    full = np.ones(batch + (n, m), bool) if mask is None else np.broadcast_to(mask, batch + (n, m))
    if poison == "unseen":
        k = np.where(full.any(-2)[..., None], k, np.nan)
        v = np.where(full.any(-2)[..., None], v, np.nan)
        q = np.where(full.any(-1)[..., None], q, np.nan)
    elif poison == "some":
        k, v, q = _some_poison(k, v, q, seed)
    np_dtype, atol = DTYPES[dtype]
    cast = (
        (lambda a: jnp.asarray(a, jnp.bfloat16))
        if np_dtype is None
        else (lambda a: a.astype(np_dtype))
    )
    if not (np.isfinite(beta) and beta > 0):
        with pytest.raises(ValueError, match="beta"):
            _call(impl, cast(q), cast(k), cast(v), beta, mask)
        return
    out, lse = _call(impl, cast(q), cast(k), cast(v), beta, mask)
    assert out.shape == batch + (n, dv) and lse.shape == batch + (n,)
    # the reference sees the inputs as the kernel does (rounded to its dtype)
    qr, kr, vr = (np.asarray(jnp.asarray(cast(a)), np.float64) for a in (q, k, v))
    ref_out, ref_lse = reference.removed_attention_with_lse(qr, kr, vr, beta, full)
    reference.assert_matches_removed(out, lse, ref_out, ref_lse, atol)


@settings(
    max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(problems(), st.sampled_from(["xla", "chunked"]))
def test_fuzz_attention_gradients(problem, impl):
    """float64 gradients of out and lse (random cotangents) against jax's autodiff of a dense
    formula on the clean inputs; poisoned (masked) entries get exactly zero gradient."""
    from tests.reference import dense_attention_with_lse

    batch, n, m, d, dv, mask, beta, _, huge, poison, seed = problem
    if not (np.isfinite(beta) and beta > 0):
        return  # the forward fuzz covers the errors
    rng = np.random.default_rng(seed)
    scale = 5.0 if huge else 1.0
    q, k = rng.normal(size=batch + (n, d)) * scale, rng.normal(size=batch + (m, d)) * scale
    v = rng.normal(size=batch + (m, dv))
    full = np.ones(batch + (n, m), bool) if mask is None else np.broadcast_to(mask, batch + (n, m))
    g_out, g_lse = rng.normal(size=batch + (n, dv)), rng.normal(size=batch + (n,))
    finite_rows = full.any(-1)
    if poison == "some":  # the NaN rows carry no cotangent; the rest equal the clean problem's
        if mask is None or mask.ndim < 2 or mask.shape[-2] == 1:
            return  # every query sees the same keys: NaN reaches all, gradients too (jax's way)
        dirty = _some_poison(k, v, q, seed)
        nan_rows = np.isnan(
            reference.removed_attention_with_lse(dirty[2], dirty[0], dirty[1], beta, full)[1]
        )
        g_out, g_lse = g_out * ~nan_rows[..., None], g_lse * ~nan_rows

    def loss(fn, q, k, v):
        out, lse = fn(q, k, v)
        return jnp.sum(out * g_out) + jnp.sum(jnp.where(finite_rows, lse, 0.0) * g_lse)

    ours = jax.grad(lambda *a: loss(lambda *b: _call(impl, *b, beta, mask), *a), argnums=(0, 1, 2))
    dense = jax.grad(
        lambda *a: loss(lambda *b: dense_attention_with_lse(*b, beta, full), *a), argnums=(0, 1, 2)
    )
    ref = dense(q, k, v)
    if poison == "some":
        k, v, q = dirty
    if poison == "unseen":
        seen_k, seen_q = full.any(-2)[..., None], finite_rows[..., None]
        q, k, v = (
            np.where(seen_q, q, np.nan),
            np.where(seen_k, k, np.nan),
            np.where(seen_k, v, np.inf),
        )
        ref = tuple(np.where(s, r, 0.0) for r, s in zip(ref, (seen_q, seen_k, seen_k)))
    for got, want in zip(ours(q, k, v), ref):
        np.testing.assert_allclose(got, np.nan_to_num(want), rtol=1e-9, atol=1e-9 * scale**2)
