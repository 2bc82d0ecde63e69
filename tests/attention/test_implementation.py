"""`implementation=`: the selection logic (on any machine), eqattn's wrapper around cuDNN's fused
attention (run on CPU through XLA's version of the same call), and the real cuDNN kernel on a GPU."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqattn
from eqattn._attention import _backends, _cudnn, _plan

from .. import reference

S = jax.ShapeDtypeStruct
BF16, F16, F32 = jnp.bfloat16, jnp.float16, jnp.float32


def _select(q, k, v=None, **kw):
    return eqattn.select_implementation(q, k, v, **kw)


@pytest.mark.parametrize(
    "q, k, v, kw, expected",
    [
        (S((2, 8, 16, 64), BF16), S((2, 8, 16, 64), BF16), None, {"backend": "gpu"}, "cudnn"),
        (S((16, 128), F16), S((32, 128), F16), None, {"backend": "gpu"}, "cudnn"),
        (S((16, 64), BF16), S((16, 64), BF16), None, {"backend": "cpu"}, "xla"),
        (S((16, 64), BF16), S((16, 64), BF16), None, {"backend": "tpu"}, "xla"),
        (S((16, 64), F32), S((16, 64), F32), None, {"backend": "gpu"}, "xla"),  # float32
        (S((16, 64), BF16), S((16, 64), F16), None, {"backend": "gpu"}, "xla"),  # mixed
        (S((16, 60), BF16), S((16, 60), BF16), None, {"backend": "gpu"}, "xla"),  # 8 ∤ d
        (S((16, 256), BF16), S((16, 256), BF16), None, {"backend": "gpu"}, "xla"),  # d > 128
        (S((16, 64), BF16), S((16, 64), BF16), S((16, 32), BF16), {"backend": "gpu"}, "xla"),
        (S((0, 64), BF16), S((16, 64), BF16), None, {"backend": "gpu"}, "xla"),  # no queries
        # a mask, or a log-sum-exp to return, keep eqattn's own pass
        (
            S((16, 64), BF16),
            S((16, 64), BF16),
            None,
            {"backend": "gpu", "mask": S((16, 16), bool)},
            "xla",
        ),
        (S((16, 64), BF16), S((16, 64), BF16), None, {"backend": "gpu", "need_lse": True}, "xla"),
        # long sequences: key chunks off CPU (2^26 logits), query tiles on CPU
        (S((8192, 64), F32), S((8192, 64), F32), None, {"backend": "gpu"}, "chunked"),
        (S((8192, 64), F32), S((8192, 64), F32), None, {"backend": "cpu"}, "xla"),
        (S((4096, 64), F32), S((4096, 64), F32), None, {"backend": "gpu"}, "xla"),
        (S((64, 8), F32), S((64, 8), F32), None, {"backend": "cpu", "chunk_size": 16}, "chunked"),
        # explicit choices are kept
        (
            S((16, 64), BF16),
            S((16, 64), BF16),
            None,
            {"backend": "gpu", "implementation": "xla"},
            "xla",
        ),
        (
            S((9, 4), F32),
            S((9, 4), F32),
            None,
            {"backend": "cpu", "implementation": "chunked"},
            "chunked",
        ),
        (
            S((16, 8), F16),
            S((16, 8), F16),
            None,
            {"backend": "gpu", "implementation": "cudnn"},
            "cudnn",
        ),
    ],
)
def test_selection(q, k, v, kw, expected):
    assert _select(q, k, v, **kw) == expected


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "call, match",
    [
        (lambda q: _select(q, q, backend="cpu", implementation="cudnn"), "needs an NVIDIA GPU"),
        (lambda q: _select(q, q, backend="gpu", implementation="cudnn"), "bfloat16 or float16"),
        (
            lambda q: _select(q, q, backend="gpu", implementation="cudnn", need_lse=True),
            "returns no log-sum-exp",
        ),
        (lambda q: _select(q, q, implementation="flash"), "`implementation` must be one of"),
        (lambda q: eqattn.attention(q, q, implementation="cudnn"), r"queries \(4, 8\)"),
        (lambda q: eqattn.attention_with_lse(q, q, implementation="cudnn"), "no log-sum-exp"),
        (lambda q: eqattn.log_normalizer(q, q, implementation="cudnn"), "no log-sum-exp"),
        (
            lambda q: eqattn.nn.MultiHeadAttention(2, 8, key=jax.random.key(0), implementation="x"),
            "`implementation` must be one of",
        ),
    ],
)
def test_errors(call, match):
    q = jnp.ones((4, 8), jnp.float32)
    with pytest.raises(ValueError, match=match):
        call(q)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="CPU: cudnn is not there")
def test_cpu_dispatch_never_reaches_cudnn():
    q = jnp.ones((2, 16, 64), BF16)
    hlo = jax.jit(lambda q: eqattn.attention(q, q)).lower(q).as_text()
    assert "cudnn" not in hlo.lower()


def test_auto_follows_the_platform_compiled_for():
    # "auto" picks cuDNN for a CUDA program also when it is traced on a CPU host (a model
    # exported for GPU serving), and XLA's path for the CPU program of the same function. A jax
    # without the CUDA plugin cannot build cuDNN's call: its CUDA program carries the core (the
    # compile check, with the plugin, asserts cuDNN in the H100's program too).
    import importlib.util

    from jax import export

    plugin = importlib.util.find_spec("jax_cuda12_plugin") is not None
    assert _plan.cudnn_buildable() == plugin

    q = jnp.ones((2, 16, 64), BF16)
    f = jax.jit(lambda q: eqattn.attention(q, q))
    # (only silences "no serialization-compatibility promise" for cuDNN's custom call)
    checks = [export.DisabledSafetyCheck.custom_call("__cudnn$fmhaSoftmax")]
    cuda = export.export(f, platforms=["cuda"], disabled_checks=checks)(q).mlir_module()
    cpu = export.export(f, platforms=["cpu"])(q).mlir_module()
    assert ("cudnn" in cuda.lower()) == plugin and "cudnn" not in cpu.lower()


@pytest.fixture
def fused_on_cpu(monkeypatch):
    """Run eqattn's cuDNN wrapper with `jax.nn.dot_product_attention(implementation="xla")`, so
    its layout, beta folding and masking are checked on any machine (in full float32 precision,
    also on GPUs, where float32 matmuls default to tf32)."""
    monkeypatch.setattr(_cudnn, "FUSED", "xla")
    monkeypatch.setattr(_plan, "cudnn_unsupported", lambda *a: None)
    with jax.default_matmul_precision("float32"):
        yield


def cudnn_attention(queries, keys, values, *, beta, mask):
    """The public path with cuDNN asked for (under `fused_on_cpu`: its wrapper on any machine)."""
    return eqattn.attention(queries, keys, values, beta=beta, mask=mask, implementation="cudnn")


SHAPES = [
    # (q, k, v, beta, mask)
    ((5, 8), (7, 8), (7, 8), (), None),
    ((2, 3, 6, 8), (3, 9, 8), (1, 3, 9, 8), (3,), (6, 9)),  # per-head beta, shared mask
    ((3, 1, 6, 8), (1, 2, 5, 8), (3, 2, 5, 8), (3, 2), (3, 1, 1, 5)),  # padding-style mask
    ((2, 4, 8), (2, 6, 8), (2, 6, 8), (), (2, 4, 6)),  # per-example mask
    ((2, 4, 8), (2, 6, 8), (2, 6, 8), (), (1, 4, 6)),  # a leading axis of size 1
]


@pytest.mark.parametrize("shapes", SHAPES)
def test_fused_wrapper_matches_reference(rng, fused_on_cpu, shapes):
    qs, ks, vs, bs, ms = shapes
    q, k, v = (rng.normal(size=s).astype(np.float32) for s in (qs, ks, vs))
    beta = rng.uniform(0.3, 2.0, size=bs)
    mask = None if ms is None else rng.random(ms) > 0.4
    if mask is not None:
        mask[..., 0, :] = False  # a query that may attend to nothing gets 0
    out = cudnn_attention(
        jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), beta=jnp.asarray(beta), mask=mask
    )
    ref, _ = reference.attention_with_lse(q, k, v, beta, mask)
    assert out.shape == ref.shape and out.dtype == jnp.float32
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)


def test_fused_wrapper_gradients_match_core(rng, fused_on_cpu):
    # Per-head beta (traced, so folded into the queries) and a mask with a fully masked row.
    q, k, v, c = (jnp.asarray(rng.normal(size=(2, 3, 6, 8)), jnp.float32) for _ in range(4))
    beta = jnp.asarray([0.5, 1.0, 2.0], jnp.float32)
    mask = jnp.asarray(rng.random((6, 6)) > 0.3).at[2].set(False)

    def loss(fn, q, k, v, beta):
        return jnp.sum(fn(q, k, v, beta=beta, mask=mask) * c)

    wrapped = jax.grad(lambda *a: loss(cudnn_attention, *a), argnums=(0, 1, 2, 3))
    core = jax.grad(lambda *a: loss(eqattn.attention, *a), argnums=(0, 1, 2, 3))
    for a, b in zip(wrapped(q, k, v, beta), core(q, k, v, beta)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_mha_passes_implementation(fused_on_cpu, monkeypatch, getkey):
    calls = []
    monkeypatch.setattr(_plan, "cudnn_unsupported", lambda *a: calls.append(a) or None)
    key = getkey()  # the same parameters under both implementations
    mha = eqattn.nn.MultiHeadAttention(2, 16, key=key, implementation="cudnn")
    xla = eqattn.nn.MultiHeadAttention(2, 16, key=key, implementation="xla")
    x = jax.random.normal(getkey(), (5, 16))
    np.testing.assert_allclose(mha(x, x), xla(x, x), rtol=1e-5, atol=1e-6)
    assert calls  # the cuDNN route was taken


def _opaque(name, fn):
    """A primitive computing `fn` (arrays in, a tuple of arrays out) that jax cannot
    differentiate, as cuDNN's forward and backward calls."""
    from jax.core import ShapedArray
    from jax.extend.core import Primitive
    from jax.interpreters import mlir

    prim = Primitive(name)
    prim.multiple_results = True
    prim.def_impl(fn)
    prim.def_abstract_eval(
        lambda *a, **kw: [
            ShapedArray(s.shape, s.dtype) for s in jax.eval_shape(partial(fn, **kw), *a)
        ]
    )
    mlir.register_lowering(prim, mlir.lower_fun(fn, multiple_results=True))
    return prim


_XLA_DPA = partial(jax.nn.dot_product_attention, implementation="xla")  # (before any patch)


def _dpa(q, k, v, mask, *, scale, causal):
    q, k, v = (x[:, :, None] for x in (q, k, v))
    return _XLA_DPA(q, k, v, mask=mask[:, None], scale=scale, is_causal=causal)[:, :, 0]


_FAKE_FWD = _opaque("opaque_forward_call", lambda *a, **kw: (_dpa(*a, **kw),))
_FAKE_BWD = _opaque(
    "opaque_backward_call",
    lambda q, k, v, m, g, **kw: jax.vjp(lambda *x: _dpa(*x, m, **kw), q, k, v)[1](g),
)


@partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _fake_cudnn(q, k, v, mask, scale, causal):
    return _FAKE_FWD.bind(q, k, v, mask, scale=scale, causal=causal)[0]


def _fake_cudnn_fwd(q, k, v, mask, scale, causal):  # as jax's: the forward call, bound
    return _FAKE_FWD.bind(q, k, v, mask, scale=scale, causal=causal)[0], (q, k, v, mask)


def _fake_cudnn_bwd(scale, causal, res, g):
    return (*_FAKE_BWD.bind(*res, g, scale=scale, causal=causal), None)


_fake_cudnn.defvjp(_fake_cudnn_fwd, _fake_cudnn_bwd)


def test_jacobian_penalty_leaves_cudnn_out(rng, fused_on_cpu, monkeypatch):
    """cuDNN's call (here a stand-in with its differentiation structure: a custom VJP whose
    forward and backward rules are calls jax cannot differentiate) differentiates once. Where
    `"auto"` gives it attention, a Jacobian penalty's vector-Jacobian products (traced to be
    differentiated again) take eqattn's core: the loss's gradient matches the core's, and
    `implementation="cudnn"` there is refused early, naming why."""

    def fused(q, k, v, mask=None, *, scale, is_causal, implementation):  # BTNH, one head
        q, k, v = (x[:, :, 0] for x in (q, k, v))
        shape = (q.shape[0], q.shape[1], k.shape[1])
        mask = jnp.ones(shape, bool) if mask is None else jnp.broadcast_to(mask[:, 0], shape)
        return _fake_cudnn(q, k, v, mask, scale, is_causal)[:, :, None]

    monkeypatch.setattr(jax.nn, "dot_product_attention", fused)
    monkeypatch.setattr(_backends, "cudnn_buildable", lambda: False)  # no CUDA program beside
    z, w = (jnp.asarray(rng.normal(size=s), F32) for s in ((6, 8), (8, 8)))
    assert eqattn.select_implementation(z, z) == "cudnn"  # "auto", first order: cuDNN

    def step(implementation):
        return lambda z, w: jnp.tanh(eqattn.attention(z @ w, z, z, implementation=implementation))

    def loss(implementation, w):
        fn = step(implementation)
        penalty = eqattn.jacobian_frobenius(fn, z, w, key=jax.random.key(0), samples=2)
        return penalty + jnp.sum(fn(z, w) ** 2)

    grad_of = jax.grad(partial(loss, "xla"))(w)
    np.testing.assert_allclose(jax.grad(partial(loss, "auto"))(w), grad_of, rtol=1e-5, atol=1e-6)

    def twice(w):  # the same second derivative, traced without the penalty: refused by jax
        return jnp.sum(jax.grad(lambda w: jnp.sum(step("auto")(z, w)))(w) ** 2)

    with pytest.raises(NotImplementedError, match="opaque_forward_call"):
        jax.grad(twice)(w)
    with pytest.raises(ValueError, match="differentiates cuDNN's call once"):
        jax.grad(partial(loss, "cudnn"))(w)


# --- on a GPU: the real kernel -----------------------------------------------------------------


def gpu(test):
    """A test that runs on a GPU only: the GPU command's first step selects these by marker."""
    on_gpu = pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU with cuDNN")
    return pytest.mark.accelerator(on_gpu(test))


@gpu
@pytest.mark.parametrize("dtype", [BF16, F16])
def test_cudnn_matches_reference(rng, dtype):
    q, k, v = (rng.normal(size=(2, 4, 256, 64)).astype(np.float32) for _ in range(3))
    beta = np.asarray([0.05, 0.1, 0.125, 0.2])
    cast = [jnp.asarray(x, dtype) for x in (q, k, v)]
    assert eqattn.select_implementation(*cast) == "cudnn"
    out = eqattn.attention(*cast, beta=jnp.asarray(beta))
    ref, _ = reference.attention_with_lse(*(np.asarray(x, np.float64) for x in cast), beta)
    assert out.dtype == dtype
    err = np.linalg.norm(np.asarray(out, np.float64) - ref) / np.linalg.norm(ref)
    assert err < 1e-2, err
    hlo = jax.jit(lambda *a: eqattn.attention(*a, beta=0.125)).lower(*cast).as_text()
    assert "cudnn" in hlo.lower()


@gpu
def test_cudnn_gradients_and_mask_match_xla(rng):
    q, k, v, c = (jnp.asarray(rng.normal(size=(2, 4, 128, 64)), BF16) for _ in range(4))
    mask = jnp.asarray(rng.random((128, 128)) > 0.3).at[5].set(False)

    def grads(implementation):
        def loss(q, k, v):
            out = eqattn.attention(q, k, v, beta=0.125, mask=mask, implementation=implementation)
            return jnp.sum(out.astype(F32) * c.astype(F32))

        return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    for a, b in zip(grads("cudnn"), grads("xla")):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.all(np.isfinite(a))
        assert np.linalg.norm(a - b) / np.linalg.norm(b) < 2e-2
