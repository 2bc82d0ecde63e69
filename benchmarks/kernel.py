"""`kernel`: tile sizes of eqattn's fused Pallas kernel (`implementation="pallas"`), swept.

For each dtype (float32 and bfloat16 on an accelerator) and head size d = 64, 128, at
n = m = 4096 and 8 heads: the forward pass under each forward tiling (on GPUs block_q x block_k,
warps, pipeline stages), then forward+backward (with the log-sum-exp's cotangent) under each
backward tiling, the forward fixed at the default. On TPUs the Mosaic kernels' block_q x block_k,
one tiling for both passes. Every configuration's result is checked against XLA's dense attention
in the same run (relative error), a configuration that fails to compile (shared memory,
registers, VMEM) is recorded with its error, and each row's time is reported as a ratio to the
default tiles (`default_blocks` of `eqattn._attention._pallas._triton` or `._mosaic`), timed round-robin
with it. On CPU the kernel is interpreted: `--quick` runs a few tiny cases to exercise the code;
times mean nothing there.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from eqattn._attention._pallas import _attention, _mosaic, _triton

from ._harness import markdown_table, print_table, time_interleaved

HEADS = 8


def _variant() -> str:
    return "mosaic" if jax.default_backend() == "tpu" else "triton"


def _configs(quick: bool, variant: str):
    """(forward tilings, backward tilings) to sweep, as `Blocks` fields to replace."""
    Tile = _triton.Tile
    if quick:
        return [dict(forward=Tile(16, 16)), dict(forward=Tile(32, 16))], [
            dict(dkdv=Tile(16, 16), dq=Tile(16, 16))
        ]
    if variant == "mosaic":
        both = [
            dict(block_q=bq, block_k=bk)
            for bq, bk in ((128, 128), (128, 256), (256, 128), (256, 256), (512, 512))
        ]
        return both, both
    forward = [
        dict(forward=Tile(bq, bk, w, s))
        for bq, bk in ((64, 64), (128, 32), (128, 64), (128, 128))
        for w in (4, 8)
        for s in (2, 3)
    ]
    backward = [
        dict(dkdv=Tile(bq, bk, w), dq=Tile(bq, bk, w))
        for bq, bk in ((32, 32), (64, 32), (64, 64), (128, 64))
        for w in (4, 8)
    ]
    return forward, backward


def _cases(quick: bool):
    if quick:
        return [(jnp.float32, 64, 16)]
    accelerator = jax.default_backend() in ("gpu", "tpu")
    dtypes = [jnp.float32, jnp.bfloat16] if accelerator else [jnp.float32]
    return [(dtype, d, 4096) for dtype in dtypes for d in (64, 128)]


def _functions(config, scale):
    def forward(q, k, v):
        return _attention.attention_core(q, k, v, scale, None, config)

    def forward_backward(q, k, v, c):
        def loss(q, k, v):
            out, lse = _attention.attention_core(q, k, v, scale, None, config)
            return jnp.sum(out.astype(jnp.float32) * c) + jnp.sum(lse.astype(jnp.float32))

        return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    return forward, forward_backward


def _reference(q, k, v, c, scale: float):
    """XLA's dense attention and the log-sum-exp, and their gradients, for the same loss."""

    def loss(q, k, v):
        t = lambda x: x[:, :, None, :]  # noqa: E731  [b, n, 1 head, d]
        out = jax.nn.dot_product_attention(t(q), t(k), t(v), scale=scale, implementation="xla")
        s = jnp.einsum("bnd,bmd->bnm", q.astype(jnp.float32), k.astype(jnp.float32)) * scale
        lse = jax.nn.logsumexp(s, axis=-1)
        return jnp.sum(out[:, :, 0].astype(jnp.float32) * c) + jnp.sum(lse), out[:, :, 0]

    (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
    return out, grads


def _error(a, b) -> float:
    a, b = (np.asarray(x, np.float64) for x in (a, b))
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def run(quick: bool = False) -> tuple[list[dict], dict]:
    repeats = 3 if quick else 10
    variant = _variant()
    kernels = {"triton": _triton, "mosaic": _mosaic}[variant]
    forward_configs, backward_configs = _configs(quick, variant)
    rows = []
    for dtype, d, n in _cases(quick):
        dname = jnp.dtype(dtype).name
        keys = jax.random.split(jax.random.key(d), 4)
        q, k, v = (jax.random.normal(key, (HEADS, n, d), dtype) for key in keys[:3])
        c = jax.random.normal(keys[3], (HEADS, n, d), jnp.float32)
        scale = jnp.full((HEADS,), d**-0.5, jnp.float32)
        ref_out, ref_grads = jax.jit(_reference, static_argnums=4)(q, k, v, c, d**-0.5)
        default = kernels.default_blocks(
            n, n, d, d, dtype, compiled=jax.default_backend() in ("gpu", "tpu")
        )
        if default is None:  # refused: no spill-free tiling (see _triton.default_blocks)
            continue
        for mode, sweep in (("forward", forward_configs), ("forward+backward", backward_configs)):
            tilings = {"default": default}
            for fields in sweep:
                blocks = dataclasses.replace(default, **fields)
                if blocks != default:
                    tilings.setdefault(_name(blocks, mode), blocks)
            cases = {}
            for name, blocks in tilings.items():
                fwd, fwd_bwd = _functions(_attention.Config(**{variant: blocks}), scale)
                cases[name] = (fwd, q, k, v) if mode == "forward" else (fwd_bwd, q, k, v, c)
            errors = {}  # compile errors (shared memory, registers) are results too
            timings = time_interleaved(cases, repeats=repeats, errors=errors)
            base = timings["default"]["median_s"] if "default" in timings else None
            for name, blocks in tilings.items():
                row = {"dtype": dname, "d": d, "n": n, "mode": mode, "tiling": name}
                row.update(dataclasses.asdict(blocks))
                if name in errors:
                    rows.append({**row, "error": errors[name]})
                    continue
                t = timings[name]
                got = t["output"]
                if mode == "forward":
                    err = _error(got[0], ref_out)
                else:
                    err = max(_error(g, r) for g, r in zip(got, ref_grads))
                rows.append(
                    {
                        **row,
                        "ms": 1e3 * t["median_s"],
                        "ratio_to_default": None if base is None else t["median_s"] / base,
                        "rel_error": err,
                        "compile_s": t["compile_s"],
                        "times_s": t["times_s"],
                    }
                )
    print_table(
        rows,
        [
            ("dtype", "dtype", "s"),
            ("d", "d", "d"),
            ("mode", "mode", "s"),
            ("tiling", "tiling", "s"),
            ("ms", "ms", ".3f"),
            ("ratio_to_default", "x default", ".2f"),
            ("rel_error", "rel. error", ".1e"),
        ],
    )
    for r in rows:
        if "error" in r:
            print(f"{r['dtype']} d={r['d']} {r['mode']} {r['tiling']}: {r['error'][:120]}")
    return rows, {"heads": HEADS, "kernels": variant}


def _name(blocks, mode: str) -> str:
    if isinstance(blocks, _mosaic.Blocks):
        return f"{blocks.block_q}x{blocks.block_k}"
    tiles = [("", blocks.forward)] if mode == "forward" else [("dkdv ", blocks.dkdv)]
    tiles += [] if mode == "forward" else [("dq ", blocks.dq)]
    return " ".join(
        f"{label}{t.block_q}x{t.block_k} w{t.num_warps} s{t.num_stages}" for label, t in tiles
    )


def table(payload) -> str:
    """The fastest tiling of each case against the default one."""
    rows = payload["rows"]
    out = []
    for key in dict.fromkeys((r["dtype"], r["d"], r["n"], r["mode"]) for r in rows):
        case = [r for r in rows if (r["dtype"], r["d"], r["n"], r["mode"]) == key]
        timed = [r for r in case if r.get("ms") is not None]
        default = next((r for r in timed if r["tiling"] == "default"), None)
        best = min(timed, key=lambda r: r["ms"]) if timed else None
        out.append(
            [
                *key,
                "" if default is None else f"{default['ms']:.3g}",
                "" if best is None else best["tiling"],
                "" if best is None else f"{best['ms']:.3g} ({best['ratio_to_default']:.2f}x)",
                f"{max(r['rel_error'] for r in timed):.1e}" if timed else "",
                f"{len(timed)} / {len(case)}",
            ]
        )
    return markdown_table(
        [
            "dtype",
            "d",
            "n = m",
            "mode",
            "default ms",
            "fastest tiling",
            "its ms (x default)",
            "max rel. error vs XLA",
            "compiled / tried",
        ],
        out,
    )
