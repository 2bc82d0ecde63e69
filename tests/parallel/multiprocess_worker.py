"""One process of `test_multiprocess.py`:
`python -m tests.parallel.multiprocess_worker ADDRESS ID N -- EQATTN_TRAIN_ARGS...`.

First `eqattn train EQATTN_TRAIN_ARGS --coordinator ADDRESS --num-processes N --process-id ID`
through the command's own entry point, which joins the processes (`jax.distributed.initialize`,
CPU collectives over gloo) and trains data-parallel over every process's devices (the test
compares its run with a one-process run). Then, in float64 on the same processes, on a mesh of
all their devices: (a) a data-parallel training step of `DEQTransformer`, each process passing its
own rows of the batch, and (b) causal ring attention with its gradient, each checked against the
same computation on this process's first device alone. The worker prints one `ok ...` line per
check and exits 0, or raises.
"""

import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import multihost_utils
from jax.sharding import Mesh

import eqattn
import eqattn.cli
import eqattn.parallel as par


def _close(a, b, what, tol=1e-9):
    a, b = np.asarray(a), np.asarray(b)
    err = float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))
    if not err <= tol:
        raise AssertionError(f"{what}: relative error {err:.2e} > {tol:.0e}")
    return err


def _gather(x):
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def training_step(process, processes):
    model = eqattn.nn.DEQTransformer(
        3, 16, 2, key=jax.random.key(2), in_features=8, max_len=6, dtype=jnp.float64
    )
    rng = np.random.default_rng(0)  # the same global batch in every process
    x, y = rng.normal(size=(8, 6, 8)), np.arange(8) % 3
    opt = optax.adam(1e-2)

    def step(model, state, x, y):
        def loss(model):
            logits = jax.vmap(model)(x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        value, grads = eqx.filter_value_and_grad(loss)(model)
        updates, state = opt.update(grads, state, eqx.filter(model, eqx.is_inexact_array))
        return eqx.apply_updates(model, updates), state, value

    step = eqx.filter_jit(step)
    state = opt.init(eqx.filter(model, eqx.is_inexact_array))
    one_device = jax.local_devices()[0]
    arrays, rest = eqx.partition((model, state, x, y), eqx.is_array)
    alone = eqx.combine(jax.device_put(arrays, one_device), rest)
    ref_model, _, ref_loss = step(*alone)

    mesh = par.data_mesh()
    rows = slice(process * 8 // processes, (process + 1) * 8 // processes)
    xs, ys = par.shard_batch((x[rows], y[rows]), mesh)  # this process's rows only
    many_model, _, loss = step(*par.replicate((model, state), mesh), xs, ys)
    err = _close(_gather(loss), ref_loss, "training loss")
    for a, b in zip(
        jax.tree.leaves(eqx.filter(many_model, eqx.is_array)),
        jax.tree.leaves(eqx.filter(ref_model, eqx.is_array)),
        strict=True,
    ):
        err = max(err, _close(_gather(a), b, "updated parameters"))
    print(f"ok training step on {jax.device_count()} devices: max error {err:.1e}", flush=True)


def ring(process, processes):
    mesh = Mesh(np.asarray(jax.devices()), ("seq",))
    rng = np.random.default_rng(1)
    q, k, v = (rng.normal(size=(2, 32, 4)) for _ in range(3))
    c = rng.normal(size=(2, 32, 4))

    def loss(fn, q, k, v):
        out, lse = fn(q, k, v)
        return jnp.sum(out * c) + jnp.sum(jnp.sin(lse)), (out, lse)

    ring = lambda q, k, v: par.ring_attention_with_lse(  # noqa: E731
        q, k, v, mesh=mesh, axis="seq", causal=True
    )
    causal = jnp.tril(jnp.ones((32, 32), bool))
    one = lambda q, k, v: eqattn.attention_with_lse(q, k, v, mask=causal)  # noqa: E731
    # each side one compiled program: the outputs and the gradient together
    both = lambda fn: jax.jit(jax.grad(lambda *a: loss(fn, *a), (0, 1, 2), has_aux=True))  # noqa: E731
    grads, (out, lse) = both(ring)(q, k, v)
    with jax.default_device(jax.local_devices()[0]):
        ref_grads, (ref_out, ref_lse) = both(one)(q, k, v)
    err = max(_close(_gather(out), ref_out, "ring out"), _close(_gather(lse), ref_lse, "ring lse"))
    for g, r in zip(grads, ref_grads):
        err = max(err, _close(_gather(g), r, "ring gradient"))
    print(f"ok ring attention on {jax.device_count()} devices: max error {err:.1e}", flush=True)


def main():
    address, process, processes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    train_args = sys.argv[sys.argv.index("--") + 1 :]
    where = ["--coordinator", address, "--num-processes", str(processes)]
    code = eqattn.cli.main(["train", *train_args, *where, "--process-id", str(process)])
    if code:
        raise SystemExit(code)
    assert jax.process_count() == processes, jax.process_count()
    print(f"ok eqattn train in {processes} processes", flush=True)
    jax.config.update("jax_enable_x64", True)  # the checks below compare in float64
    training_step(process, processes)
    ring(process, processes)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
