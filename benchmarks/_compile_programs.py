"""What the compile suite compiles (see `benchmarks.compile`): the fused kernel's configurations,
whole programs (the training step, an implicit layer's gradient, `MultiHeadAttention` with
`"auto"`), the memory suite's attention at 16,384 tokens and causal ring attention on eight
devices, each a row of resources read from the compiler."""

from __future__ import annotations

import collections
import re

from . import _deviceless

DTYPES = {"cuda": ("float32", "bfloat16", "float16"), "tpu": ("float32", "bfloat16")}


WIDTHS = (32, 64, 128, 256)


HEADS = 8


SQUARE, RAGGED = (4096, 4096), (1000, 3000)


MASKS = ("none", "key padding", "causal")


def cases(platform: str, check: bool) -> list[dict]:
    """The configurations compiled for a target of `platform`."""
    passes = ("gradient",) if check else ("forward", "gradient")
    shapes = [(*SQUARE, mask) for mask in MASKS] + [(*RAGGED, "none")]
    return [
        {"dtype": dtype, "d": d, "n": n, "m": m, "mask": mask, "pass": p}
        for dtype in DTYPES[platform]
        for d in WIDTHS
        for n, m, mask in shapes
        for p in passes
    ]


def _program(case: dict, sharding):
    """`(function, argument specs)` of one configuration, through the public API."""
    import jax
    import jax.numpy as jnp

    import eqattn

    n, m, d = case["n"], case["m"], case["d"]

    def spec(shape, dtype=case["dtype"]):
        return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype), sharding=sharding)

    args = [spec((1, HEADS, n, d)), spec((1, HEADS, m, d)), spec((1, HEADS, m, d))]
    args.append(spec((HEADS,), "float32"))
    if case["mask"] == "key padding":
        args.append(spec((1, 1, 1, m), "bool"))
    elif case["mask"] == "causal":
        args.append(spec((n, m), "bool"))

    def forward(q, k, v, beta, mask=None):
        return eqattn.attention_with_lse(q, k, v, beta=beta, mask=mask, implementation="pallas")

    def loss(q, k, v, beta, mask=None):
        out, lse = forward(q, k, v, beta, mask)
        return jnp.sum(out.astype(jnp.float32)) + jnp.sum(lse.astype(jnp.float32))

    if case["pass"] == "forward":
        return forward, args
    return jax.grad(loss, argnums=(0, 1, 2, 3)), args


def negative_control(target: _deviceless.Target) -> dict:
    """An oversized tiling, compiled like the rest: the check must judge it a failure."""
    import jax
    import jax.numpy as jnp

    from eqattn._attention._pallas import _attention, _mosaic, _triton

    sharding = _deviceless.one_device_sharding(target)
    if target.platform == "cuda":  # 128 x 128 backward tiles of 256 float32 features
        wide = _triton.Tile(128, 128, 4, 2)
        blocks = _triton.Blocks(_triton.Tile(64, 64, 4, 2), wide, wide)
        config, d = _attention.Config(triton=blocks), 256
    else:  # 4096 x 4096 blocks: far over any generation's scoped VMEM
        blocks = _mosaic.Blocks(4096, 4096)
        config, d = _attention.Config(mosaic=blocks), 128

    def loss(q, k, v, beta):
        out, lse = _attention.attention_core(q, k, v, beta, None, config)
        return jnp.sum(out) + jnp.sum(lse)

    specs = [jax.ShapeDtypeStruct((HEADS, 4096, d), jnp.float32, sharding=sharding)] * 3
    specs.append(jax.ShapeDtypeStruct((HEADS,), jnp.float32, sharding=sharding))
    program = jax.grad(loss, argnums=(0, 1, 2))
    row = _deviceless.compile_program(target, program, specs)
    row = {"dtype": "float32", "d": d, "blocks": repr(blocks), **row}
    # Mosaic's error names the scoped-VMEM limit it enforced: the table's must be the same.
    found = re.search(r"limit ([\d.]+)M", row.get("error", ""))
    if found:
        row["reported_vmem_limit"] = round(float(found[1]) * 2**20)
    return row


LONG = 16384


def _uses(text: str) -> dict:
    """Which attention paths a compiled program holds."""
    low = text.lower()
    return {
        "cudnn": "cudnn" in low,
        "pallas_kernels": sorted(set(re.findall(r"eqattn_attention_\w+?(?=[.\s\"(])", text))),
    }


def _memory_rows(target, sharding) -> list[dict]:
    """The attention core's forward+backward at n = m = 16,384 (batch x heads = 4, d = 64,
    float32), the memory suite's cases compiled for the target: temporaries against XLA's dense
    attention's."""
    import jax
    import jax.numpy as jnp

    from . import memory

    spec = [jax.ShapeDtypeStruct((1, memory.BH, LONG, memory.DIM), jnp.float32, sharding=sharding)]
    spec *= 4
    rows = []
    for name, fn in memory.core_cases(LONG, platform=target.platform).items():
        row = _deviceless.compile_program(target, fn, spec, _uses)
        rows.append({"part": "core", "n": LONG, "case": name, **row})
    dense = next(r for r in rows if r["case"] == "xla-dense")
    for r in rows:
        if r["compiled"] and dense["compiled"]:
            r["temp_mb"] = r["temp_bytes"] / 2**20
            r["of_dense"] = r["temp_bytes"] / dense["temp_bytes"]
    return rows


def _train_step():
    """`eqattn train`'s DEQ training step with its defaults (digits, batch 64): (fn, args)."""
    import jax.numpy as jnp
    import numpy as np

    from . import training

    _, config = next(c for c in training._configs(False) if c[0] == training.DEFAULTS)
    x = jnp.zeros((64, 8, 8), jnp.float32)
    y = jnp.asarray(np.arange(64) % 10, jnp.int32)
    return training._step_case(config, x, y)


def _implicit_gradient():
    """The parameter gradient of an `ImplicitAttention` layer (width 64, 4 heads) on 16,384
    tokens with the fused kernel."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    import eqattn

    layer = eqattn.nn.ImplicitAttention(64, 4, key=jax.random.key(0), implementation="pallas")
    params, static = eqx.partition(layer, eqx.is_array)

    def grad(params, x):
        return jax.grad(lambda p: jnp.sum(eqx.combine(p, static)(x) ** 2))(params)

    return grad, (params, jnp.zeros((LONG, 64), jnp.float32))


def _attention_gradient():
    """The parameter gradient of `MultiHeadAttention` (width 64, 4 heads, bfloat16, 4,096
    tokens) with `implementation="auto"`: cuDNN where the program is compiled for a GPU."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    import eqattn

    mha = eqattn.nn.MultiHeadAttention(4, 64, key=jax.random.key(0), dtype=jnp.bfloat16)
    params, static = eqx.partition(mha, eqx.is_array)

    def grad(params, x):
        def loss(p):
            return jnp.sum(eqx.combine(p, static)(x, x).astype(jnp.float32) ** 2)

        return jax.grad(loss)(params)

    return grad, (params, jnp.zeros((4096, 64), jnp.bfloat16))


PROGRAMS = {
    "eqattn train step (digits defaults)": _train_step,
    "ImplicitAttention gradient, 16384 tokens, pallas": _implicit_gradient,
    "MultiHeadAttention gradient, bf16, auto": _attention_gradient,
}


RING_TOKENS, RING_DIM, RING_DTYPE = 65536, 64, "bfloat16"


def _ring_rows(target) -> list[dict]:
    """Causal ring attention's forward+backward on eight devices (65,536 tokens, bfloat16,
    d = 64, batch x heads = 4), each pair of blocks by eqattn's core (`"xla"`), the default
    (`"auto"`: the fused kernel where it can run the inputs) or the fused kernel: per-device
    temporaries and the collectives in the compiled program."""

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    import eqattn.parallel as par

    if target.ring_topology is None:
        return []
    devices = _deviceless.topology_devices(target, target.ring_topology)
    mesh = Mesh(np.asarray(devices), ("seq",))
    sharding = NamedSharding(mesh, PartitionSpec(None, "seq", None))
    shape, dtype = (4, RING_TOKENS, RING_DIM), jnp.dtype(RING_DTYPE)
    spec = jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    def ops(text: str) -> dict:
        ops = r" (collective-permute|all-gather|all-to-all)(?:-start)?\("
        count = collections.Counter(re.findall(ops, text))
        return {
            "collective_permutes": count["collective-permute"],
            "all_gathers": count["all-gather"] + count["all-to-all"],
            **_uses(text),
        }

    rows = []
    for implementation in ("xla", "auto", "pallas"):

        def loss(q, k, v, implementation=implementation):
            out, lse = par.ring_attention_with_lse(
                q, k, v, mesh=mesh, axis="seq", causal=True, implementation=implementation
            )
            finite = jnp.where(jnp.isfinite(lse), lse, 0).astype(jnp.float32)
            return jnp.sum(out.astype(jnp.float32)) + jnp.sum(finite)

        fn = jax.grad(loss, argnums=(0, 1, 2))
        row = _deviceless.compile_program(target, fn, [spec] * 3, ops)
        case = f"ring, causal, {len(devices)} devices, {implementation}"
        rows.append(
            {"part": "ring", "case": case, "n": RING_TOKENS, "devices": len(devices), **row}
        )
    return rows


# What `--check` compiles of them (a few minutes in all): the choice that follows the platform.
CHECKED_PROGRAMS = ("MultiHeadAttention gradient, bf16, auto",)


def _program_rows(target, sharding, check: bool = False) -> list[dict]:
    rows = []
    for name, build in PROGRAMS.items():
        if check and name not in CHECKED_PROGRAMS:
            continue
        fn, args = build()
        row = _deviceless.compile_program(target, fn, _deviceless.placed(args, sharding), _uses)
        rows.append({"part": "program", "case": name, **row})
    return rows
