"""`implementation="pallas"`: eqattn's fused kernel.

On CPU the kernel runs in Pallas interpret mode: outputs, log-sum-exp and gradients (cotangents on
both outputs) against float64 references; masks with fully masked rows, ragged sizes, d != dv,
one token, huge logits, bf16/fp16; the TPU kernels, interpreted, as well. Lowering for CUDA (Triton)
and TPU (Mosaic) is checked with `jax.export` from this host. On a GPU, the compiled kernel against
the float64 reference.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export
from jax.test_util import check_grads

import eqattn
from eqattn._attention._pallas import _attention as kernel, _mosaic, _triton

from .. import reference

PALLAS = {"implementation": "pallas"}
# Blocks of 16: the loops over key and query blocks, and the padding of ragged sizes, all run at
# the small sizes interpret mode can afford.
SMALL = kernel.Config(triton=_triton.Blocks.uniform(16, 16))
# The TPU (Mosaic) kernels, interpreted on CPU, with blocks of 16.
SMALL_TPU = kernel.Config(mosaic=_mosaic.Blocks(16, 16), interpret="mosaic")
VARIANTS = pytest.mark.parametrize("config", [SMALL, SMALL_TPU], ids=["triton", "mosaic"])


def _inputs(rng, qs, ks, vs, bs, ms, dtype=np.float64, scale=1.0):
    q = (rng.normal(size=qs) * scale).astype(dtype)
    k = (rng.normal(size=ks) * scale).astype(dtype)
    v = rng.normal(size=vs).astype(dtype)
    beta = rng.uniform(0.3, 2.0, size=bs)
    mask = None if ms is None else rng.random(ms) > 0.3
    return q, k, v, beta, mask


def _core(q, k, v, beta, mask, config=SMALL):
    """The kernel on flattened inputs `[B, n, d]` with small blocks."""
    return kernel.attention_core(q, k, v, beta, mask, config)


def _assert_lse(lse, ref, tol):
    lse = np.asarray(lse, np.float64)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref))
    finite = np.isfinite(ref)
    np.testing.assert_allclose(lse[finite], ref[finite], rtol=tol, atol=tol)


# --- through the public API (default blocks) ---------------------------------------------------

SHAPES = [
    # (q, k, v, beta, mask)
    ((5, 3), (7, 3), (7, 4), (), None),
    ((2, 3, 6, 8), (3, 9, 8), (1, 3, 9, 5), (3,), (6, 9)),  # per-head beta, shared mask
    ((3, 1, 6, 4), (1, 2, 5, 4), (3, 2, 5, 4), (3, 2), (3, 1, 1, 5)),  # padding-style mask
    ((1, 3), (1, 3), (1, 2), (), None),  # one query, one key
    ((2, 70, 5), (2, 50, 5), (2, 50, 3), (2,), (2, 70, 50)),  # per-example mask
]


@pytest.mark.parametrize("shapes", SHAPES)
def test_matches_reference(rng, shapes):
    q, k, v, beta, mask = _inputs(rng, *shapes)
    if mask is not None:
        mask[..., 0, :] = False  # a query with no key
    out, lse = eqattn.attention_with_lse(q, k, v, beta=beta, mask=mask, **PALLAS)
    ref_out, ref_lse = reference.attention_with_lse(q, k, v, beta, mask)
    assert out.shape == ref_out.shape and lse.shape == ref_lse.shape
    assert out.dtype == jnp.float64 and lse.dtype == jnp.float64
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-12)
    _assert_lse(lse, ref_lse, 1e-12)


def test_attention_and_log_normalizer(rng):
    q, k, v, beta, mask = _inputs(rng, (2, 20, 8), (2, 30, 8), (2, 30, 8), (2,), (20, 30))
    ref_out, ref_lse = reference.attention_with_lse(q, k, None, beta, mask)
    out = eqattn.attention(q, k, beta=beta, mask=mask, **PALLAS)
    lse = eqattn.log_normalizer(q, k, beta=beta, mask=mask, **PALLAS)
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-12)
    _assert_lse(lse, ref_lse, 1e-12)


# --- the kernel itself, small blocks ------------------------------------------------------------

KERNEL_SHAPES = [
    # (B, n, m, d, dv, mask shape): ragged n and m, d != dv, every mask layout
    (2, 37, 50, 5, 3, None),
    (3, 40, 33, 8, 12, (3, 40, 33)),  # per example and query
    (2, 33, 70, 4, 4, (1, 33, 70)),  # shared by the batch
    (2, 20, 45, 6, 2, (2, 1, 45)),  # key padding, per example
    (1, 16, 16, 16, 16, (1, 1, 16)),  # exactly one block
    (2, 19, 23, 3, 0, (2, 19, 23)),  # no values: the log-sum-exp only
]


def _kernel_inputs(rng, B, n, m, d, dv, ms, dtype=np.float64, scale=1.0):
    q, k, v, beta, mask = _inputs(rng, (B, n, d), (B, m, d), (B, m, dv), (B,), ms, dtype, scale)
    if mask is not None and ms[1] != 1:
        mask[..., 0, :] = False  # the first query sees nothing
        mask[..., 1, :] = True
    elif mask is not None and ms[0] != 1:
        mask[0] = False  # one row for every query: the first batch element sees nothing
    return q, k, v, beta, mask


@VARIANTS
@pytest.mark.parametrize("shapes", KERNEL_SHAPES)
def test_kernel_matches_reference(rng, shapes, config):
    q, k, v, beta, mask = _kernel_inputs(rng, *shapes)
    out, lse = _core(q, k, v, beta, mask, config)
    ref_out, ref_lse = reference.attention_with_lse(q, k, v, beta, mask)
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-12)
    _assert_lse(lse, ref_lse, 1e-12)


@VARIANTS
@pytest.mark.parametrize("shapes", KERNEL_SHAPES)
def test_kernel_gradients_match_reference(rng, shapes, config):
    # Random cotangents on out and on lse; the reference is jax's autodiff of the dense float64
    # formula, which shares nothing with the kernel's hand-written backward.
    q, k, v, beta, mask = _kernel_inputs(rng, *shapes)
    B, n, m, d, dv, _ = shapes
    g_out, g_lse = rng.normal(size=(B, n, dv)), rng.normal(size=(B, n))

    def pull(fn):
        (out, lse), vjp = jax.vjp(fn, q, k, v, beta)
        return out, lse, vjp((g_out, g_lse))

    *_, grads = pull(jax.jit(lambda *a: _core(*a, mask, config)))
    *_, ref = pull(lambda *a: reference.dense_attention_with_lse(*a, mask))
    for name, g, r in zip(("q", "k", "v", "beta"), grads, ref):
        assert g.shape == r.shape, name
        np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-10, err_msg=name)
    if mask is not None:  # a query with no key gets no gradient, whatever its lse cotangent
        none = np.broadcast_to(~mask.any(-1), (B, n))
        assert np.all(np.asarray(grads[0])[none] == 0)


def test_tpu_row_vectors_span_several_squares_of_lanes(rng):
    """The TPU kernels keep per-row vectors lane-dense in memory (`[B, 1, N]`) and repeated
    along 128 lanes inside a kernel: with blocks of 256 queries (two squares of 128 rows) and
    two query blocks, every row's log-sum-exp, output and gradients against float64."""
    config = kernel.Config(mosaic=_mosaic.Blocks(256, 128), interpret="mosaic")
    q, k, v, beta, mask = _kernel_inputs(rng, 2, 300, 200, 8, 4, (2, 300, 200))
    g_out, g_lse = rng.normal(size=(2, 300, 4)), rng.normal(size=(2, 300))

    def pull(fn):
        (out, lse), vjp = jax.vjp(fn, q, k, v, beta)
        return out, lse, vjp((g_out, g_lse))

    *kernel_out, grads = pull(jax.jit(lambda *a: _core(*a, mask, config)))
    *ref_out, ref = pull(lambda *a: reference.dense_attention_with_lse(*a, mask))
    np.testing.assert_allclose(kernel_out[0], ref_out[0], rtol=1e-12, atol=1e-12)
    _assert_lse(kernel_out[1], np.asarray(ref_out[1]), 1e-12)
    for name, g, r in zip(("q", "k", "v", "beta"), grads, ref):
        np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-10, err_msg=name)


def test_kernel_gradients_match_finite_differences(rng):
    q, k, v, beta, mask = _kernel_inputs(rng, 2, 20, 18, 4, 3, (2, 20, 18))
    mask[..., 0, :] = True  # every lse finite: the loss below is smooth
    c, w = rng.normal(size=(2, 20, 3)), rng.normal(size=(2, 20))

    def loss(q, k, v, beta):
        out, lse = _core(q, k, v, beta, mask)
        return jnp.sum(out * c) + jnp.sum(jnp.tanh(lse) * w)

    check_grads(loss, (q, k, v, beta), order=1, modes=["rev"], atol=1e-6, rtol=1e-6, eps=1e-5)


def test_fully_masked_rows_and_batch_elements(rng):
    q, k, v, beta, mask = _kernel_inputs(rng, 2, 24, 20, 4, 3, (2, 24, 20))
    mask[1] = False  # a whole batch element sees nothing

    def loss(q, k, v, beta):
        out, lse = _core(q, k, v, beta, mask)
        return jnp.sum(out**2) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0))

    out, lse = _core(q, k, v, beta, mask)
    assert np.all(np.isneginf(lse[0, 0])) and np.all(np.isneginf(lse[1]))
    assert np.all(out[0, 0] == 0) and np.all(out[1] == 0)
    assert np.all(np.isfinite(lse[0, 1:]))
    grads = jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, beta)
    assert all(np.all(np.isfinite(g)) for g in grads)
    assert np.all(grads[0][0, 0] == 0) and np.all(grads[0][1] == 0)
    assert np.all(grads[1][1] == 0) and np.all(grads[2][1] == 0) and grads[3][1] == 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_huge_logits(rng, dtype):
    # logits around 1e4: a naive exp overflows; the running maximum does not.
    q, k, v, beta, _ = _kernel_inputs(rng, 2, 20, 40, 4, 3, None, dtype, scale=50.0)
    assert np.abs(np.einsum("bnd,bmd->bnm", q, k) * beta[:, None, None]).max() > 1e4
    out, lse = _core(q, k, v, beta.astype(dtype), None)
    ref_out, ref_lse = reference.attention_with_lse(q, k, v, beta)
    tol = 1e-12 if dtype == np.float64 else 2e-4
    np.testing.assert_allclose(out, ref_out, rtol=tol, atol=tol)
    np.testing.assert_allclose(lse, ref_lse, rtol=tol)
    g = jax.grad(lambda q: jnp.sum(_core(q, k, v, beta.astype(dtype), None)[1]))(q)
    assert np.all(np.isfinite(g))


@VARIANTS
@pytest.mark.parametrize("dtype, tol", [(jnp.bfloat16, 2e-2), (jnp.float16, 3e-3)])
def test_low_precision(rng, dtype, tol, config):
    # Compared with float64 on the same (rounded) inputs. The kernel rounds the weights to the
    # inputs' dtype before each matmul with the values (as FlashAttention does): errors of the
    # order of that dtype's epsilon, relative to the whole output.
    q, k, v, beta, mask = _kernel_inputs(rng, 2, 40, 36, 8, 8, (2, 40, 36), scale=2.0)
    q, k, v = (jnp.asarray(x, dtype) for x in (q, k, v))
    beta = jnp.asarray(beta, jnp.float32)
    out, lse = _core(q, k, v, beta, mask, config)
    assert out.dtype == dtype and lse.dtype == dtype
    q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
    ref_out, ref_lse = reference.attention_with_lse(q64, k64, v64, np.asarray(beta), mask)
    assert np.linalg.norm(np.asarray(out, np.float64) - ref_out) < tol * np.linalg.norm(ref_out)
    _assert_lse(lse, ref_lse, 4 * tol)

    g_out = np.asarray(rng.normal(size=out.shape), np.float64)
    g_lse = np.asarray(rng.normal(size=lse.shape), np.float64)
    _, vjp = jax.vjp(lambda *a: _core(*a, mask, config), q, k, v, beta)
    grads = vjp((jnp.asarray(g_out, dtype), jnp.asarray(g_lse, dtype)))
    _, ref_vjp = jax.vjp(
        lambda *a: reference.dense_attention_with_lse(*a, mask), q64, k64, v64, np.asarray(beta)
    )
    for name, g, r in zip("q k v beta".split(), grads, ref_vjp((g_out, g_lse))):
        assert g.dtype == (jnp.float32 if name == "beta" else dtype), name
        err = np.linalg.norm(np.asarray(g, np.float64) - r) / np.linalg.norm(r)
        assert err < 4 * tol, (name, err)


def test_vmap_and_large_batch_grid(rng, monkeypatch):
    # Under vmap (as the layers run it) the kernel gains a grid axis; with a batch too large for
    # Triton's minor grid axis the grid is transposed. Both agree with the reference.
    q, k, v, beta, mask = _kernel_inputs(rng, 3, 20, 24, 4, 4, (3, 20, 24))
    ref_out, ref_lse = reference.attention_with_lse(q, k, v, beta, mask)
    vmapped = jax.vmap(lambda *a: _core(*(x[None] for x in a)))(q, k, v, beta, mask)
    monkeypatch.setattr(_triton, "_MAX_MINOR_GRID", 2)
    transposed = _core(q, k, v, beta, mask)
    for out, lse in (vmapped, transposed):
        np.testing.assert_allclose(np.reshape(out, ref_out.shape), ref_out, rtol=1e-12, atol=1e-12)
        _assert_lse(np.reshape(lse, ref_lse.shape), ref_lse, 1e-12)
    g = jax.grad(lambda q: jnp.sum(_core(q, k, v, beta, mask)[0] ** 2))(q)
    dense = lambda q: reference.dense_attention_with_lse(q, k, v, beta, mask)[0]  # noqa: E731
    g_ref = jax.grad(lambda q: jnp.sum(dense(q) ** 2))(q)  # autodiff of a dense formula
    np.testing.assert_allclose(np.reshape(g, g_ref.shape), g_ref, rtol=1e-11, atol=1e-12)


def test_multihead_attention_layer(getkey):
    x = jax.random.normal(getkey(), (12, 16), jnp.float32)
    key = getkey()
    layers = [
        eqattn.nn.MultiHeadAttention(2, 16, key=key, implementation=impl)
        for impl in ("pallas", "xla")
    ]
    with jax.default_matmul_precision("float32"):
        a, b = (layer(x, x) for layer in layers)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@VARIANTS
def test_second_order_matches_the_dense_reference(rng, config):
    """Reverse over reverse (a Jacobian penalty's pattern): the gradient of a function of the
    kernel's gradient, with a fully masked query, against jax's autodiff of the dense float64
    formula, which shares nothing with the kernels or their XLA second-order terms."""
    q, k, v, beta, mask = _kernel_inputs(rng, 2, 20, 18, 4, 3, (2, 20, 18))
    w = [rng.normal(size=x.shape) for x in (q, k, v, beta)]

    def penalty(attend):
        def loss(q, k, v, beta):
            out, lse = attend(q, k, v, beta)
            return jnp.sum(out**2) + jnp.sum(jnp.sin(jnp.where(jnp.isfinite(lse), lse, 0.0)))

        def fn(q, k, v, beta):
            grads = jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, beta)
            return sum(jnp.sum(jnp.cos(g) * x) for g, x in zip(grads, w))

        return jax.grad(fn, argnums=(0, 1, 2, 3))(q, k, v, beta)

    got = penalty(jax.jit(lambda *a: _core(*a, mask, config)))
    ref = penalty(lambda *a: reference.dense_attention_with_lse(*a, mask))
    for name, g, r in zip("q k v beta".split(), got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-9, atol=1e-9, err_msg=name)


# --- selection and errors -----------------------------------------------------------------------

S = jax.ShapeDtypeStruct


@pytest.mark.parametrize(
    "q, k, v, kw, match",
    [
        (S((4, 8), jnp.float32), S((4, 8), jnp.float32), None, {"backend": "metal"}, "backend is"),
        (S((4, 8), jnp.float16), S((4, 8), jnp.float16), None, {"backend": "tpu"}, "float16"),
        (S((4, 300), jnp.bfloat16), S((4, 300), jnp.bfloat16), None, {}, "d, dv <= 256"),
        (S((4, 8), jnp.float32), S((4, 8), jnp.float32), S((4, 512), jnp.float32), {}, "dv = 512"),
        (S((4, 8), jnp.float64), S((4, 8), jnp.float64), None, {"backend": "gpu"}, "float64"),
    ],
)
def test_selection_errors(q, k, v, kw, match):
    with pytest.raises(ValueError, match=f"implementation='pallas'.*{match}"):
        eqattn.select_implementation(q, k, v, implementation="pallas", **kw)


def test_selection():
    q = S((2, 4096, 64), jnp.bfloat16)
    for backend in ("cpu", "gpu", "tpu"):
        for need_lse in (False, True):
            choice = eqattn.select_implementation(
                q, q, implementation="pallas", backend=backend, need_lse=need_lse
            )
            assert choice == "pallas"
    # "auto" does not pick the kernel before GPU benchmarks say where it wins
    assert eqattn.select_implementation(q, q, backend="gpu", need_lse=True) == "xla"


# --- lowering for CUDA (Triton) and TPU (Mosaic) from this host --------------------------------

_CUSTOM_CALLS = {"cuda": "__gpu$xla.gpu.triton", "tpu": "tpu_custom_call"}


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
@pytest.mark.parametrize(
    "dtype, B, n, m, d, dv, mask",
    [
        (jnp.bfloat16, 8, 4096, 4096, 64, 64, None),
        (jnp.float32, 4, 1000, 777, 128, 96, (4, 1000, 777)),
        (jnp.float16, 2, 300, 200, 256, 256, (1, 1, 200)),
        (jnp.bfloat16, 2, 5, 3, 7, 0, None),  # the log-sum-exp only; tiny, ragged
        (jnp.float32, 70000, 32, 16, 64, 64, None),  # a batch too large for a minor grid axis
    ],
)
def test_lowers(platform, dtype, B, n, m, d, dv, mask):
    if platform == "tpu" and dtype == jnp.float16:
        dtype = jnp.bfloat16

    def loss(q, k, v, beta, mask):
        out, lse = eqattn.attention_with_lse(q, k, v, beta=beta, mask=mask, **PALLAS)
        return jnp.sum(out.astype(jnp.float32)) + jnp.sum(lse.astype(jnp.float32))

    args = [S((B, n, d), dtype), S((B, m, d), dtype), S((B, m, dv), dtype), S((B,), jnp.float32)]
    args.append(None if mask is None else S(mask, jnp.bool_))
    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))
    call = _CUSTOM_CALLS[platform]
    checks = [export.DisabledSafetyCheck.custom_call(call)]
    text = export.export(grad, platforms=[platform], disabled_checks=checks)(*args).mlir_module()
    assert text.count(f"@{call}(") == 3  # the three kernels, and nothing interpreted
    for name in ("forward", "dkdv", "dq"):
        assert f"eqattn_attention_{name}" in text, name
    assert "stablehlo.while" not in text
    # no n x m array of logits or weights outside the kernels
    assert not re.search(rf"\b{n}x{m}x(b?f\d+)", text)


# --- on a GPU: the compiled kernel ---------------------------------------------------------------


def gpu(test):
    """A test that runs on a GPU only: the GPU command's first step selects these by marker."""
    on_gpu = pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
    return pytest.mark.accelerator(on_gpu(test))


@gpu
@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 2e-3), (jnp.bfloat16, 2e-2)])
def test_gpu_kernel_matches_reference(rng, dtype, tol):
    # float32 matmuls in tf32 by default, as XLA's: errors of order 1e-3.
    q, k, v, beta, mask = _kernel_inputs(rng, 4, 1000, 777, 64, 48, (4, 1000, 777))
    q, k, v = (jnp.asarray(x, dtype) for x in (q, k, v))
    beta = jnp.asarray(beta / 8, jnp.float32)

    def fn(q, k, v, beta):
        return eqattn.attention_with_lse(q, k, v, beta=beta, mask=mask, **PALLAS)

    out, lse = jax.jit(fn)(q, k, v, beta)
    args64 = [np.asarray(x, np.float64) for x in (q, k, v, beta)]
    ref_out, ref_lse = reference.attention_with_lse(*args64, mask)
    assert np.linalg.norm(np.asarray(out, np.float64) - ref_out) < tol * np.linalg.norm(ref_out)
    _assert_lse(lse, ref_lse, 4 * tol)
    g_out, g_lse = rng.normal(size=out.shape), rng.normal(size=lse.shape)
    grads = jax.vjp(jax.jit(fn), q, k, v, beta)[1](
        (jnp.asarray(g_out, dtype), jnp.asarray(g_lse, dtype))
    )
    ref = jax.vjp(lambda *a: reference.dense_attention_with_lse(*a, mask), *args64)[1](
        (g_out, g_lse)
    )
    for name, g, r in zip("q k v beta".split(), grads, ref):
        err = np.linalg.norm(np.asarray(g, np.float64) - r) / np.linalg.norm(r)
        assert err < 4 * tol, (name, err)
    hlo = jax.jit(fn).lower(q, k, v, beta).as_text()
    assert "triton" in hlo
