"""`core`: the log-normalizer core against `jax.nn.dot_product_attention` (XLA) and naive attention.

Forward times `eqattn.attention_with_lse` (which also returns the log-sum-exp); forward+backward
times the gradient of `sum(out * c)` with respect to queries, keys and values. Each input is in its
implementation's native layout: `[batch, heads, n, d]` for eqattn and the naive version,
`[batch, n, heads, d]` for `jax.nn.dot_product_attention`.

FLOPs count the matmuls only: 4 n m d per head forward, 10 n m d forward+backward (the usual
attention accounting; eqattn's recomputation in the backward pass is not counted). The fraction is
of a large float32 matmul's rate measured in the same run. The implementations are timed
round-robin (one call of each per round), so their ratios compare calls made at the same moments.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import eqattn

from ._harness import matmul_rate, print_table, time_interleaved

HEADS, DIM = 8, 64


def _naive(q, k, v, scale):
    w = jax.nn.softmax(scale * jnp.einsum("bhnd,bhmd->bhnm", q, k), axis=-1)
    return jnp.einsum("bhnm,bhmd->bhnd", w, v)


def _chunk(n: int) -> int:
    return 1024 if n >= 4096 else n // 4


def _implementations(scale, n, fused):
    """(name, function, whether it takes the [b, n, h, d] layout)."""

    def ours(q, k, v):
        return eqattn.attention_with_lse(q, k, v, beta=scale)

    def chunked(q, k, v):
        return eqattn.attention_with_lse(q, k, v, beta=scale, chunk_size=_chunk(n))

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
    if fused:  # a GPU and bf16: cuDNN's kernel, directly and as eqattn.attention's "auto" choice

        def cudnn(q, k, v):
            return jax.nn.dot_product_attention(q, k, v, scale=scale, implementation="cudnn")

        def ours_auto(q, k, v):
            return eqattn.attention(q, k, v, beta=scale)

        impls += [("cudnn", cudnn, True), ("eqattn.attention(auto)", ours_auto, False)]
    return impls


def _grad(fn):
    def loss(q, k, v, c):
        out = fn(q, k, v)
        out = out[0] if isinstance(out, tuple) else out
        return jnp.sum(out * c)

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
    rows, rates = [], {}
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
            for name, fn, transpose in _implementations(scale, n, gpu and dtype == jnp.bfloat16):
                args = tuple(jnp.swapaxes(x, 1, 2) if transpose else x for x in (q, k, v, c))
                cases[(name, "forward")] = (fn, *args[:3])
                cases[(name, "forward+backward")] = (_grad(fn), *args)
            timings = time_interleaved(cases, repeats=repeats)
            for (name, mode), t in timings.items():
                base = timings[("xla", mode)]["median_s"]
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
                        "compile_s": t["compile_s"],
                        "times_s": t["times_s"],
                    }
                )
    for dname, rate in rates.items():
        print(f"matmul rate: {rate / 1e9:.0f} GFLOP/s ({dname})")
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
            ("compile_s", "compile s", ".2f"),
        ],
    )
    extra = {"matmul_gflops": {k: r / 1e9 for k, r in rates.items()}, "heads": HEADS, "dim": DIM}
    return rows, extra
