"""`memory`: what the backward pass keeps, from XLA's compiled memory analysis (no run needed).

1. Core, forward+backward (gradient of `sum(out * c)` w.r.t. q, k, v), batch x heads = 4, d = 64,
   as n = m grows: `jax.nn.dot_product_attention(implementation="xla")` (dense), eqattn's single
   pass (forced: on CPU "xla" otherwise runs query tiles), eqattn's key chunks (1024 keys from
   n = 4096 on, n / 4 below), and on CPU eqattn's query tiles (what "auto" runs there), off CPU
   eqattn's fused Pallas kernel. Temporary bytes = XLA's `temp_size_in_bytes`.
   At n = m = 2048 the same cases are also timed (round-robin).
2. Implicit vs unrolled backward of an `ImplicitAttention` layer as the number of solver steps
   grows (Picard, a fixed number of steps): the implicit adjoint's memory must stay flat.
3. (full run only) One training step of an `ImplicitAttention` layer on a 16384-token sequence,
   in a fresh process: its compiled temporary memory, the process's peak resident memory and its
   time.
"""

from __future__ import annotations

import time

import equinox as eqx
import jax
import jax.numpy as jnp

import eqattn

from ._harness import in_fresh_process, markdown_table, print_table, time_interleaved

BH, DIM = 4, 64
MB = 2**20


def _grad(attend):
    def loss(q, k, v, c):
        return jnp.sum(attend(q, k, v) * c)

    return jax.grad(loss, argnums=(0, 1, 2))


def _chunk(n: int) -> int:
    return 1024 if n >= 4096 else n // 4


def core_cases(n: int, platform: str | None = None):
    """name: forward+backward function, for the default backend or the `platform` compiled for
    ("cpu", "cuda", "gpu" or "tpu")."""
    platform = jax.default_backend() if platform is None else platform

    def dense(q, k, v):
        t = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731  [b, n, h, d] layout
        out = jax.nn.dot_product_attention(t(q), t(k), t(v), scale=DIM**-0.5, implementation="xla")
        return t(out)

    def ours(implementation, chunk_size=None, tiling=None):
        return lambda q, k, v: eqattn.attention(
            q,
            k,
            v,
            beta=DIM**-0.5,
            implementation=implementation,
            chunk_size=chunk_size,
            tiling=tiling,
        )

    cases = {
        "xla-dense": _grad(dense),
        # the one-shot pass everywhere (no CPU query tiles)
        "eqattn-single-pass": _grad(ours("xla", tiling=eqattn.Tiling(min_logits=1 << 62))),
        "eqattn-chunked": _grad(ours("chunked", _chunk(n))),
    }
    if platform == "cpu":
        cases["eqattn-cpu-tiles"] = _grad(ours("xla"))
    else:  # eqattn's fused kernel (on CPU it would be interpreted: not a memory figure)
        cases["eqattn-pallas"] = _grad(ours("pallas"))
    return cases


def _temp_bytes(fn, *args) -> tuple[int, float]:
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    analysis = compiled.memory_analysis()
    return analysis.temp_size_in_bytes, time.perf_counter() - t0


def _core_memory(sizes):
    rows = []
    for n in sizes:
        args = [jax.ShapeDtypeStruct((1, BH, n, DIM), jnp.float32)] * 4
        for name, fn in core_cases(n).items():
            temp, compile_s = _temp_bytes(fn, *args)
            rows.append(
                {
                    "part": "core",
                    "n": n,
                    "case": name,
                    "chunk": _chunk(n) if name == "eqattn-chunked" else None,
                    "temp_mb": temp / MB,
                    "compile_s": compile_s,
                }
            )
        dense = next(r["temp_mb"] for r in rows if r["n"] == n and r["case"] == "xla-dense")
        single = next(r for r in rows if r["n"] == n and r["case"] == "eqattn-single-pass")
        for r in rows:
            if r["n"] == n:
                r["of_dense"] = r["temp_mb"] / dense
                r["of_single_pass"] = r["temp_mb"] / single["temp_mb"]
    return rows


def _core_time(n, repeats):
    keys = jax.random.split(jax.random.key(0), 4)
    q, k, v, c = (jax.random.normal(key, (1, BH, n, DIM), jnp.float32) for key in keys)
    cases = {name: (fn, q, k, v, c) for name, fn in core_cases(n).items()}
    timings = time_interleaved(cases, repeats=repeats)
    rows = []
    for name, t in timings.items():
        rows.append(
            {
                "part": "core-time",
                "n": n,
                "case": name,
                "ms": 1e3 * t["median_s"],
                "ratio_to_single_pass": t["median_s"] / timings["eqattn-single-pass"]["median_s"],
                "compile_s": t["compile_s"],
                "times_s": t["times_s"],
            }
        )
    return rows


def _layer(dim, heads, steps, adjoint):
    return eqattn.nn.ImplicitAttention(
        dim,
        heads,
        key=jax.random.key(0),
        solver=eqattn.Picard(rtol=1e-30, max_steps=steps),
        adjoint=adjoint,
        throw=False,
    )


def _solver_memory(step_counts, tokens, dim=64, heads=4):
    rows = []
    x = jax.ShapeDtypeStruct((tokens, dim), jnp.float32)
    adjoints = {
        "implicit": eqattn.ImplicitAdjoint(linear_solver=eqattn.Anderson(rtol=1e-30, max_steps=20)),
        "unrolled": eqattn.Unrolled(),
    }
    for steps in step_counts:
        for name, adjoint in adjoints.items():
            layer = _layer(dim, heads, steps, adjoint)
            params, static = eqx.partition(layer, eqx.is_array)

            def loss(params, x, static=static):
                return jnp.sum(eqx.combine(params, static)(x) ** 2)

            temp, compile_s = _temp_bytes(jax.grad(loss), params, x)
            rows.append(
                {
                    "part": "solver",
                    "steps": steps,
                    "case": name,
                    "tokens": tokens,
                    "temp_mb": temp / MB,
                    "compile_s": compile_s,
                }
            )
    return rows


def long_sequence_step(tokens: int = 16384, dim: int = 64, heads: int = 4) -> dict:
    """One Adam step of an `ImplicitAttention` layer on `tokens` tokens (run in a fresh process by
    the suite, so the peak resident memory is this step's)."""
    import resource

    import optax

    layer = eqattn.nn.ImplicitAttention(
        dim,
        heads,
        key=jax.random.key(0),
        solver=eqattn.Anderson(rtol=1e-3, max_steps=15),
        adjoint=eqattn.ImplicitAdjoint(linear_solver=eqattn.Anderson(rtol=1e-3, max_steps=15)),
        throw=False,
    )
    x = jax.random.normal(jax.random.key(1), (tokens, dim), jnp.float32)
    target = jax.random.normal(jax.random.key(2), (tokens, dim), jnp.float32)
    optimizer = optax.adam(1e-3)
    state = optimizer.init(eqx.filter(layer, eqx.is_array))

    @eqx.filter_jit
    def step(layer, state, x, target):
        def loss(layer):
            return jnp.mean((layer(x) - target) ** 2)

        value, grads = eqx.filter_value_and_grad(loss)(layer)
        updates, state = optimizer.update(grads, state, eqx.filter(layer, eqx.is_array))
        return eqx.apply_updates(layer, updates), state, value

    t0 = time.perf_counter()
    compiled = step.lower(layer, state, x, target).compile()
    compile_s = time.perf_counter() - t0
    temp = compiled.compiled.memory_analysis().temp_size_in_bytes
    t0 = time.perf_counter()
    layer, state, value = compiled(layer, state, x, target)
    jax.block_until_ready(value)
    step_s = time.perf_counter() - t0
    eq = eqx.filter_jit(lambda layer, x: layer.equilibrium(x))(layer, x)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    stats = jax.devices()[0].memory_stats() or {}  # accelerators: the allocator's peak
    return {
        "part": "long-sequence",
        "tokens": tokens,
        "dim": dim,
        "heads": heads,
        "loss": float(value),
        "temp_mb": temp / MB,
        "peak_rss_mb": peak_kb / 1024,
        "device_peak_mb": stats["peak_bytes_in_use"] / MB if "peak_bytes_in_use" in stats else None,
        "step_s": step_s,
        "compile_s": compile_s,
        "forward_steps": int(eq.steps),
        "forward_relative_residual": float(eq.relative_residual),
    }


def run(quick: bool = False) -> tuple[list[dict], dict]:
    sizes = [256, 2048] if quick else [1024, 4096, 16384]
    rows = _core_memory(sizes)
    rows += _core_time(256 if quick else 2048, repeats=3 if quick else 10)
    rows += _solver_memory([2, 8] if quick else [5, 10, 20, 40], tokens=16 if quick else 256)
    print("core, forward+backward: temporary memory (compiled)")
    print_table(
        [r for r in rows if r["part"] == "core"],
        [
            ("n", "n=m", "d"),
            ("case", "case", "s"),
            ("chunk", "chunk", "d"),
            ("temp_mb", "temp MB", ".1f"),
            ("of_dense", "of dense", ".1%"),
            ("of_single_pass", "of single pass", ".1%"),
        ],
    )
    print("\ncore, forward+backward: time")
    print_table(
        [r for r in rows if r["part"] == "core-time"],
        [
            ("n", "n=m", "d"),
            ("case", "case", "s"),
            ("ms", "ms", ".1f"),
            ("ratio_to_single_pass", "x single pass", ".2f"),
        ],
    )
    print("\nImplicitAttention gradient: temporary memory vs solver steps")
    print_table(
        [r for r in rows if r["part"] == "solver"],
        [("steps", "steps", "d"), ("case", "backward", "s"), ("temp_mb", "temp MB", ".2f")],
    )
    if not quick:
        long = in_fresh_process("benchmarks.memory", "long_sequence_step")
        rows.append(long)
        print(
            f"\nImplicitAttention training step, {long['tokens']} tokens: "
            f"{long['temp_mb']:.0f} MB temporary (compiled), peak resident "
            f"{long['peak_rss_mb']:.0f} MB, {long['step_s']:.1f} s"
        )
    return rows, {"batch_heads": BH, "dim": DIM}


def _share(x: float) -> str:
    """A percentage, with two significant figures below 0.1%."""
    return f"{x:.1%}" if x >= 0.001 else f"{100 * x:.2g}%"


def table(payload) -> str:
    """The memory results file as Markdown (the Benchmarks page's table)."""
    rows = payload["rows"]
    core = [
        r for r in rows if r["part"] == "core" and r["n"] == max(r["n"] for r in rows if "n" in r)
    ]
    t = {r["case"]: r for r in rows if r["part"] == "core-time"}
    solver = [r for r in rows if r["part"] == "solver"]
    long = [r for r in rows if r["part"] == "long-sequence"]
    timed = [f"fwd+bwd ms at n = m = {next(iter(t.values()))['n']}"] if t else []
    text = markdown_table(
        [f"case (n = m = {core[0]['n']})", "temp MB", "of dense", *timed],
        [
            [r["case"], f"{r['temp_mb']:.1f}", _share(r["of_dense"])]
            + ([f"{t[r['case']]['ms']:.3g}" if r["case"] in t else ""] if t else [])
            for r in core
        ],
    )
    if payload.get("compiled"):
        text += (
            f"\n\nCompiled, not run: the attention core's forward+backward "
            f"(batch x heads = {payload['batch_heads']}, d = {payload['dim']}, "
            f"{payload['dtype']}), temporaries from the compiled program."
        )
    steps = sorted({r["steps"] for r in solver})
    text += (
        ""
        if not solver
        else "\n\n"
        + markdown_table(
            ["backward"] + [f"{s} steps (MB)" for s in steps],
            [
                [case]
                + [
                    f"{next(r['temp_mb'] for r in solver if r['case'] == case and r['steps'] == s):.2f}"
                    for s in steps
                ]
                for case in ("implicit", "unrolled")
            ],
        )
    )
    for r in long:
        peak = r["device_peak_mb"] if r.get("device_peak_mb") else r["peak_rss_mb"]
        where = "device peak" if r.get("device_peak_mb") else "process peak resident"
        text += (
            f"\n\nImplicitAttention training step on {r['tokens']} tokens (width {r['dim']}, "
            f"{r['heads']} heads): {r['temp_mb']:.0f} MB temporary (compiled), {where} "
            f"{peak:.0f} MB, {r['step_s']:.2f} s."
        )
    return text
