"""`causal`: causal attention (`causal=True`) against the same attention with a dense causal mask
and without causality.

Forward+backward (the gradient with respect to queries, keys and values of `sum(out * c)`) at
batch 1 x 8 heads, d = 64, n = m (float32 on a CPU; bfloat16 on a GPU, where cuDNN's causal
kernel, `jax.nn.dot_product_attention(is_causal=True, implementation="cudnn")`, is the anchor).
Cases: `xla` (`jax.nn.dot_product_attention(is_causal=True, implementation="xla")`: a dense
causal mask, the baseline), `eqattn dense mask` (`eqattn.attention` given the `n x n` mask),
`eqattn causal` (`causal=True`, "auto"), `eqattn not causal` (the same without causality: the
work causality saves), and off CPU `eqattn pallas causal` and `cudnn causal`. Timed round-robin
after a warm-up; each case's result is checked against the baseline's (relative error).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import eqattn

from ._harness import markdown_table, print_table, time_interleaved

HEADS, DIM = 8, 64


def _cases(n: int, gpu: bool):
    scale = DIM**-0.5
    tril = jnp.tril(jnp.ones((n, n), bool))

    def ours(**kw):
        return lambda q, k, v: eqattn.attention(
            q.swapaxes(1, 2), k.swapaxes(1, 2), v.swapaxes(1, 2), beta=scale, **kw
        ).swapaxes(1, 2)

    def dpa(implementation):
        return lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, scale=scale, is_causal=True, implementation=implementation
        )

    cases = {
        "xla": dpa("xla"),
        "eqattn dense mask": ours(mask=tril),
        "eqattn causal": ours(causal=True),
        "eqattn not causal": ours(),
    }
    if gpu:
        cases["eqattn pallas causal"] = ours(causal=True, implementation="pallas")
        cases["cudnn causal"] = dpa("cudnn")
    return cases


def _grad(fn):
    def loss(q, k, v, c):
        return jnp.sum(fn(q, k, v).astype(jnp.float32) * c)

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def run(quick: bool = False) -> tuple[list[dict], dict]:
    gpu = jax.default_backend() == "gpu"
    dtype = jnp.bfloat16 if gpu else jnp.float32
    sizes = [64, 128] if quick else ([4096, 16384] if gpu else [1024, 2048])
    rows = []
    for n in sizes:
        keys = jax.random.split(jax.random.key(n), 4)
        q, k, v = (jax.random.normal(kk, (1, n, HEADS, DIM), dtype) for kk in keys[:3])
        c = jax.random.normal(keys[3], (1, n, HEADS, DIM), jnp.float32)
        cases = {name: (_grad(fn), q, k, v, c) for name, fn in _cases(n, gpu).items()}
        errors: dict = {}
        timed = time_interleaved(cases, repeats=3 if quick else 10, errors=errors)
        base = timed["xla"]
        ref = [np.asarray(g, np.float64) for g in base["output"]]
        for name in cases:
            row = {"n": n, "dtype": jnp.dtype(dtype).name, "case": name}
            if name in errors:
                rows.append({**row, "error": errors[name]})
                continue
            t = timed[name]
            grads = [np.asarray(g, np.float64) for g in t["output"]]
            err = max(np.linalg.norm(g - r) / np.linalg.norm(r) for g, r in zip(grads, ref))
            rows.append(
                {
                    **row,
                    "ms": 1e3 * t["median_s"],
                    "x_xla": t["median_s"] / base["median_s"],
                    "rel_error": float(err) if name != "eqattn not causal" else None,
                    "compile_s": t["compile_s"],
                    "times_s": t["times_s"],
                }
            )
    print_table(
        rows,
        [
            ("n", "n = m", "d"),
            ("dtype", "dtype", "s"),
            ("case", "case", "s"),
            ("ms", "fwd+bwd ms", ".3f"),
            ("x_xla", "x xla", ".2f"),
            ("rel_error", "rel. error", ".1e"),
        ],
    )
    return rows, {"heads": HEADS, "dim": DIM}


def table(payload) -> str:
    """One row per size and case: forward+backward time, its ratio to XLA's dense causal mask,
    and the gradients' relative error against it."""
    return markdown_table(
        ["n = m", "dtype", "case", "fwd+bwd ms", "x xla", "rel. error vs xla"],
        [
            [r["n"], r["dtype"], r["case"], "", "", f"failed: {r['error'].splitlines()[0][:80]}"]
            if r.get("error")
            else [
                r["n"],
                r["dtype"],
                r["case"],
                f"{r['ms']:.3g}",
                f"{r['x_xla']:.2f}",
                "" if r["rel_error"] is None else f"{r['rel_error']:.1e}",
            ]
            for r in payload["rows"]
        ],
    )
