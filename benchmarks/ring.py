"""`ring`: ring attention (queries, keys and values split along the sequence) over P devices,
against splitting the keys only and against one device. On a host with one device it runs itself
on 8 simulated CPU devices (`--xla_force_host_platform_device_count=8`, in a child process).

- memory: the compiled forward+backward's temporary memory per device (`memory_analysis()`,
  compiled only, not run) at n = m = 65,536, d = 64, float32: one device (the chunked path),
  keys-only sharding (`sharded_attention_with_lse`, key chunks of 1024), ring attention, and
  ring attention with `causal=True`; and the collectives in the compiled ring step.
- time: forward+backward time per token as the sequence grows, ring (plain and causal) and one
  device, with the causal run's time as a fraction of the plain one and the fraction of chunk
  pairs that causality lets it skip (counted from the zig-zag schedule).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import eqattn
import eqattn.parallel as par

from ._harness import markdown_table, print_table, time_jitted

DIM = 64
MARK = "ring-rows: "


def _loss(fn):
    def loss(q, k, v):
        out, lse = fn(q, k, v)
        return jnp.sum(out) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0))

    return jax.grad(loss, (0, 1, 2))


def _cases(mesh):
    def ring(causal):
        def fn(q, k, v):
            return par.ring_attention_with_lse(q, k, v, mesh=mesh, axis="seq", causal=causal)

        return fn

    return {
        "one device (chunked)": (
            lambda q, k, v: eqattn.attention_with_lse(q, k, v, implementation="chunked"),
            False,
        ),
        "keys only split": (
            lambda q, k, v: par.sharded_attention_with_lse(
                q, k, v, mesh=mesh, axis="seq", chunk_size=1024
            ),
            True,
        ),
        "ring": (ring(False), True),
        "ring, causal": (ring(True), True),
    }


def _memory_rows(mesh, n):
    size = mesh.shape["seq"]
    rows = []
    for name, (fn, sharded) in _cases(mesh).items():
        sharding = NamedSharding(mesh, P(None, "seq", None)) if sharded else None
        spec = jax.ShapeDtypeStruct((1, n, DIM), jnp.float32, sharding=sharding)
        compiled = jax.jit(_loss(fn)).lower(spec, spec, spec).compile()
        temp = compiled.memory_analysis().temp_size_in_bytes
        ops = Counter(re.findall(r"= \S+ ([a-z-]+?)(?:-start)?\(", compiled.as_text()))
        rows.append(
            {
                "part": "memory",
                "case": name,
                "n": n,
                "devices": size if sharded else 1,
                "temp_mb": temp / 2**20,
                "collective_permutes": ops["collective-permute"],
                "all_gathers": ops["all-gather"] + ops["all-to-all"],
            }
        )
    one = rows[0]["temp_mb"]
    block_mb = 2 * (n // size) * DIM * 4 / 2**20  # one key and value block in flight
    for r in rows:
        r["of_one_device"] = r["temp_mb"] / one
        r["target_mb"] = one / size + block_mb
    return rows


def _skipped_fraction(size: int) -> float:
    """Chunk pairs the causal zig-zag schedule computes, of all (2P)^2."""
    last, done = 2 * size - 1, 0
    for me in range(size):
        for src in range(size):
            for qi in (me, last - me):
                done += sum(ki <= qi for ki in (src, last - src))
    return 1 - done / (2 * size) ** 2


def _time_rows(mesh, sizes, repeats):
    rows = []
    for n in sizes:
        keys = jax.random.split(jax.random.key(n), 3)
        x = [jax.random.normal(k, (1, n, DIM), jnp.float32) for k in keys]
        sharded = [jax.device_put(a, NamedSharding(mesh, P(None, "seq", None))) for a in x]
        times = {}
        for name, (fn, split) in _cases(mesh).items():
            if name == "keys only split":
                continue
            t = time_jitted(_loss(fn), *(sharded if split else x), repeats=repeats)
            times[name] = t["median_s"]
            rows.append(
                {
                    "part": "time",
                    "case": name,
                    "n": n,
                    "ms": 1e3 * t["median_s"],
                    "us_per_token": 1e6 * t["median_s"] / n,
                    "times_s": t["times_s"],
                }
            )
        for r in rows[-3:]:
            r["x_one_device"] = times[r["case"]] / times["one device (chunked)"]
            if r["case"] == "ring, causal":
                r["of_plain_ring"] = times["ring, causal"] / times["ring"]
                r["skipped_pairs"] = _skipped_fraction(mesh.shape["seq"])
    return rows


def measure(quick: bool) -> list[dict]:
    mesh = Mesh(np.asarray(jax.devices()), ("seq",))
    n_memory = 512 if quick else 65536  # --quick: the timed size, its programs compiled once
    sizes = [512] if quick else [1024, 2048, 4096, 8192]
    return _memory_rows(mesh, n_memory) + _time_rows(mesh, sizes, 2 if quick else 5)


def run(quick: bool = False) -> tuple[list[dict], dict]:
    if jax.device_count() >= 2:
        rows, devices = measure(quick), f"{jax.device_count()} x {jax.devices()[0].device_kind}"
    elif jax.default_backend() == "cpu":
        env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
        cmd = [sys.executable, "-m", "benchmarks.ring", *(["--quick"] if quick else [])]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        rows = json.loads(out.split(MARK, 1)[1])
        devices = "8 simulated CPU devices (one host)"
    else:
        print("(one accelerator: ring attention needs several devices)")
        return [], {}
    memory = [r for r in rows if r["part"] == "memory"]
    print(f"devices: {devices}")
    print_table(
        memory,
        [
            ("case", "case", "s"),
            ("n", "n=m", "d"),
            ("devices", "devices", "d"),
            ("temp_mb", "temp MB/device", ".1f"),
            ("of_one_device", "of one device", ".3f"),
            ("collective_permutes", "permutes", "d"),
            ("all_gathers", "gathers", "d"),
        ],
    )
    print()
    print_table(
        [r for r in rows if r["part"] == "time"],
        [
            ("case", "case", "s"),
            ("n", "n=m", "d"),
            ("ms", "fwd+bwd ms", ".1f"),
            ("us_per_token", "us/token", ".1f"),
            ("x_one_device", "x one device", ".2f"),
            ("of_plain_ring", "causal / plain", ".2f"),
            ("skipped_pairs", "pairs skipped", ".3f"),
        ],
    )
    return rows, {"devices": devices, "dim": DIM}


if __name__ == "__main__":
    print(MARK + json.dumps(measure("--quick" in sys.argv)))


def table(payload) -> str:
    """The ring results file as Markdown (the Benchmarks page's table)."""
    rows = payload["rows"]
    memory = [r for r in rows if r["part"] == "memory"]
    dtype = payload.get("dtype", "float32")
    text = f"On {payload.get('devices', 'several devices')}, d = {payload.get('dim')}, {dtype}"
    text += ", compiled, not run.\n\n" if payload.get("compiled") else ".\n\n"
    share, key = (
        ("of the causal ring on CPU", "of_cpu")
        if payload.get("compiled")
        else ("of one device", "of_one_device")
    )
    text += markdown_table(
        [
            f"forward+backward, n = m = {memory[0]['n']}",
            "devices",
            "temp MB per device",
            share,
            "collective permutes",
            "all-gathers",
        ],
        [
            [
                r["case"],
                r["devices"],
                f"{r['temp_mb']:.1f}",
                f"{r[key]:.3f}" if key in r else "",
                r["collective_permutes"],
                r["all_gathers"],
            ]
            for r in memory
        ],
    )
    times = [r for r in rows if r["part"] == "time"]
    text += (
        ""
        if not times
        else "\n\n"
        + markdown_table(
            ["case", "n = m", "fwd+bwd ms", "us per token", "x one device", "causal / plain ring"],
            [
                [
                    r["case"],
                    r["n"],
                    f"{r['ms']:.3g}",
                    f"{r['us_per_token']:.3g}",
                    f"{r['x_one_device']:.2f}",
                    f"{r['of_plain_ring']:.2f}" if "of_plain_ring" in r else "",
                ]
                for r in times
            ],
        )
    )
    skipped = next((r["skipped_pairs"] for r in times if "skipped_pairs" in r), None)
    if skipped is not None:
        text += f"\n\nCausal: the zig-zag schedule skips {skipped:.1%} of the chunk pairs."
    return text
