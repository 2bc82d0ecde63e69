"""`causal=True`: every implementation against float64 references with the causal mask written
out densely; no `n x m` array in the program; about half the work; non-finite entries hidden by
causality stay inert."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqattn
import eqattn.nn as enn
from eqattn import _attention as engine

from .. import reference

LEAF = eqattn.Tiling(causal_leaf=8)  # several levels of halving at test sizes
IMPLEMENTATIONS = [  # "auto" is "xla" on a CPU; the operators' test runs it
    dict(implementation="xla"),
    dict(implementation="chunked", chunk_size=4),
    dict(implementation="pallas"),
]


def _tril(n, m):
    """Query i sees key j <= i + m - n (bottom right), written with numpy's own triangle."""
    return np.tril(np.ones((n, m), bool), k=m - n)


def _inputs(rng, batch, n, m, d=4, dv=3):
    q = rng.normal(size=(*batch, n, d))
    k = rng.normal(size=(*batch, m, d))
    v = rng.normal(size=(*batch, m, dv))
    return q, k, v


# n = m on the XLA core only (with each mask): the square part is also the whole of n < m and
# n > m's work; one query (cached generation's call) sees every key. The masks of the other
# cases are spread as a Latin square (case j of implementation i takes mask (i + j) mod 3):
# every pair of implementation and shape, implementation and mask, shape and mask is run, in
# under half the full product's compiles.
_SHAPES = [(20, 45), (45, 20), (1, 45)]
_MASKS = [None, "padding", "per-query"]
_CASES = [(IMPLEMENTATIONS[0], 37, 37, mask) for mask in _MASKS] + [
    (kw, n, m, _MASKS[(i + j) % 3])
    for i, kw in enumerate(IMPLEMENTATIONS)
    for j, (n, m) in enumerate(_SHAPES)
]


@pytest.mark.parametrize(
    "kw, n, m, masking",
    _CASES,
    ids=[f"{c[0]['implementation']}-{c[1]}-{c[2]}-{c[3]}" for c in _CASES],
)
def test_causal_matches_the_dense_reference(rng, kw, n, m, masking):
    q, k, v = _inputs(rng, (2, 3), n, m)
    beta = rng.uniform(0.5, 2.0, size=(3,))  # per head
    mask = {
        None: None,
        "padding": rng.random((2, 1, 1, m)) > 0.3,
        "per-query": rng.random((n, m)) > 0.3,
    }[masking]
    full = _tril(n, m) if mask is None else _tril(n, m) & mask

    @jax.jit
    def fn(q, k, v, beta):
        return eqattn.attention_with_lse(
            q, k, v, beta=beta, mask=mask, causal=True, tiling=LEAF, **kw
        )

    out, lse = fn(q, k, v, beta)
    ref_out, ref_lse = reference.attention_with_lse(q, k, v, beta, full)
    np.testing.assert_allclose(out, ref_out, atol=1e-10)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    seen = np.isfinite(ref_lse)
    np.testing.assert_allclose(np.asarray(lse)[seen], ref_lse[seen], atol=1e-10)
    g_out, g_lse = rng.normal(size=out.shape), rng.normal(size=lse.shape)
    grads = jax.vjp(fn, q, k, v, beta)[1]((g_out, g_lse))
    ref = jax.vjp(lambda *a: reference.dense_attention_with_lse(*a, full), q, k, v, beta)[1](
        (g_out, g_lse)
    )
    for name, g, r in zip("q k v beta".split(), grads, ref):
        np.testing.assert_allclose(g, r, atol=1e-9, err_msg=name)


def test_operators_and_multihead_attention_take_causal(rng, getkey):
    q, k, v = _inputs(rng, (2,), 12, 12)
    tril = _tril(12, 12)
    np.testing.assert_allclose(
        eqattn.attention(q, k, v, causal=True), eqattn.attention(q, k, v, mask=tril), atol=1e-12
    )
    np.testing.assert_allclose(
        eqattn.log_normalizer(q, k, causal=True),
        reference.attention_with_lse(q, k, mask=tril)[1],
        atol=1e-12,
    )
    # one token: a single new query sees every key; of many queries only the last sees one key
    for n, m in ((1, 9), (9, 1)):
        out, lse = eqattn.attention_with_lse(q[:, :n], k[:, :m], v[:, :m], causal=True)
        ref = reference.attention_with_lse(q[:, :n], k[:, :m], v[:, :m], mask=_tril(n, m))
        np.testing.assert_allclose(out, ref[0], atol=1e-12)
        np.testing.assert_array_equal(lse, ref[1]) if n > m else None
    weights = eqattn.attention_weights(q, k, causal=True)
    assert np.all(np.asarray(weights)[:, ~tril] == 0)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-12)
    key = getkey()
    mha = enn.MultiHeadAttention(2, 8, key=key, causal=True)
    plain = enn.MultiHeadAttention(2, 8, key=key)
    x = jnp.asarray(rng.normal(size=(12, 8)))
    np.testing.assert_allclose(mha(x, x), plain(x, x, mask=tril), atol=1e-12)
    np.testing.assert_allclose(mha.association(x, x), plain.association(x, x, mask=tril))
    # a later token moves no earlier output
    y = x.at[7].set(100.0)
    np.testing.assert_allclose(mha(y, y)[:7], mha(x, x)[:7], atol=1e-12)


@pytest.mark.bad_input
def test_causal_argument_is_checked():
    x = jnp.ones((4, 2))
    with pytest.raises(TypeError, match="`causal` must be True or False"):
        eqattn.attention(x, x, causal=1)
    with pytest.raises(TypeError, match="`causal` must be True or False"):
        enn.MultiHeadAttention(1, 2, key=jax.random.key(0), causal="yes")
    spec = jax.ShapeDtypeStruct((4, 128, 64), jnp.bfloat16)
    shorter = jax.ShapeDtypeStruct((4, 100, 64), jnp.bfloat16)
    assert eqattn.select_implementation(spec, spec, backend="gpu", causal=True) == "cudnn"
    assert eqattn.select_implementation(shorter, spec, backend="gpu", causal=True) == "xla"
    with pytest.raises(ValueError, match="bottom right"):
        eqattn.select_implementation(
            shorter, spec, backend="gpu", causal=True, implementation="cudnn"
        )


@pytest.mark.parametrize("implementation", ["xla", "chunked"])
def test_no_n_by_m_array(implementation):
    """At n = m = 4096 no intermediate of the gradient holds batch * n * m / 2 entries or more
    (the largest block below the diagonal has a quarter of them)."""
    n = 4096
    q = jax.ShapeDtypeStruct((2, n, 16), jnp.float32)

    def loss(q, k, v):
        out, lse = eqattn.attention_with_lse(q, k, v, causal=True, implementation=implementation)
        return out.sum() + lse.sum()

    sizes = []

    def visit(jaxpr):
        for eqn in jaxpr.eqns:
            sizes.extend(
                int(np.prod(v.aval.shape)) for v in eqn.outvars if hasattr(v.aval, "shape")
            )
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                visit(sub)

    visit(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, q, q).jaxpr)
    assert max(sizes) < 2 * n * n // 2, max(sizes)


@pytest.mark.parametrize("n, m", [(4096, 4096), (1000, 3000), (3000, 1000)])
def test_blocks_above_the_diagonal_are_not_computed(n, m):
    """The blocks the backend is given cover every visible (query, key) pair and, beyond them,
    at most the leaves' triangles and padding: about half of n x m for n = m."""
    area = []

    class Recording(engine.XlaBackend):
        def forward(self, q, k, v, beta, mask):
            area.append(q.shape[0] * q.shape[1] * k.shape[1])
            return super().forward(q, k, v, beta, mask)

    leaf = 512
    q, k = (
        jax.ShapeDtypeStruct((1, n, 8), jnp.float32),
        jax.ShapeDtypeStruct((1, m, 8), jnp.float32),
    )
    beta = jax.ShapeDtypeStruct((1,), jnp.float32)
    jax.eval_shape(
        lambda q, k, b: engine._causal.forward(q, k, k, b, None, Recording(), leaf), q, k, beta
    )
    visible = int(_tril(n, m).sum())
    s = min(n, m)
    assert visible <= sum(area) <= visible + (s + 8 * leaf) * leaf, (sum(area), visible)
    if n == m:
        assert sum(area) <= 0.57 * n * m


@pytest.mark.parametrize("kw", IMPLEMENTATIONS, ids=lambda kw: kw["implementation"])
def test_hidden_non_finite_entries_stay_inert(rng, kw):
    """A NaN key or an inf value that causality hides from a query reaches neither its output nor
    the gradients; the queries that see it get NaN."""
    q, k, v = _inputs(rng, (), 30, 40)
    k[25] = np.nan  # seen by queries i >= 15 (j <= i + 10)
    v[33] = np.inf  # seen by queries i >= 23
    out, lse = eqattn.attention_with_lse(q, k, v, causal=True, tiling=LEAF, **kw)
    assert np.all(np.isfinite(out[:15])) and np.all(np.isfinite(lse[:15]))
    assert np.all(np.isnan(lse[15:])) and np.all(np.isnan(out[15:]))
    clean = eqattn.attention_with_lse(q[:15], k[:25], v[:25], causal=True, **kw)
    np.testing.assert_allclose(out[:15], clean[0], atol=1e-12)

    def loss(q, k, v):
        return eqattn.attention(q, k, v, causal=True, tiling=LEAF, **kw)[:15].sum()

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    assert all(np.all(np.isfinite(g)) for g in grads), kw


# --- on a GPU: the compiled kernel and cuDNN ------------------------------------------------------


def gpu(test):
    """A test that runs on a GPU only: the GPU command's first step selects these by marker."""
    on_gpu = pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
    return pytest.mark.accelerator(on_gpu(test))


@gpu
@pytest.mark.parametrize("n, m", [(1000, 1000), (700, 1200)])
@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 2e-3), (jnp.bfloat16, 2e-2)])
def test_gpu_causal_matches_reference(rng, n, m, dtype, tol):
    """The fused kernel (and, for n = m in bf16, cuDNN) under `causal=True`, compiled, against
    float64 references: outputs, log-sum-exp and all four gradients."""
    q, k, v = (jnp.asarray(x, dtype) for x in _inputs(rng, (2, 4), n, m, d=64, dv=64))
    beta = jnp.asarray(rng.uniform(0.5, 1.5, size=(4,)) / 8, jnp.float32)
    tril = _tril(n, m)
    impls = ["pallas"] + (["cudnn"] if n == m and dtype == jnp.bfloat16 else [])
    args64 = [np.asarray(x, np.float64) for x in (q, k, v, beta)]
    ref_out, ref_lse = reference.attention_with_lse(*args64, tril)
    for impl in impls:
        fn = jax.jit(
            lambda q, k, v, beta: (
                eqattn.attention_with_lse(q, k, v, beta=beta, causal=True, implementation=impl)
                if impl == "pallas"
                else (eqattn.attention(q, k, v, beta=beta, causal=True, implementation=impl), None)
            )
        )
        out, lse = fn(q, k, v, beta)
        err = np.linalg.norm(np.asarray(out, np.float64) - ref_out) / np.linalg.norm(ref_out)
        assert err < tol, (impl, err)
        if lse is not None:
            seen = np.isfinite(ref_lse)
            np.testing.assert_array_equal(np.isfinite(np.asarray(lse)), seen)
            np.testing.assert_allclose(
                np.asarray(lse, np.float64)[seen], ref_lse[seen], atol=4 * tol
            )
        g_out = rng.normal(size=out.shape)
        grads = jax.vjp(lambda *a: fn(*a)[0], q, k, v, beta)[1](jnp.asarray(g_out, dtype))
        ref = jax.vjp(lambda *a: reference.dense_attention_with_lse(*a, tril)[0], *args64)[1](g_out)
        for name, g, r in zip("q k v beta".split(), grads, ref):
            err = np.linalg.norm(np.asarray(g, np.float64) - r) / np.linalg.norm(r)
            assert err < 4 * tol, (impl, name, err)
