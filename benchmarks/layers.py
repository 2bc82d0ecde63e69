"""`layers`: training steps of implicit models against explicit transformers of equal parameters.

Models (classification of `n` tokens of width 64 into 10 classes, batch 16, float32, AdamW):
- `DEQTransformer(dim=64, heads=4)`: one weight-tied block at equilibrium (Anderson, rtol 1e-3,
  at most 30 steps; implicit backward by Anderson to rtol 1e-4, best effort past 50 steps).
- `Transformer(dim=64, heads=4, depth=1)`: the same block once, explicit (about equal parameters).
- `Transformer(dim=32, heads=4, depth=4)`: four explicit blocks of half the width (about equal
  parameters, a comparable depth) -- the baseline of the ratios.

Per model: the median time of one jitted training step (forward, backward, optimizer update), the
tokens per second that gives, the compiled step's temporary memory, its compile time and (for the
DEQ) the mean number of solver steps. Cases are timed round-robin.
"""

from __future__ import annotations

import time

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

import eqattn

from ._harness import markdown_table, print_table, time_interleaved

BATCH, FEATURES, CLASSES = 16, 64, 10
MB = 2**20


def deq_model(n, key):
    """The DEQTransformer of these benchmarks, with its defaults: Anderson to rtol 1e-3 (or what
    the matmul precision can resolve, e.g. TF32 on GPUs) within 30 steps, and the implicit
    backward solved to the same tolerance; a backward that stops short keeps its best effort
    (the layer's `throw=False`)."""
    return eqattn.nn.DEQTransformer(CLASSES, 64, 4, key=key, in_features=FEATURES, max_len=n)


def _models(n):
    key = jax.random.key(0)
    common = dict(in_features=FEATURES, max_len=n)
    return {
        "DEQTransformer d=64": deq_model(n, key),
        "Transformer d=64 x1": eqattn.nn.Transformer(CLASSES, 64, 4, 1, key=key, **common),
        "Transformer d=32 x4": eqattn.nn.Transformer(CLASSES, 32, 4, 4, key=key, **common),
    }


def _step_fn(model):
    """A pure training step over (params, opt_state, x, y) for `time_interleaved`."""
    params, static = eqx.partition(model, eqx.is_inexact_array)
    optimizer = optax.adamw(1e-3)

    def step(params, state, x, y):
        def loss(params):
            logits = jax.vmap(eqx.combine(params, static))(x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        value, grads = jax.value_and_grad(loss)(params)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    return step, params, optimizer.init(params)


def _deq_steps(model, x):
    eq = eqx.filter_jit(lambda m, x: jax.vmap(m.forward)(x)[1])(model, x)
    return float(jnp.mean(eq.steps))


def run(quick: bool = False) -> tuple[list[dict], dict]:
    sizes = [16] if quick else [64, 256, 1024]
    repeats = 3 if quick else 10
    rows = []
    for n in sizes:
        kx, ky = jax.random.split(jax.random.key(n))
        x = jax.random.normal(kx, (BATCH, n, FEATURES), jnp.float32)
        y = jax.random.randint(ky, (BATCH,), 0, CLASSES)
        cases, info = {}, {}
        for name, model in _models(n).items():
            step, params, state = _step_fn(model)
            t0 = time.perf_counter()
            compiled = jax.jit(step).lower(params, state, x, y).compile()
            info[name] = {
                "params": sum(p.size for p in jax.tree.leaves(params)),
                "temp_mb": compiled.memory_analysis().temp_size_in_bytes / MB,
                "solver_steps": _deq_steps(model, x) if "DEQ" in name else None,
                "compile_s": time.perf_counter() - t0,  # the first compile (later ones hit caches)
            }
            cases[name] = (step, params, state, x, y)
        timings = time_interleaved(cases, repeats=repeats)
        base = timings["Transformer d=32 x4"]["median_s"]
        for name, t in timings.items():
            rows.append(
                {
                    "n": n,
                    "model": name,
                    **info[name],
                    "step_ms": 1e3 * t["median_s"],
                    "ratio_to_baseline": t["median_s"] / base,
                    "tokens_per_s": BATCH * n / t["median_s"],
                    "times_s": t["times_s"],
                }
            )
    print_table(
        rows,
        [
            ("n", "tokens", "d"),
            ("model", "model", "s"),
            ("params", "params", "d"),
            ("step_ms", "step ms", ".2f"),
            ("ratio_to_baseline", "x d=32x4", ".2f"),
            ("tokens_per_s", "tokens/s", ".3g"),
            ("temp_mb", "temp MB", ".1f"),
            ("solver_steps", "solver steps", ".1f"),
            ("compile_s", "compile s", ".2f"),
        ],
    )
    return rows, {"batch": BATCH, "features": FEATURES, "classes": CLASSES}


def table(payload) -> str:
    """The layers results file as Markdown (the Benchmarks page's table)."""
    return markdown_table(
        [
            "tokens",
            "model",
            "params",
            "step ms",
            "x Transformer d=32 x4",
            "tokens/s",
            "temp MB",
            "solver steps",
        ],
        [
            [
                r["n"],
                r["model"],
                r["params"],
                f"{r['step_ms']:.3g}",
                f"{r['ratio_to_baseline']:.2f}",
                f"{r['tokens_per_s']:.3g}",
                f"{r['temp_mb']:.1f}",
                "" if r["solver_steps"] is None else f"{r['solver_steps']:.1f}",
            ]
            for r in payload["rows"]
        ],
    )
