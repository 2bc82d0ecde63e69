"""`core`: the log-normalizer core against `jax.nn.dot_product_attention` (XLA) and naive attention.

Forward times `eqattn.attention_with_lse` (which also returns the log-sum-exp); forward+backward
times the gradient, with respect to queries, keys and values, of `sum(out * c)` plus, for eqattn's
cases, `sum(lse * c[..., 0])` (so the log-sum-exp's cotangent is part of the backward pass). Each
input is in its implementation's native layout: `[batch, heads, n, d]` for eqattn, the naive
version and PyTorch, `[batch, n, heads, d]` for `jax.nn.dot_product_attention`.

Cases: `xla` (the baseline), `eqattn` ("auto"), `eqattn-chunked`, `naive`; off CPU
`eqattn-pallas` (eqattn's fused kernel, `implementation="pallas"`; on CPU it is interpreted and
only the `--quick` run includes it, to exercise the code, not to time it); on a GPU with bf16,
`cudnn` (`jax.nn.dot_product_attention(implementation="cudnn")`, no log-sum-exp) and
`eqattn.attention(auto)`; and, where PyTorch with CUDA is installed, `torch-sdpa-flash`
(`torch.nn.functional.scaled_dot_product_attention` with its flash backend, bf16) as an outside
anchor.

FLOPs count the matmuls only: 4 n m d per head forward, 10 n m d forward+backward (the usual
attention accounting; recomputation in the backward pass is not counted). The fraction is of a
large matmul's rate in the same dtype, measured in the same run. The implementations are timed
round-robin (one call of each per round), so their ratios compare calls made at the same moments.

Bytes count the least memory traffic each case needs, a model (not a measurement): the inputs
read and the outputs written once (forward: q, k, v, out and, for eqattn, the float32 lse;
forward+backward: q, k, v, c, dq, dk, dv and the saved out/lse), plus, for the implementations
that hold the `n x m` weights in memory (xla, naive and eqattn's single pass), one float32 write
and read of that matrix per `n x m` array the pass makes (forward 1; forward+backward 3: the
weights, the recomputed or saved weights, and their gradient). The fused kernels (chunked,
Pallas, cuDNN, PyTorch's flash) keep those tiles on chip and move only the inputs and outputs.
Achieved bytes/s is compared with an elementwise pass over a large array measured in the same
run (the bandwidth ceiling); a case whose fraction of bandwidth exceeds its fraction of the matmul
rate is limited by memory.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import eqattn

from . import _torch_sdpa
from ._harness import copy_bandwidth, markdown_table, matmul_rate, print_table, time_interleaved

HEADS, DIM = 8, 64


def _naive(q, k, v, scale):
    w = jax.nn.softmax(scale * jnp.einsum("bhnd,bhmd->bhnm", q, k), axis=-1)
    return jnp.einsum("bhnm,bhmd->bhnd", w, v)


def _chunk(n: int) -> int:
    return 1024 if n >= 4096 else n // 4


def _implementations(scale, n, dtype, quick: bool):
    """(name, function, whether it takes the [b, n, h, d] layout)."""
    backend = jax.default_backend()

    def ours(q, k, v):
        return eqattn.attention_with_lse(q, k, v, beta=scale)

    def chunked(q, k, v):
        return eqattn.attention_with_lse(q, k, v, beta=scale, chunk_size=_chunk(n))

    def pallas(q, k, v):
        return eqattn.attention_with_lse(q, k, v, beta=scale, implementation="pallas")

    def xla(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, scale=scale, implementation="xla")

    def naive(q, k, v):
        return _naive(q, k, v, scale)

    impls = [
        ("xla", xla, True),
        ("eqattn", ours, False),
        ("eqattn-chunked", chunked, False),
        ("naive", naive, False),
    ]
    if backend == "gpu" or quick:
        impls.append(("eqattn-pallas", pallas, False))
    if backend == "gpu" and dtype == jnp.bfloat16:
        # cuDNN's kernel, directly and as eqattn.attention's "auto" choice

        def cudnn(q, k, v):
            return jax.nn.dot_product_attention(q, k, v, scale=scale, implementation="cudnn")

        def ours_auto(q, k, v):
            return eqattn.attention(q, k, v, beta=scale)

        impls += [("cudnn", cudnn, True), ("eqattn.attention(auto)", ours_auto, False)]
    return impls


_FUSED = ("eqattn-chunked", "eqattn-pallas", "cudnn", "eqattn.attention(auto)", "torch-sdpa-flash")
_NO_LSE = ("eqattn.attention(auto)",)


def _bytes(impl: str, mode: str, n: int, itemsize: int) -> int:
    """The least bytes a case moves (see the module docstring), for batch 1 and `HEADS` heads."""
    vec = n * DIM * itemsize
    lse = 4 * n if impl.startswith("eqattn") and impl not in _NO_LSE else 0
    if mode == "forward":
        io = 4 * vec + lse  # q, k, v read; out written
        nm_arrays = 1
    else:  # q, k, v, c read; dq, dk, dv written; out (and lse) saved and read back
        io = 7 * vec + 2 * (vec + lse)
        nm_arrays = 3
    nm = 0 if impl in _FUSED else nm_arrays * 2 * 4 * n * n
    return HEADS * (io + nm)


def _grad(fn):
    def loss(q, k, v, c):
        out = fn(q, k, v)
        if not isinstance(out, tuple):
            return jnp.sum(out * c)
        out, lse = out
        return jnp.sum(out * c) + jnp.sum(lse * c[..., 0])

    return jax.grad(loss, argnums=(0, 1, 2))


def _configs(quick: bool):
    """(dtype, sizes) to run: on CPU float32; on a GPU float32 and bfloat16, longer sequences."""
    if quick:
        return [(jnp.float32, [128, 256])]
    if jax.default_backend() == "gpu":
        return [(jnp.float32, [1024, 4096, 16384]), (jnp.bfloat16, [1024, 4096, 16384])]
    return [(jnp.float32, [256, 1024, 2048])]


def run(quick: bool = False) -> tuple[list[dict], dict]:
    repeats = 3 if quick else 10
    gpu = jax.default_backend() == "gpu"
    scale = DIM**-0.5
    rows, rates, torch_version = [], {}, None
    bandwidth = copy_bandwidth(1 << 26 if quick else 1 << 28, repeats)
    for dtype, sizes in _configs(quick):
        dname = jnp.dtype(dtype).name
        rates[dname] = matmul_rate(512 if quick else (8192 if gpu else 2048), repeats, dtype)
        for n in sizes:
            keys = jax.random.split(jax.random.key(n), 4)
            q, k, v, c = (jax.random.normal(key, (1, HEADS, n, DIM), dtype) for key in keys)
            flops = {
                "forward": 4 * n * n * DIM * HEADS,
                "forward+backward": 10 * n * n * DIM * HEADS,
            }
            cases = {}
            for name, fn, transpose in _implementations(scale, n, dtype, quick):
                args = tuple(jnp.swapaxes(x, 1, 2) if transpose else x for x in (q, k, v, c))
                cases[(name, "forward")] = (fn, *args[:3])
                cases[(name, "forward+backward")] = (_grad(fn), *args)
            if _torch_sdpa.available(dtype):
                torch_version = _torch_sdpa.version()
                for mode, call in _torch_sdpa.cases(q, k, v, c, scale).items():
                    cases[("torch-sdpa-flash", mode)] = (call,)
            timings = time_interleaved(cases, repeats=repeats)
            for (name, mode), t in timings.items():
                base = timings[("xla", mode)]["median_s"]
                nbytes = _bytes(name, mode, n, jnp.dtype(dtype).itemsize)
                rows.append(
                    {
                        "dtype": dname,
                        "n": n,
                        "mode": mode,
                        "impl": name,
                        "chunk": _chunk(n) if name == "eqattn-chunked" else None,
                        "ms": 1e3 * t["median_s"],
                        "ratio_to_xla": t["median_s"] / base,
                        "gflops": flops[mode] / t["median_s"] / 1e9,
                        "frac_matmul": flops[mode] / t["median_s"] / rates[dname],
                        "bytes": nbytes,
                        "gbps": nbytes / t["median_s"] / 1e9,
                        "frac_bandwidth": nbytes / t["median_s"] / bandwidth,
                        "compile_s": t["compile_s"],
                        "times_s": t["times_s"],
                    }
                )
    for dname, rate in rates.items():
        print(f"matmul rate: {rate / 1e9:.0f} GFLOP/s ({dname})")
    print(f"memory bandwidth (elementwise pass): {bandwidth / 1e9:.1f} GB/s")
    print_table(
        rows,
        [
            ("dtype", "dtype", "s"),
            ("n", "n=m", "d"),
            ("mode", "mode", "s"),
            ("impl", "impl", "s"),
            ("ms", "ms", ".3f"),
            ("ratio_to_xla", "x xla", ".2f"),
            ("gflops", "GFLOP/s", ".1f"),
            ("frac_matmul", "of matmul", ".0%"),
            ("gbps", "GB/s", ".1f"),
            ("frac_bandwidth", "of bw", ".0%"),
            ("compile_s", "compile s", ".2f"),
        ],
    )
    extra = {
        "matmul_gflops": {k: r / 1e9 for k, r in rates.items()},
        "bandwidth_gbps": bandwidth / 1e9,
        "heads": HEADS,
        "dim": DIM,
        "torch": torch_version,
    }
    return rows, extra


# Columns beside eqattn's default pass, each where its results file has it.
_CORE_EXTRA = (
    ("eqattn-pallas", "eqattn pallas kernel ms (x xla)"),
    ("eqattn.attention(auto)", "eqattn.attention, auto (cuDNN) ms (x xla)"),
    ("cudnn", "cuDNN ms (x xla)"),
    ("torch-sdpa-flash", "PyTorch SDPA flash ms (x xla)"),
)


def table(payload) -> str:
    """The core results file as Markdown (the Benchmarks page's table)."""
    rows = payload["rows"]
    by = {(r.get("dtype", "float32"), r["n"], r["mode"], r["impl"]): r for r in rows}
    present = {r["impl"] for r in rows}
    extra = [(impl, header) for impl, header in _CORE_EXTRA if impl in present]

    def cell(r):
        return "" if r is None else f"{r['ms']:.3g} ({r['ratio_to_xla']:.2f}x)"

    out = []
    for (dtype, n, mode, impl), r in by.items():
        if impl != "xla":
            continue
        ours = by[(dtype, n, mode, "eqattn")]
        out.append(
            [
                dtype,
                n,
                mode,
                f"{r['ms']:.3g}",
                cell(ours),
                f"{ours['frac_matmul']:.0%}",
                f"{ours['frac_bandwidth']:.0%}" if "frac_bandwidth" in ours else "",
            ]
            + [cell(by.get((dtype, n, mode, name))) for name, _ in extra]
        )
    return markdown_table(
        [
            "dtype",
            "n = m",
            "mode",
            "xla ms",
            "eqattn ms (x xla)",
            "eqattn % of matmul",
            "eqattn % of bandwidth",
        ]
        + [header for _, header in extra],
        out,
    )
