"""Ring attention (8 CPU devices, set up in conftest) against the float64 reference: outputs,
log-sum-exps and gradients (autodiff of a dense float64 reference), causal and masked, and
the sharding of the result."""

import re
from functools import partial

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import eqattn
import eqattn.parallel as par

from .. import reference

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices")


def _mesh(shape, names):
    return Mesh(np.asarray(jax.devices()[: int(np.prod(shape))]).reshape(shape), names)


def _causal(n):
    return np.tril(np.ones((n, n), bool))


def _finite(x):
    return np.where(np.isfinite(x), x, 0)


def _outputs_and_grads(fn, c, jit=True, of_lse=lambda x: jnp.sin(jnp.where(jnp.isfinite(x), x, 0))):
    """`fn`'s `(out, lse)` and the gradients, with respect to every argument, of
    `sum(out * c) + sum(of_lse(lse))` (both in `c`'s dtype), in one program."""

    def loss(*args):
        outputs = fn(*args)
        out, lse = (x.astype(c.dtype) for x in outputs)
        return jnp.sum(out * c) + jnp.sum(of_lse(lse)), outputs

    def both(*args):
        grads, outputs = jax.grad(loss, tuple(range(len(args))), has_aux=True)(*args)
        return outputs, grads

    return jax.jit(both) if jit else both


CASES = [
    # (mesh shape, axes, q, k, v, beta, mask shape or None, causal)
    ((8,), ("seq",), (16, 8), (24, 8), (24, 5), (), None, False),
    # batch and heads, beta per head, a per-query mask split with the queries
    ((2, 4), ("data", "seq"), (2, 3, 8, 4), (2, 3, 12, 4), (2, 3, 12, 6), (3,), (8, 12), False),
    # padding-style mask (no query axis), batch-broadcast queries
    ((4,), ("seq",), (1, 3, 8, 4), (2, 3, 16, 4), (2, 3, 16, 4), (2, 3), (2, 1, 1, 16), False),
    ((4,), ("seq",), (2, 16, 4), (2, 16, 4), (2, 16, 3), (2,), None, True),
    ((8,), ("seq",), (32, 4), (32, 4), (32, 4), (), None, True),
    ((2, 4), ("data", "seq"), (3, 16, 4), (3, 16, 4), (3, 16, 2), (3,), (3, 16, 16), True),
]


@pytest.mark.parametrize(
    "case, dtype, implementation",
    [(case, np.float64, "auto") for case in CASES]
    + [(CASES[1], np.float32, "auto")]
    # the fused kernel on each device (interpreted on CPU), with a per-query mask (causal with
    # the kernel: `test_sequence_split_attention_takes_the_layers_implementation`)
    + [(CASES[1], np.float64, "pallas")],
)
def test_ring_attention_matches_reference(rng, case, dtype, implementation):
    mesh_shape, names, qs, ks, vs, bs, ms, causal = case
    mesh = _mesh(mesh_shape, names)
    q, k, v = (rng.normal(size=s).astype(dtype) for s in (qs, ks, vs))
    beta = rng.uniform(0.5, 2.0, size=bs).astype(dtype)
    mask = None
    if ms is not None:
        mask = rng.random(ms) > 0.4
        if ms[-2] > 1:
            mask[..., 1, :] = False  # attends to nothing: out 0, lse -inf
    full = mask
    if causal:
        full = _causal(qs[-2]) if mask is None else mask & _causal(qs[-2])
    out_shape = np.broadcast_shapes(qs[:-1] + (vs[-1],), vs[:-2] + (1, 1))
    c = rng.normal(size=out_shape)

    ring = partial(
        par.ring_attention_with_lse,
        mesh=mesh,
        axis="seq",
        mask=mask,
        causal=causal,
        implementation=implementation,
    )
    # one program: the outputs and the gradients of a loss over both
    (out, lse), grads = _outputs_and_grads(lambda q, k, v, b: ring(q, k, v, beta=b), c)(
        q, k, v, beta
    )
    assert out.dtype == dtype and lse.dtype == dtype
    ref_out, ref_lse = reference.attention_with_lse(q, k, v, beta, full)
    tol = 1e-10 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(out, ref_out, rtol=tol, atol=tol)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    np.testing.assert_allclose(_finite(lse), _finite(ref_lse), rtol=tol, atol=tol)

    f64 = [jnp.asarray(x, jnp.float64) for x in (q, k, v, beta)]
    dense = lambda q, k, v, b: reference.dense_attention_with_lse(q, k, v, b, full)  # noqa: E731
    _, ref_grads = _outputs_and_grads(dense, c, jit=False)(*f64)
    for g, r in zip(grads, ref_grads):
        assert g.dtype == dtype
        scale = max(1.0, float(np.abs(r).max()))
        np.testing.assert_allclose(g, r, rtol=tol * 10, atol=tol * 10 * scale)


@pytest.mark.parametrize("causal", [False, True])
def test_ring_attention_float32_equals_one_device_and_moves_blocks_by_permutes(rng, causal):
    """float32 on 8 devices against float32 on one: outputs, log-sum-exps and gradients within
    1e-5 relative (of each array's largest entry). The compiled forward+backward, on inputs
    sharded along the sequence, moves the blocks by collective-permute; nothing gathers the
    queries, keys or values onto one device, and the outputs are sharded like the queries."""
    mesh = _mesh((8,), ("seq",))
    sharding = NamedSharding(mesh, P(None, None, "seq", None))
    q, k, v = (rng.normal(size=(2, 4, 64, 16)).astype(np.float32) for _ in range(3))
    beta = np.float32(0.5)
    mask = _causal(64) if causal else None
    c = rng.normal(size=(2, 4, 64, 16)).astype(np.float32)

    def ring(q, k, v):
        return par.ring_attention_with_lse(q, k, v, mesh=mesh, axis="seq", beta=beta, causal=causal)

    def one(q, k, v):
        return eqattn.attention_with_lse(q, k, v, beta=beta, mask=mask)

    plain = partial(_outputs_and_grads, c=c, of_lse=lambda x: x)
    split = [jax.device_put(x, sharding) for x in (q, k, v)]
    compiled = plain(ring).lower(*split).compile()
    ops = re.findall(r"= \S+ ([a-z-]+?)(?:-start)?\(", compiled.as_text())
    assert "collective-permute" in ops
    assert not {"all-gather", "all-to-all"} & set(ops)
    result = compiled(*split)
    (out, lse), _ = result  # sharded like the queries
    assert {s.data.shape for s in out.addressable_shards} == {(2, 4, 8, 16)}
    assert {s.data.shape for s in lse.addressable_shards} == {(2, 4, 8)}
    got, want = jax.tree.leaves(result), jax.tree.leaves(plain(one)(q, k, v))
    for a, b in zip(got, want, strict=True):
        assert a.dtype == np.float32
        scale = float(np.abs(b).max())
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * scale)


@pytest.mark.parametrize("causal", [False, True])
def test_ring_attention_bfloat16_errs_no_more_than_one_device(rng, causal):
    """bfloat16 on 8 devices: outputs, log-sum-exps and gradients as close to the float64
    result as one device's bfloat16 (the ring passes the output and its cotangent in bfloat16
    and accumulates the gradients in float32)."""
    mesh = _mesh((8,), ("seq",))
    q, k, v = (jnp.asarray(rng.normal(size=(2, 4, 128, 32)), jnp.bfloat16) for _ in range(3))
    c = rng.normal(size=(2, 4, 128, 32)).astype(np.float32)
    mask = _causal(128) if causal else None

    def loss(fn, q, k, v):
        out, lse = fn(q, k, v)
        return jnp.sum(out.astype(jnp.float32) * c) + jnp.sum(lse.astype(jnp.float32))

    def ring(q, k, v):
        return par.ring_attention_with_lse(q, k, v, mesh=mesh, axis="seq", beta=0.5, causal=causal)

    def one(q, k, v):
        return eqattn.attention_with_lse(q, k, v, beta=0.5, mask=mask)

    def error(fn):
        f64 = [np.asarray(x, np.float64) for x in (q, k, v)]
        for run in (jax.jit, lambda f: jax.jit(jax.grad(partial(loss, f), (0, 1, 2)))):
            for a, r in zip(run(fn)(q, k, v), run(one)(*f64), strict=True):
                assert a.dtype == jnp.bfloat16
                yield float(np.abs(np.asarray(a, np.float64) - r).max() / np.abs(r).max())

    for e_ring, e_one in zip(error(ring), error(one), strict=True):
        assert e_one < 1e-2 and e_ring <= 1.25 * e_one + 1e-4, (e_ring, e_one)


def test_ring_attention_memory_falls_with_the_devices(rng):
    """The compiled forward+backward's temporaries per device: about the local blocks (n/P x m/P
    logits), far below the n x m/P that splitting only the keys holds."""
    n, d = 2048, 16
    q = jnp.asarray(rng.normal(size=(n, d)).astype(np.float32))

    def temp_bytes(fn):
        step = jax.jit(jax.grad(lambda q: jnp.sum(fn(q)[0])))
        return step.lower(q).compile().memory_analysis().temp_size_in_bytes

    mesh = _mesh((8,), ("seq",))
    ring = temp_bytes(lambda q: par.ring_attention_with_lse(q, q, mesh=mesh, axis="seq"))
    keys_only = temp_bytes(lambda q: par.sharded_attention_with_lse(q, q, mesh=mesh, axis="seq"))
    block = (n // 8) ** 2 * 4  # one block of float32 logits
    assert ring < 8 * block < keys_only


def test_ring_attention_masked_keys_are_inert(rng):
    mesh = _mesh((4,), ("seq",))
    q, k, v = (rng.normal(size=(2, 16, 4)) for _ in range(3))
    mask = np.ones((2, 1, 16), bool)
    mask[:, :, 3] = mask[:, :, 12] = False
    k[:, 3], v[:, 12] = np.nan, np.inf

    def loss(q, k, v):
        return jnp.sum(par.ring_attention(q, k, v, mesh=mesh, axis="seq", mask=mask) ** 2)

    grads = jax.jit(jax.grad(loss, (0, 1, 2)))(q, k, v)
    keep = mask[0, 0]
    ref = partial(reference.dense_attention_with_lse, beta=1.0)
    ref_grads = jax.grad(lambda q, k, v: jnp.sum(ref(q, k, v)[0] ** 2), (0, 1, 2))(
        q, k[:, keep], v[:, keep]
    )
    np.testing.assert_allclose(grads[0], ref_grads[0], rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(grads[1][:, keep], ref_grads[1], rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(grads[2][:, keep], ref_grads[2], rtol=1e-10, atol=1e-10)
    assert np.all(grads[1][:, ~keep] == 0) and np.all(grads[2][:, ~keep] == 0)


@pytest.mark.parametrize(
    "kind", ["causal+padding", "per-query", "causal+per-query", "keys-split per-query"]
)
def test_ring_attention_nan_reaches_only_the_queries_that_see_it(rng, kind):
    """NaN in a key, inf in a value and NaN in a query, hidden from some queries only (by
    causality or a per-query mask): the queries that see them are NaN, the others equal the
    float64 reference without them, and so do the gradients of a loss over the others."""
    mesh = _mesh((4,), ("seq",))
    n = 16
    q, k, v = (rng.normal(size=(2, n, 4)) for _ in range(3))
    causal = kind.startswith("causal")
    mask = None
    if kind.endswith("padding"):
        mask = np.ones((2, 1, n), bool)
        mask[0, 0, :3] = False  # query 0..2 of example 0 see nothing
    elif kind.endswith("per-query"):
        mask = (rng.random((2, n, n)) > 0.8) | np.eye(n, dtype=bool)
    full = np.ones((2, n, n), bool) if mask is None else np.broadcast_to(mask, (2, n, n))
    full = full & _causal(n) if causal else full
    dq, dk, dv = q.copy(), k.copy(), v.copy()
    dk[:, 9, 0], dv[:, 12, 1], dq[:, 2, 3] = np.nan, np.inf, np.nan
    ref_out, ref_lse = reference.removed_attention_with_lse(dq, dk, dv, 1.0, full)
    hit = ~np.isfinite(ref_out).all(-1)
    assert hit.any() and (~hit).sum() > 8

    if kind.startswith("keys-split"):  # the keys-only split: one-device core on each device
        ring = partial(par.sharded_attention_with_lse, mesh=mesh, axis="seq", mask=mask)
    else:
        ring = partial(par.ring_attention_with_lse, mesh=mesh, axis="seq", mask=mask, causal=causal)
    out, lse = jax.jit(ring)(dq, dk, dv)
    reference.assert_matches_removed(out, lse, ref_out, ref_lse, 1e-12)
    assert np.all(np.isnan(np.asarray(out)[hit]))
    g_out = rng.normal(size=out.shape) * ~hit[..., None]
    g_lse = rng.normal(size=lse.shape) * (~hit & full.any(-1))

    def loss(fn, q, k, v):
        out, lse = fn(q, k, v)
        return jnp.sum(out * g_out) + jnp.sum(jnp.where(g_lse != 0, lse, 0.0) * g_lse)

    ours = jax.jit(jax.grad(partial(loss, ring), (0, 1, 2)))(dq, dk, dv)
    dense = partial(reference.dense_attention_with_lse, beta=1.0, mask=full)
    for got, want in zip(ours, jax.grad(partial(loss, dense), (0, 1, 2))(q, k, v)):
        np.testing.assert_allclose(got, want, atol=1e-11)


def test_ring_attention_causal_diagonal_halving(rng):
    """Diagonal chunk pairs halved towards `chunk_size` = 3 queries (24 queries on 2 devices:
    chunks of 6, halved once; the engine's deeper halving is tests/attention/test_causal.py's),
    with a per-query mask: outputs and gradients against the float64 reference."""
    n = 24
    mesh = _mesh((2,), ("seq",))
    q, k, v = (rng.normal(size=(2, n, 4)) for _ in range(3))
    mask = rng.random((2, n, n)) > 0.2
    full = mask & _causal(n)
    c = rng.normal(size=(2, n, 4))

    def ring(q, k, v):
        options = dict(mask=mask, causal=True, chunk_size=3)
        return par.ring_attention_with_lse(q, k, v, mesh=mesh, axis="seq", **options)

    (out, lse), grads = _outputs_and_grads(ring, c)(q, k, v)
    ref_out, ref_lse = reference.attention_with_lse(q, k, v, 1.0, full)
    np.testing.assert_allclose(out, ref_out, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(_finite(lse), _finite(ref_lse), rtol=1e-10, atol=1e-10)
    dense = lambda q, k, v: reference.dense_attention_with_lse(q, k, v, 1.0, full)  # noqa: E731
    _, ref_grads = _outputs_and_grads(dense, c, jit=False)(q, k, v)
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(g, r, rtol=1e-9, atol=1e-9)


@pytest.mark.bad_input
def test_ring_attention_errors():
    mesh = _mesh((4,), ("seq",))
    q = jnp.ones((8, 4))
    ring = partial(par.ring_attention_with_lse, mesh=mesh, axis="seq")
    with pytest.raises(ValueError, match="multiples of the size 4"):
        ring(jnp.ones((6, 4)), q)
    with pytest.raises(ValueError, match=r"multiples of 2 x the size 4.*causal"):
        ring(jnp.ones((12, 4)), jnp.ones((12, 4)), causal=True)
    with pytest.raises(ValueError, match="as many queries as keys"):
        ring(q, jnp.ones((16, 4)), causal=True)
    with pytest.raises(ValueError, match="not an axis of `mesh`"):
        par.ring_attention_with_lse(q, q, mesh=mesh, axis="model")
    with pytest.raises(TypeError, match="jax.sharding.Mesh"):
        par.ring_attention_with_lse(q, q, mesh="seq", axis="seq")
    with pytest.raises(ValueError, match="chunk_size"):
        ring(q, q, chunk_size=0)
    with pytest.raises(ValueError, match="must broadcast to"):
        ring(q, q, mask=jnp.ones((8, 3), bool))
    with pytest.raises(ValueError, match="finite and > 0"):
        ring(q, q, beta=-1.0)
    with pytest.raises(
        ValueError, match="'auto', 'xla', 'chunked' or 'pallas' for ring attention .* got 'cudnn'"
    ):
        ring(q, q, implementation="cudnn")
    with pytest.raises(ValueError, match="d, dv <= 256"):
        ring(jnp.ones((8, 512)), jnp.ones((8, 512)), implementation="pallas")


def _layers(split, key):
    tight = dict(solver=eqattn.Anderson(rtol=1e-10, atol=0.0, max_steps=60))
    return {
        "ImplicitAttention": eqattn.nn.ImplicitAttention(
            8, 2, key=key, sequence=split, dtype=jnp.float64, **tight
        ),
        "DEQBlock": eqattn.nn.DEQBlock(8, 2, key=key, sequence=split, dtype=jnp.float64, **tight),
        "DEQTransformer": eqattn.nn.DEQTransformer(
            3, 8, 2, key=key, in_features=4, max_len=16, sequence=split, dtype=jnp.float64, **tight
        ),
    }


@pytest.mark.parametrize("name", ["ImplicitAttention", "DEQTransformer"])
def test_sequence_split_layers_match_one_device(rng, name):
    """The solve on the token-sharded state: the same fixed point, the same number of steps and
    the same parameter gradients as on one device."""
    mesh = _mesh((8,), ("seq",))
    split = par.SequenceSplit(mesh, "seq")
    key = jax.random.key(0)
    sharded, one = _layers(split, key)[name], _layers(None, key)[name]
    x = rng.normal(size=(2, 16, 4 if name == "DEQTransformer" else 8))
    mask = np.ones((16, 16), bool)
    mask[:, 11] = False  # a key no token may attend to

    def run(layer, x):
        if name == "DEQTransformer":
            return jax.vmap(lambda xi: layer.forward(xi, padding_mask=mask[0]))(x)
        eq = jax.vmap(lambda xi: layer.equilibrium(xi, mask=mask))(x)
        return eq.value, eq

    out, eq = eqx.filter_jit(run)(sharded, x)
    ref, ref_eq = eqx.filter_jit(run)(one, x)
    np.testing.assert_allclose(out, ref, rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(eq.steps, ref_eq.steps)
    assert np.all(eq.converged)

    def loss(layer):
        return jnp.sum(jnp.sin(run(layer, x)[0]))

    g = eqx.filter_jit(eqx.filter_grad(loss))(sharded)
    g_ref = eqx.filter_jit(eqx.filter_grad(loss))(one)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-9)
    if name != "DEQTransformer":  # the state stays split along the tokens
        assert {s.data.shape for s in eq.value.addressable_shards} == {(2, 2, 8)}


def test_sequence_split_solve_and_backward_stay_sharded():
    """The compiled gradient of a token-split `DEQBlock` (forward solve and implicit backward):
    blocks move by collective permutes, norms by all-reduces, and nothing gathers the state."""
    split = par.SequenceSplit(_mesh((8,), ("seq",)), "seq")
    layer = eqattn.nn.DEQBlock(16, 2, key=jax.random.key(0), sequence=split)
    params, static = eqx.partition(layer, eqx.is_array)

    def grad(params, x):
        loss = lambda layer: jnp.sum(jnp.sin(jax.vmap(layer)(x)))  # noqa: E731
        return eqx.filter_grad(loss)(eqx.combine(params, static))

    hlo = jax.jit(grad).lower(params, jnp.ones((2, 64, 16))).compile().as_text()
    # an op's name before its operands (a tuple-typed result, as XLA's combined all-reduces
    # have, holds spaces: match the name, not the type)
    ops = re.findall(r"\s([a-z][a-z-]*?)(?:-start)?\(", hlo)
    assert "collective-permute" in ops and "all-reduce" in ops
    assert not {"all-gather", "all-to-all"} & set(ops)


def test_sequence_split_attention_takes_the_layers_implementation(rng):
    """`MultiHeadAttention(implementation=..., sequence=...)`: ring attention computes each
    device's blocks with the layer's implementation (the fused kernel's call is in the program)
    and gives the one-device output."""
    split = par.SequenceSplit(_mesh((4,), ("seq",)), "seq")
    x = jnp.asarray(rng.normal(size=(16, 8)), jnp.float32)
    outputs = {}
    for implementation in ("xla", "pallas"):
        options = dict(key=jax.random.key(0), implementation=implementation, causal=True)
        mha = eqattn.nn.MultiHeadAttention(2, 8, sequence=split, **options)
        program = str(jax.make_jaxpr(lambda x, mha=mha: mha(x, x))(x))
        assert ("pallas_call" in program) == (implementation == "pallas")
        outputs[implementation] = mha(x, x)
    one = eqattn.nn.MultiHeadAttention(2, 8, key=jax.random.key(0), causal=True)(x, x)
    for out in outputs.values():
        np.testing.assert_allclose(out, one, atol=2e-5)


def test_sequence_split_errors():
    mesh = _mesh((4,), ("seq",))
    with pytest.raises(TypeError, match="SequenceSplit"):
        eqattn.nn.ImplicitAttention(8, 2, key=jax.random.key(0), sequence=(mesh, "seq"))
    with pytest.raises(ValueError, match="not an axis"):
        par.SequenceSplit(mesh, "model")
    with pytest.raises(ValueError, match="cuDNN gives no log-sum-exp"):
        eqattn.nn.MultiHeadAttention(
            2,
            8,
            key=jax.random.key(0),
            implementation="cudnn",
            sequence=par.SequenceSplit(mesh, "seq"),
        )
    layer = eqattn.nn.ImplicitAttention(
        8, 2, key=jax.random.key(0), sequence=par.SequenceSplit(mesh, "seq")
    )
    with pytest.raises(ValueError, match="multiple of the size 4 of mesh axis 'seq'"):
        layer(jnp.ones((6, 8)))


def test_calls_outside_jit_compile_once_per_configuration(rng):
    # Outside `jit`, `shard_map` would run the ring one operation at a time (seconds per call):
    # both sharded functions compile once, and a second call with the same shapes and
    # configuration reuses the program (a new `beta` value is an argument, not a new program).
    from eqattn.parallel import _ring, _sequence

    mesh = _mesh((4,), ("seq",))
    x = jnp.asarray(rng.normal(size=(2, 16, 4)))
    for fn, jitted, extra in (
        (par.ring_attention_with_lse, _ring._ring_attention_with_lse, dict(causal=True)),
        (par.sharded_attention_with_lse, _sequence._sharded_attention_with_lse, {}),
    ):
        fn(x, x, mesh=mesh, axis="seq", **extra)
        programs = jitted._cache_size()
        out, lse = fn(x, x, mesh=mesh, axis="seq", beta=0.5, **extra)
        assert jitted._cache_size() == programs
        mask = _causal(16) if extra else None
        ref_out, ref_lse = reference.attention_with_lse(
            np.asarray(x), np.asarray(x), beta=0.5, mask=mask
        )
        np.testing.assert_allclose(out, ref_out, atol=1e-10)
        np.testing.assert_allclose(lse, ref_lse, atol=1e-10)


def test_ring_auto_takes_the_fused_kernel_where_compiled_for_an_accelerator():
    """Ring attention's `"auto"`: the fused kernel (memory O((n + m) d) a block) in a program
    for NVIDIA GPUs where it can run the inputs, the core in the CPU's program and where it
    cannot (d = 512; float32 at d = 256); the choice follows the platform compiled for."""
    from jax import export

    from eqattn._attention import blockwise

    def lowered(d, platform, dtype=jnp.bfloat16):
        q = jnp.ones((2, 64, d), dtype)
        _, blocks = blockwise.check(q, q, q, 1.0, None)
        b = jnp.ones((2,), jnp.float32)
        f = jax.jit(lambda q: blockwise.forward(blocks, q, q, q, b, None, diag=True)[0])
        triton = [export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
        return blocks, export.export(f, platforms=[platform], disabled_checks=triton)(q)

    blocks, cuda = lowered(64, "cuda")
    assert blocks.lean == ("cuda", "tpu") and blocks.traces_kernel
    assert "triton" in cuda.mlir_module() and "triton" not in lowered(64, "cpu")[1].mlir_module()
    wide, cuda = lowered(512, "cuda")
    assert wide.lean == () and "triton" not in cuda.mlir_module()
    # float32 above d = 128 has no spill-free tiling on NVIDIA GPUs: the core there, not a refusal
    f32, cuda = lowered(256, "cuda", jnp.float32)
    assert f32.lean == ("tpu",) and "triton" not in cuda.mlir_module()
