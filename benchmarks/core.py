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


def _implementations(scale):
    def ours(q, k, v):
        return eqattn.attention_with_lse(q, k, v, beta=scale)

    def xla(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, scale=scale, implementation="xla")

    def naive(q, k, v):
        return _naive(q, k, v, scale)

    # (name, fn, layout transpose from [b, h, n, d])
    return [("xla", xla, True), ("eqattn", ours, False), ("naive", naive, False)]


def _grad(fn):
    def loss(q, k, v, c):
        out = fn(q, k, v)
        out = out[0] if isinstance(out, tuple) else out
        return jnp.sum(out * c)

    return jax.grad(loss, argnums=(0, 1, 2))


def run(quick: bool = False) -> tuple[list[dict], dict]:
    sizes = [128, 256] if quick else [256, 1024, 2048]
    repeats = 3 if quick else 10
    rate = matmul_rate(512 if quick else 2048, repeats=repeats)
    scale = DIM**-0.5
    rows = []
    for n in sizes:
        keys = jax.random.split(jax.random.key(n), 4)
        q, k, v, c = (jax.random.normal(key, (1, HEADS, n, DIM), jnp.float32) for key in keys)
        flops = {"forward": 4 * n * n * DIM * HEADS, "forward+backward": 10 * n * n * DIM * HEADS}
        cases = {}
        for name, fn, transpose in _implementations(scale):
            args = tuple(jnp.swapaxes(x, 1, 2) if transpose else x for x in (q, k, v, c))
            cases[(name, "forward")] = (fn, *args[:3])
            cases[(name, "forward+backward")] = (_grad(fn), *args)
        timings = time_interleaved(cases, repeats=repeats)
        for (name, mode), t in timings.items():
            base = timings[("xla", mode)]["median_s"]
            rows.append(
                {
                    "n": n,
                    "mode": mode,
                    "impl": name,
                    "ms": 1e3 * t["median_s"],
                    "ratio_to_xla": t["median_s"] / base,
                    "gflops": flops[mode] / t["median_s"] / 1e9,
                    "frac_matmul": flops[mode] / t["median_s"] / rate,
                    "compile_s": t["compile_s"],
                    "times_s": t["times_s"],
                }
            )
    print(f"matmul rate: {rate / 1e9:.0f} GFLOP/s (float32)")
    print_table(
        rows,
        [
            ("n", "n=m", "d"),
            ("mode", "mode", "s"),
            ("impl", "impl", "s"),
            ("ms", "ms", ".2f"),
            ("ratio_to_xla", "x xla", ".2f"),
            ("gflops", "GFLOP/s", ".1f"),
            ("frac_matmul", "of matmul", ".0%"),
            ("compile_s", "compile s", ".2f"),
        ],
    )
    return rows, {"matmul_gflops": rate / 1e9, "heads": HEADS, "dim": DIM}
