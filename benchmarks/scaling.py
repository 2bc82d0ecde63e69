"""`scaling`: how the core's forward+backward time grows with the batch and the sequence, and (with
more than one device) the throughput of a data-parallel training step as devices are added.

- batch: `attention_with_lse` forward+backward at fixed n = m, batch x heads = 8 x (1, 2, ... ),
  d = 64, float32 (bfloat16 as well on a GPU): time and tokens per second.
- sequence: batch 1 x 8 heads, n = m doubling: time and the fitted exponent p of time ~ n^p
  (2 for attention once the quadratic term dominates).
- devices: a `DEQTransformer` training step (batch 8 per device) on 1, 2, 4, ... of the devices,
  the batch sharded with `eqattn.parallel.shard_batch`: examples per second.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

import eqattn
import eqattn.parallel

from ._harness import markdown_table, print_table, time_jitted
from .layers import _step_fn, deq_model

HEADS, DIM = 8, 64


def _grad(scale):
    def loss(q, k, v, c):
        return jnp.sum(eqattn.attention_with_lse(q, k, v, beta=scale)[0] * c)

    return jax.grad(loss, argnums=(0, 1, 2))


def _inputs(batch, n, dtype):
    keys = jax.random.split(jax.random.key(n + batch), 4)
    return tuple(jax.random.normal(k, (batch, HEADS, n, DIM), dtype) for k in keys)


def _attention_rows(quick, repeats):
    gpu = jax.default_backend() == "gpu"
    dtypes = [jnp.float32, jnp.bfloat16] if gpu and not quick else [jnp.float32]
    n_batch = 64 if quick else (4096 if gpu else 512)
    batches = [1, 2] if quick else [1, 2, 4, 8, 16]
    seqs = (
        [64, 128] if quick else ([1024, 2048, 4096, 8192, 16384] if gpu else [256, 512, 1024, 2048])
    )
    rows = []
    for dtype in dtypes:
        dname = jnp.dtype(dtype).name
        for kind, grid in (
            ("batch", [(b, n_batch) for b in batches]),
            ("sequence", [(1, n) for n in seqs]),
        ):
            for batch, n in grid:
                t = time_jitted(_grad(DIM**-0.5), *_inputs(batch, n, dtype), repeats=repeats)
                rows.append(
                    {
                        "part": kind,
                        "dtype": dname,
                        "batch": batch,
                        "n": n,
                        "ms": 1e3 * t["median_s"],
                        "tokens_per_s": batch * n / t["median_s"],
                        "compile_s": t["compile_s"],
                        "times_s": t["times_s"],
                    }
                )
            part = [r for r in rows if r["part"] == kind and r["dtype"] == dname]
            x = np.log([r["batch" if kind == "batch" else "n"] for r in part])
            y = np.log([r["ms"] for r in part])
            slope = float(np.polyfit(x[-3:], y[-3:], 1)[0]) if len(part) >= 2 else math.nan
            for r in part:
                r["fitted_exponent"] = slope  # over the three largest sizes
    return rows


def _device_rows(quick, repeats):
    devices = jax.devices()
    counts = [c for c in (1, 2, 4, 8, 16, 32) if c <= len(devices)]
    if len(counts) < 2:
        return []
    n = 16 if quick else 64
    rows = []
    for count in counts:
        mesh = eqattn.parallel.data_mesh(devices=devices[:count])
        model = deq_model(n, jax.random.key(0))
        step, params, state = _step_fn(model)
        batch = 8 * count
        x = jax.random.normal(jax.random.key(1), (batch, n, 64), jnp.float32)
        y = jnp.arange(batch) % 10
        x, y = eqattn.parallel.shard_batch((x, y), mesh)
        params, state = eqattn.parallel.replicate((params, state), mesh)
        t = time_jitted(step, params, state, x, y, repeats=repeats)
        rows.append(
            {
                "part": "devices",
                "devices": count,
                "batch": batch,
                "n": n,
                "ms": 1e3 * t["median_s"],
                "examples_per_s": batch / t["median_s"],
                "compile_s": t["compile_s"],
                "times_s": t["times_s"],
            }
        )
    for r in rows:
        r["speedup"] = r["examples_per_s"] / rows[0]["examples_per_s"]
    return rows


def run(quick: bool = False) -> tuple[list[dict], dict]:
    repeats = 3 if quick else 10
    rows = _attention_rows(quick, repeats)
    print_table(
        rows,
        [
            ("part", "sweep", "s"),
            ("dtype", "dtype", "s"),
            ("batch", "batch", "d"),
            ("n", "n=m", "d"),
            ("ms", "fwd+bwd ms", ".3f"),
            ("tokens_per_s", "tokens/s", ".3g"),
            ("fitted_exponent", "exponent", ".2f"),
        ],
    )
    device_rows = _device_rows(quick, repeats)
    if device_rows:
        print()
        print_table(
            device_rows,
            [
                ("devices", "devices", "d"),
                ("batch", "batch", "d"),
                ("ms", "step ms", ".2f"),
                ("examples_per_s", "examples/s", ".3g"),
                ("speedup", "x 1 device", ".2f"),
            ],
        )
    else:
        print("(one device: no multi-device rows)")
    return rows + device_rows, {"heads": HEADS, "dim": DIM}


def table(payload) -> str:
    """The scaling results file as Markdown (the Benchmarks page's table)."""
    rows = payload["rows"]
    fits = {}
    for r in rows:
        if r["part"] in ("batch", "sequence"):
            fits[(r["part"], r["dtype"])] = (
                r["fitted_exponent"],
                r["n"] if r["part"] == "sequence" else r["batch"],
            )
    text = markdown_table(
        ["sweep", "dtype", "fitted exponent of time (three largest sizes)", "largest size"],
        [[p, d, f"{e:.2f}", s] for (p, d), (e, s) in fits.items()],
    )
    devices = [r for r in rows if r["part"] == "devices"]
    if devices:
        text += "\n\n" + markdown_table(
            ["devices", "batch", "step ms", "examples/s", "x 1 device"],
            [
                [
                    r["devices"],
                    r["batch"],
                    f"{r['ms']:.3g}",
                    f"{r['examples_per_s']:.3g}",
                    f"{r['speedup']:.2f}",
                ]
                for r in devices
            ],
        )
    return text
