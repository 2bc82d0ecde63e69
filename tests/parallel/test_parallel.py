"""Many devices (8 CPU devices, set up in conftest): sequence-parallel attention and a data-parallel
training step give the one-device results."""

from functools import partial

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh

import eqattn
import eqattn.parallel as par

from .. import reference

F32 = np.float32
pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices")


def _meshes():
    devices = np.asarray(jax.devices()[:8])
    return {
        "auto": Mesh(devices.reshape(2, 4), ("data", "seq")),
        "explicit": jax.make_mesh((2, 4), ("data", "seq"), devices=list(devices)),
        "ring8": Mesh(devices, ("seq",)),
    }


def _assert_close(a, b, tol=1e-5):
    a, b = np.asarray(a), np.asarray(b)
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * max(1.0, np.abs(b).max()))


CASES = [
    # (mesh, (q, k, v, beta, mask))
    ("ring8", ((10, 8), (16, 8), (16, 5), (), None)),
    # per-head beta, shared mask
    ("auto", ((2, 3, 10, 8), (2, 3, 16, 8), (2, 3, 16, 5), (3,), (10, 16))),
    # padding-style mask, on a mesh with explicit axes (as `jax.make_mesh` makes)
    ("explicit", ((2, 1, 6, 4), (1, 3, 32, 4), (2, 3, 32, 4), (2, 3), (2, 1, 1, 32))),
    ("ring8", ((4, 4), (8, 4), (8, 2), (), (4, 1))),  # a mask with no key axis is replicated
]


@pytest.mark.parametrize("mesh_name, shapes", CASES)
def test_sharded_attention_matches_one_device(rng, mesh_name, shapes):
    mesh = _meshes()[mesh_name]
    qs, ks, vs, bs, ms = shapes
    q, k, v = (rng.normal(size=s).astype(F32) for s in (qs, ks, vs))
    beta = rng.uniform(0.5, 2.0, size=bs).astype(F32)
    mask = None if ms is None else rng.random(ms) > 0.4
    if mask is not None and ms[-1] > 1:
        mask[..., 0, :] = False  # attends to nothing: out 0, lse -inf
        mask[..., -1, :] = np.arange(ms[-1]) < 4  # keys on the first device only
    c = rng.normal(size=np.broadcast_shapes(qs[:-1] + (vs[-1],), vs[:-2] + (1, 1))).astype(F32)

    def loss(fn, q, k, v, beta):
        out, lse = fn(q, k, v, beta=beta, mask=mask)
        return jnp.sum(out * c) + jnp.sum(jnp.sin(jnp.where(jnp.isfinite(lse), lse, 0)))

    sharded = partial(par.sharded_attention_with_lse, mesh=mesh, axis="seq")
    out, lse = sharded(q, k, v, beta=beta, mask=mask)
    ref_out, ref_lse = reference.attention_with_lse(q, k, v, beta, mask)
    _assert_close(out, ref_out)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    _assert_close(
        np.where(np.isfinite(ref_lse), lse, 0), np.where(np.isfinite(ref_lse), ref_lse, 0)
    )
    grads = jax.jit(jax.grad(partial(loss, sharded), argnums=(0, 1, 2, 3)))(q, k, v, beta)
    ref_grads = jax.grad(partial(loss, eqattn.attention_with_lse), argnums=(0, 1, 2, 3))(
        q, k, v, beta
    )
    for g, r in zip(grads, ref_grads):
        assert np.all(np.isfinite(g))
        _assert_close(g, r)


def test_sharded_attention_really_splits_the_keys(rng):
    mesh = _meshes()["ring8"]
    q, k = rng.normal(size=(4, 8)).astype(F32), rng.normal(size=(64, 8)).astype(F32)
    hlo = (
        jax.jit(lambda q, k: par.sharded_attention_with_lse(q, k, mesh=mesh, axis="seq"))
        .lower(q, k)
        .compile()
        .as_text()
    )
    assert "all-reduce" in hlo
    assert "f32[8,8]" in hlo  # each device holds 64 / 8 keys


@pytest.mark.bad_input
def test_sharded_attention_errors(rng):
    mesh = _meshes()["ring8"]
    q = jnp.ones((4, 8), jnp.float32)
    with pytest.raises(ValueError, match="m = 12 .* multiple of the size 8"):
        par.sharded_attention_with_lse(q, jnp.ones((12, 8)), mesh=mesh, axis="seq")
    with pytest.raises(ValueError, match="`axis` 'model' is not an axis"):
        par.sharded_attention_with_lse(q, jnp.ones((16, 8)), mesh=mesh, axis="model")
    with pytest.raises(ValueError, match="same feature size"):
        par.sharded_attention_with_lse(q, jnp.ones((16, 4)), mesh=mesh, axis="seq")


# --- data parallel -----------------------------------------------------------------------------


class Classifier(eqx.Module):
    layer: eqattn.nn.ImplicitAttention
    head: eqx.nn.Linear

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.layer = eqattn.nn.ImplicitAttention(
            8, 2, key=k1, solver=eqattn.Anderson(rtol=1e-6, max_steps=100), dtype=jnp.float32
        )
        self.head = eqx.nn.Linear(8, 3, key=k2, dtype=jnp.float32)

    def __call__(self, x):
        return self.head(jnp.mean(self.layer(x), axis=0))


def _loss(model, x, y):
    logits = jax.vmap(model)(x)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))


@eqx.filter_jit
def _step(model, state, x, y, optimizer):
    loss, grads = eqx.filter_value_and_grad(_loss)(model, x, y)
    updates, state = optimizer.update(grads, state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, updates), state, loss


def _train(model, x, y, steps=2):
    optimizer = optax.adam(3e-2)
    state = optimizer.init(eqx.filter(model, eqx.is_array))
    losses = []
    for _ in range(steps):
        model, state, loss = _step(model, state, x, y, optimizer)
        losses.append(loss)
    return model, losses


def test_data_parallel_training_step_matches_one_device(getkey):
    model = Classifier(getkey())
    x = jax.random.normal(getkey(), (16, 6, 8), jnp.float32)
    y = jax.random.randint(getkey(), (16,), 0, 3)
    one, one_losses = _train(model, x, y)

    mesh = par.data_mesh()
    xs, ys = par.shard_batch((x, y), mesh)
    assert len(xs.sharding.device_set) == 8 and xs.addressable_shards[0].data.shape == (2, 6, 8)
    many, many_losses = _train(par.replicate(model, mesh), xs, ys)

    _assert_close(many_losses, one_losses)
    arrays = [jax.tree.leaves(eqx.filter(m, eqx.is_array)) for m in (many, one)]
    for a, b in zip(*arrays, strict=True):
        assert len(a.sharding.device_set) == 8  # parameters stay replicated over the mesh
        _assert_close(a, b)
    assert one_losses[1] < one_losses[0]


def test_data_helpers_errors():
    mesh = par.data_mesh()
    with pytest.raises(ValueError, match=r"leaf \[1\] with shape \(6, 3\).* 8 devices"):
        par.shard_batch((jnp.ones((8, 2)), jnp.ones((6, 3))), mesh)
    with pytest.raises(ValueError, match="`axis` 'batch' is not an axis"):
        par.shard_batch(jnp.ones((8, 2)), mesh, axis="batch")
    tree = {"x": jnp.ones((8, 2)), "n": 3}
    out = par.shard_batch(tree, mesh)
    assert out["n"] == 3 and len(out["x"].sharding.device_set) == 8
