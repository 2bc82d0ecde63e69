import functools as ft

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import eqattn

from .. import reference
from ..checks import unchecked

SHAPES = [
    # (q shape, k shape, v shape, beta shape, mask shape)
    ((5, 3), (7, 3), (7, 4), (), None),
    ((2, 5, 3), (2, 7, 3), (2, 7, 2), (), (2, 5, 7)),
    ((2, 4, 6, 8), (4, 9, 8), (1, 4, 9, 5), (4,), (6, 9)),  # per-head beta, shared mask
    ((3, 1, 6, 4), (1, 2, 5, 4), (3, 2, 5, 4), (3, 2), (3, 1, 1, 5)),  # padding-style mask
    ((1, 3), (1, 3), (1, 2), (), None),  # one query, one key
    ((70, 5), (50, 5), (50, 3), (), (70, 50)),
]


def _inputs(rng, qs, ks, vs, bs, ms, dtype=np.float64):
    q = rng.normal(size=qs).astype(dtype)
    k = rng.normal(size=ks).astype(dtype)
    v = rng.normal(size=vs).astype(dtype)
    beta = rng.uniform(0.3, 2.0, size=bs)
    mask = None if ms is None else rng.random(ms) > 0.3
    return q, k, v, beta, mask


def _assert_matches(out, lse, ref_out, ref_lse, tol):
    np.testing.assert_allclose(out, ref_out, rtol=tol, atol=tol)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    finite = np.isfinite(ref_lse)
    np.testing.assert_allclose(np.asarray(lse)[finite], ref_lse[finite], rtol=tol, atol=tol)


PATHS = ["one-shot", "tiled", "chunked"]
# The CPU tile-by-tile path of the core at small sizes (32-row tiles).
TINY_TILES = eqattn.Tiling(forward_logits=32, backward_logits=32, min_logits=0)


def _path(path):
    """Extra keyword arguments that select a path of the core."""
    return {"tiled": {"tiling": TINY_TILES}, "chunked": {"chunk_size": 3}}.get(path, {})


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shapes", SHAPES)
def test_matches_reference(rng, path, shapes):
    extra = _path(path)
    q, k, v, beta, mask = _inputs(rng, *shapes)
    out, lse = eqattn.attention_with_lse(q, k, v, beta=beta, mask=mask, **extra)
    ref_out, ref_lse = reference.attention_with_lse(q, k, v, beta, mask)
    assert out.shape == ref_out.shape and lse.shape == ref_lse.shape
    assert out.dtype == jnp.float64 and lse.dtype == jnp.float64
    _assert_matches(out, lse, ref_out, ref_lse, 1e-12)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shapes", [SHAPES[1], SHAPES[2], SHAPES[3], SHAPES[5]])
def test_gradients_match_finite_differences(rng, path, shapes):
    extra = _path(path)
    q, k, v, beta, mask = _inputs(rng, *shapes)
    if mask is not None:
        mask[..., 0] = True  # keep every lse finite so the loss below is smooth
    c = rng.normal(size=np.broadcast_shapes(q.shape[:-1], k.shape[:-2] + (1,)) + (v.shape[-1],))
    w = rng.normal(size=c.shape[:-1])

    def loss(q, k, v, beta):
        out, lse = eqattn.attention_with_lse(q, k, v, beta=beta, mask=mask, **extra)
        return jnp.sum(out * c) + jnp.sum(jnp.tanh(lse) * w)

    # (jitted: check_grads' many evaluations would otherwise run op by op)
    check_grads(
        jax.jit(loss), (q, k, v, beta), order=2, modes=["rev"], atol=1e-6, rtol=1e-6, eps=1e-5
    )


def test_tiled_and_one_shot_agree_in_float32(rng):
    q, k, v, beta, mask = _inputs(
        rng, (2, 70, 8), (2, 45, 8), (2, 45, 6), (2,), (2, 70, 45), np.float32
    )
    mask[0, 3] = False

    def run(tiling=None):
        def f(q, k, v):
            return eqattn.attention_with_lse(q, k, v, beta=beta, mask=mask, tiling=tiling)

        g = jax.grad(lambda *a: jnp.sum(jnp.sin(f(*a)[0])), argnums=(0, 1, 2))
        return f(q, k, v), g(q, k, v)

    one_shot = run()
    tiled = run(TINY_TILES)
    for a, b in zip(jax.tree.leaves(one_shot), jax.tree.leaves(tiled)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", PATHS)
def test_fully_masked_rows(rng, path):
    extra = _path(path)
    q, k, v, beta, mask = _inputs(rng, (2, 40, 4), (2, 33, 4), (2, 33, 3), (), (2, 40, 33))
    mask[0, 5] = False
    mask[1, :] = False  # a whole batch element sees nothing

    def f(q, k, v, beta):
        return eqattn.attention_with_lse(q, k, v, beta=beta, mask=mask, **extra)

    out, lse = f(q, k, v, beta)
    assert np.all(np.isneginf(lse[0, 5])) and np.all(np.isneginf(lse[1]))
    assert np.all(out[0, 5] == 0) and np.all(out[1] == 0)
    assert np.all(np.isfinite(lse[0, :5]))

    # Gradients through out *and* lse (masked to the finite entries) are finite, and zero for the
    # rows that see nothing.
    def loss(q, k, v, beta):
        out, lse = f(q, k, v, beta)
        return jnp.sum(out**2) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0))

    grads = jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, beta)
    for g in grads:
        assert np.all(np.isfinite(g))
    assert np.all(grads[0][0, 5] == 0) and np.all(grads[0][1] == 0)
    assert np.all(grads[1][1] == 0) and np.all(grads[2][1] == 0)


@pytest.mark.parametrize("chunk", [1, 7, 16, 45, 64])
def test_chunked_equals_single_pass_in_float32(rng, chunk):
    # m = 45 is not a multiple of most chunk sizes; masks per batch element and per query
    q, k, v, beta, mask = _inputs(
        rng, (2, 30, 8), (2, 45, 8), (2, 45, 6), (2,), (2, 30, 45), np.float32
    )
    mask[0, 3] = False

    def run(**kw):
        f = lambda q, k, v: eqattn.attention_with_lse(q, k, v, beta=beta, mask=mask, **kw)  # noqa: E731
        g = jax.grad(
            lambda *a: (
                jnp.sum(jnp.sin(f(*a)[0]))
                + jnp.sum(jnp.where(jnp.isfinite(f(*a)[1]), f(*a)[1], 0.0))
            ),
            argnums=(0, 1, 2),
        )
        return f(q, k, v), g(q, k, v)

    for a, b in zip(jax.tree.leaves(run()), jax.tree.leaves(run(chunk_size=chunk))):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def test_chunked_low_precision(rng):
    q, k, v = (jnp.asarray(rng.normal(size=(2, 16, 8)) * 4, jnp.bfloat16) for _ in range(3))
    single = eqattn.attention_with_lse(q, k, v)
    chunked = eqattn.attention_with_lse(q, k, v, chunk_size=5)
    assert chunked[0].dtype == jnp.bfloat16 and chunked[1].dtype == jnp.bfloat16
    for a, b in zip(single, chunked):
        np.testing.assert_allclose(
            np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=2e-2, atol=2e-2
        )


def test_chunked_path_selection():
    from eqattn._attention._plan import core_path

    def chunk_spec(*args):  # (keys per chunk, whether chunks are taken on every platform)
        return core_path(*args)[:2]

    assert chunk_spec(4096, 4096, None, "auto") == (None, False)
    # 2^26 logits: chunks of 1024, taken off CPU only (CPU keeps its query tiles)
    assert chunk_spec(8192, 8192, None, "auto") == (1024, False)
    assert chunk_spec(8192, 8192, None, "xla") == (None, False)
    assert chunk_spec(8192, 8192, None, "chunked") == (1024, True)
    small = eqattn.Tiling(auto_chunk_logits=100, chunk_size=8)
    assert chunk_spec(20, 10, None, "auto", small) == (8, False)
    assert chunk_spec(20, 10, None, "chunked", small) == (8, True)
    # the query tiles: 2^19 logits forward and 2^18 backward per tile, from 2^16 logits on
    assert core_path(4096, 1024, None, "auto") == (None, False, 512, 256)
    assert core_path(128, 256, None, "auto") == (None, False, None, None)  # 2^15 logits
    for bad in (dict(min_logits=-1), dict(chunk_size=0), dict(forward_logits=2.0)):
        with unchecked(), pytest.raises(ValueError, match="Tiling"):
            eqattn.Tiling(**bad)
    with unchecked(), pytest.raises(TypeError, match="`tiling` must be an eqattn.Tiling"):
        eqattn.attention(jnp.ones((3, 2)), jnp.ones((3, 2)), tiling={"chunk_size": 2})
    assert chunk_spec(100, 50, 16, "auto") == (16, True)
    assert chunk_spec(100, 50, 16, "chunked") == (16, True)
    assert chunk_spec(100, 50, 64, "auto") == (None, False)  # one block: a single pass
    q = jnp.ones((1, 40, 4))
    for kw in ({"chunk_size": 16}, {"chunk_size": 16, "implementation": "chunked"}):
        lowered = jax.jit(lambda q, kw=kw: eqattn.attention_with_lse(q, q, **kw)[1]).lower(q)
        assert "while" in lowered.as_text()  # a scan over blocks of keys
    lowered = jax.jit(lambda q: eqattn.attention(q, q, implementation="xla")).lower(q)
    assert "while" not in lowered.as_text()
    with unchecked(), pytest.raises(ValueError, match="`chunk_size` must be a positive int"):
        eqattn.attention_with_lse(q, q, chunk_size=0)


def test_automatic_chunking_traces_both_platform_branches(rng):
    # With tiny thresholds the CPU tiles and the (off-CPU) chunks are both traced; CPU runs tiles.
    tiling = eqattn.Tiling(32, 32, 0, auto_chunk_logits=100, chunk_size=8)
    q, k, v, beta, mask = _inputs(rng, (2, 40, 4), (2, 30, 4), (2, 30, 3), (2,), (2, 40, 30))
    f = ft.partial(eqattn.attention_with_lse, beta=beta, mask=mask, tiling=tiling)
    out, lse = f(q, k, v)
    ref_out, ref_lse = reference.attention_with_lse(q, k, v, beta, mask)
    _assert_matches(out, lse, ref_out, ref_lse, 1e-12)
    g = jax.grad(lambda q: jnp.sum(f(q, k, v)[0]))(q)
    assert np.all(np.isfinite(g))


def test_no_keys():
    out, lse = eqattn.attention_with_lse(jnp.ones((3, 2)), jnp.ones((0, 2)), jnp.ones((0, 5)))
    assert out.shape == (3, 5) and np.all(out == 0) and np.all(np.isneginf(lse))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_huge_logits(rng, dtype):
    # logits around 1e4: the naive exp overflows; the shifted one does not.
    q = (rng.normal(size=(2, 6, 4)) * 50).astype(dtype)
    k = (rng.normal(size=(2, 9, 4)) * 50).astype(dtype)
    v = rng.normal(size=(2, 9, 3)).astype(dtype)
    assert np.abs(np.einsum("bnd,bmd->bnm", q, k)).max() > 1e4
    out, lse = eqattn.attention_with_lse(q, k, v)
    ref_out, ref_lse = reference.attention_with_lse(q, k, v)
    tol = 1e-12 if dtype == np.float64 else 2e-4
    np.testing.assert_allclose(out, ref_out, rtol=tol, atol=tol)
    np.testing.assert_allclose(lse, ref_lse, rtol=tol)
    g = jax.grad(lambda q: jnp.sum(eqattn.attention_with_lse(q, k, v)[1]))(q)
    assert np.all(np.isfinite(g))


def test_single_key_is_identity(rng):
    q, k, v = rng.normal(size=(4, 3)), rng.normal(size=(1, 3)), rng.normal(size=(1, 5))
    out, lse = eqattn.attention_with_lse(q, k, v, beta=0.7)
    np.testing.assert_allclose(out, np.broadcast_to(v, (4, 5)), rtol=1e-14)
    np.testing.assert_allclose(lse, 0.7 * q @ k[0], rtol=1e-14)


@pytest.mark.parametrize("dtype, tol", [(jnp.bfloat16, 3e-2), (jnp.float16, 4e-3)])
@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_low_precision_inputs(rng, dtype, tol, scale):
    q = jnp.asarray(rng.normal(size=(2, 16, 8)) * scale, dtype)
    k = jnp.asarray(rng.normal(size=(2, 20, 8)) * scale, dtype)
    v = jnp.asarray(rng.normal(size=(2, 20, 8)), dtype)
    out, lse = eqattn.attention_with_lse(q, k, v)
    assert out.dtype == dtype and lse.dtype == dtype
    # Compare with float64 on the same (rounded) inputs: only the output rounding is lost.
    ref_out, ref_lse = reference.attention_with_lse(*(np.asarray(x, np.float64) for x in (q, k, v)))
    assert np.all(np.isfinite(np.asarray(lse, np.float64)))
    np.testing.assert_allclose(np.asarray(out, np.float64), ref_out, atol=tol, rtol=tol)
    np.testing.assert_allclose(np.asarray(lse, np.float64), ref_lse, rtol=tol)
    grads = jax.grad(lambda q, k: jnp.sum(eqattn.attention(q, k, v).astype(jnp.float32)), (0, 1))(
        q, k
    )
    assert all(g.dtype == dtype and np.all(np.isfinite(np.asarray(g, np.float32))) for g in grads)


def test_jit_and_vmap(rng):
    q, k, v, beta, mask = _inputs(rng, (4, 5, 3), (4, 6, 3), (4, 6, 2), (4,), (4, 5, 6))
    f = lambda q, k, v, b, m: eqattn.attention_with_lse(q, k, v, beta=b, mask=m)  # noqa: E731
    expected = reference.attention_with_lse(q, k, v, beta, mask)  # float64 numpy
    for got in (f(q, k, v, beta, mask), jax.vmap(jax.jit(f))(q, k, v, beta, mask)):
        for a, b in zip(got, expected):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)


def test_traced_beta_and_beta_gradient(rng):
    q, k = rng.normal(size=(5, 3)), rng.normal(size=(6, 3))

    def lse_sum(beta):
        return jnp.sum(eqattn.attention_with_lse(q, k, beta=beta)[1])

    # d/dbeta sum_i lse_i = sum_i E_p[q_i . k]; check against a central difference.
    g = jax.jit(jax.grad(lse_sum))(0.8)
    h = 1e-6
    fd = (lse_sum(0.8 + h) - lse_sum(0.8 - h)) / (2 * h)
    np.testing.assert_allclose(g, fd, rtol=1e-7)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            dict(queries=np.ones((4, 3)), keys=np.ones((5, 2))),
            r"feature size d.*\(4, 3\).*\(5, 2\)",
        ),
        (
            dict(queries=np.ones((4, 3)), keys=np.ones((5, 3)), values=np.ones((6, 2))),
            "one row per key",
        ),
        (
            dict(queries=np.ones((4, 3)), keys=np.ones((5, 3)), mask=np.ones((4, 6), bool)),
            "`mask` must broadcast",
        ),
        (
            dict(queries=np.ones((4, 3)), keys=np.ones((5, 3)), mask=np.ones((2, 4, 5), bool)),
            "`mask` must broadcast",
        ),
        (
            dict(queries=np.ones((4, 3)), keys=np.ones((5, 3)), mask=np.ones((4, 5))),
            "must be boolean",
        ),
        (dict(queries=np.ones((4, 3)), keys=np.ones((5, 3)), beta=0.0), r"`beta`.*> 0"),
        (
            dict(queries=np.ones((4, 3)), keys=np.ones((5, 3)), beta=np.array([1.0, -1.0])),
            r"`beta`",
        ),
        (
            dict(queries=np.ones((2, 4, 3)), keys=np.ones((5, 3)), beta=np.ones(3)),
            r"`beta` must be a scalar or broadcast",
        ),
        (
            dict(queries=np.ones((2, 4, 3)), keys=np.ones((3, 5, 3))),
            r"batch\) axes of `queries`, `keys`",
        ),
        (dict(queries=np.ones(3), keys=np.ones((5, 3))), r"`queries` must have shape"),
        (dict(queries=np.ones((4, 3), int), keys=np.ones((5, 3))), r"floating-point"),
    ],
)
def test_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        eqattn.attention_with_lse(**kwargs)


@pytest.mark.parametrize("implementation", ["xla", "chunked", "pallas"])
def test_mask_with_leading_unit_axes(rng, implementation):
    # A [1, n, m] (or [1, 1, m]) mask against a batch of 2.
    q, k, v, _, _ = _inputs(rng, (2, 5, 3), (2, 7, 3), (2, 7, 2), (), None)
    for mask in (np.tril(np.ones((5, 7), bool))[None], np.arange(7)[None, None] < 4):
        out, lse = eqattn.attention_with_lse(q, k, v, mask=mask, implementation=implementation)
        ref_out, ref_lse = reference.attention_with_lse(q, k, v, 1.0, mask)
        _assert_matches(out, lse, ref_out, ref_lse, 1e-12)


def test_merge_partials_gives_attention_over_the_union_of_the_keys(rng):
    from eqattn._attention import merge_partials

    q, k, v = rng.normal(size=(6, 3)), rng.normal(size=(9, 3)) * 8, rng.normal(size=(9, 2))
    mask = rng.random((6, 9)) > 0.4
    mask[0] = False  # attends to nothing: lse -inf, out 0
    mask[1, :4] = False  # nothing in the first set
    mask[2, 4:] = False  # nothing in the second set
    a = reference.attention_with_lse(q, k[:4], v[:4], 1.0, mask[:, :4])
    b = reference.attention_with_lse(q, k[4:], v[4:], 1.0, mask[:, 4:])
    out, lse = merge_partials(a, b)
    ref_out, ref_lse = reference.attention_with_lse(q, k, v, 1.0, mask)
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    finite = np.isfinite(ref_lse)
    np.testing.assert_allclose(np.asarray(lse)[finite], ref_lse[finite], rtol=1e-12)
