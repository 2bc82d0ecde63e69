"""The text suite's speed measurements (see `benchmarks.text`): the training step against the
context and the solver's budget, generation's time per token, and one step at context 4096 in a
fresh process."""

from __future__ import annotations

import statistics
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import eqattn
from eqattn.text import TextConfig, TextTask
from eqattn.train import count_params, optimizer_of

from ._harness import External, in_fresh_process, time_interleaved, time_jitted

MB = 2**20


def _step(config: TextConfig, batch):
    """(the training step as a jittable function of arrays, its example arguments)."""
    model = TextTask.build_model(config, jax.random.key(0))
    optimizer = optimizer_of(config, 1000)
    opt_state = optimizer.init(eqx.filter(model, eqx.is_inexact_array))
    step = TextTask.train_step(config, optimizer)
    params, static = eqx.partition(model, eqx.is_array)
    context = config.context
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.integers(0, 256, (batch, context)), jnp.int32)
    labels = (jnp.asarray(rng.integers(0, 256, (batch, context)), jnp.int32), jnp.ones(x.shape))

    def run(params, opt_state, x, labels, key):
        model, opt_state, loss, stats, _ = step(
            eqx.combine(params, static), opt_state, x, labels, key, None
        )
        return eqx.filter(model, eqx.is_array), opt_state, loss, stats

    return run, (params, opt_state, x, labels, jax.random.key(1))


def _context_rows(contexts, tokens_per_step, repeats, size) -> list[dict]:
    rows = []
    for context in contexts:
        batch = max(1, tokens_per_step // context)
        cases = {}
        for model in ("explicit", "deq"):
            fn, args = _step(TextConfig(model=model, context=context, **size), batch)
            cases[model] = (fn, *args)
        timings = time_interleaved(cases, repeats=repeats)
        for model, t in timings.items():
            rows.append(
                {
                    "part": "context",
                    "model": model,
                    "context": context,
                    "batch": batch,
                    "temp_mb": t["temp_bytes"] / MB,
                    "step_ms": 1e3 * t["median_s"],
                    "ratio_to_explicit": t["median_s"] / timings["explicit"]["median_s"],
                    "solver_steps": float(t["output"][3][1]),
                }
            )
        jax.clear_caches()
    return rows


def _solver_rows(budgets, context, batch, repeats, size) -> list[dict]:
    cases = {}
    for steps in budgets:
        config = TextConfig(
            context=context,
            rtol=1e-12,
            max_steps=steps,
            train_steps=steps,
            adjoint="implicit",
            **size,
        )
        fn, args = _step(config, batch)
        cases[steps] = (fn, *args)
    timings = time_interleaved(cases, repeats=repeats)
    jax.clear_caches()
    return [
        {
            "part": "solver",
            "steps": steps,
            "context": context,
            "batch": batch,
            "temp_mb": t["temp_bytes"] / MB,
            "step_ms": 1e3 * t["median_s"],
            "solver_steps": float(t["output"][3][1]),
        }
        for steps, t in timings.items()
    ]


def _generation_cases(model, prompt: int) -> dict[str, tuple]:
    """name: (fn, *args) giving the logits of the token after `prompt` tokens and the solver
    steps it took."""
    params, static = eqx.partition(model, eqx.is_array)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, prompt + 1), jnp.int32)
    _, cache, _ = eqx.filter_jit(eqattn.nn.prefill)(model, tokens[:prompt])

    def cached(params, token, cache):
        logits, _, step = eqattn.nn.extend(eqx.combine(params, static), token, cache)
        return logits, step.steps

    def rerun(params, tokens):  # the whole prefix again (the DEQ from zeros)
        logits, _, step = eqattn.nn.prefill(eqx.combine(params, static), tokens)
        return logits[-1], step.steps

    cases = {"cached": (cached, params, tokens[prompt], cache), "re-run": (rerun, params, tokens)}
    if isinstance(model, eqattn.nn.DEQTransformer):

        def warm(params, tokens, z0):  # the prefix again, from its previous fixed points
            m = eqx.combine(params, static)
            z, eq = m.apply_blocks(m.embedding(tokens)[0], None, inference=True, z0=z0)
            return m.readout(z)[-1], eq.steps

        z = eqx.filter_jit(lambda m, t: m.apply_blocks(m.embedding(t)[0], None, inference=True))(
            model, tokens[:prompt]
        )[0]
        cases["re-solve warm"] = (warm, params, tokens, jnp.concatenate([z, z[-1:]]))
    return cases


BATCHES = (1, 64)
"""Prompts per `eqattn.text.generate` call in the end-to-end rows."""


def _generate_cases(model, prompt: int, context: int) -> tuple[dict[str, tuple], dict]:
    """`eqattn.text.generate` end to end after `prompt` bytes, for few and for many bytes (as
    many as fit the context without a slide), at each of `BATCHES`: the difference is the time
    of the bytes between."""
    from eqattn import text

    data = bytes(np.random.default_rng(0).integers(0, 256, prompt, dtype=np.uint8))
    cases, lengths = {}, {}
    for batch in BATCHES:
        prompts = data if batch == 1 else [data] * batch
        tag = "" if batch == 1 else f" x{batch}"
        # a batch's marginal byte takes ~100x one row's: fewer bytes time it as well
        many = context - prompt - 1 if batch == 1 else min(context - prompt - 1, 128)
        for size, n in (("few", 2), ("many", many)):
            mode = f"generate(){tag} {size}"
            lengths[mode] = n
            call = lambda p=prompts, n=n: text.generate(model, p, n, temperature=1.0)  # noqa: E731
            cases[mode] = (External(call),)
    return cases, lengths


def _generate_row(prompt, model, timings, lengths, base, batch: int = 1) -> dict:
    """The marginal time of a generated byte through `eqattn.text.generate` (of a step of
    `batch` bytes, one per prompt; `tokens_per_s` counts them all): the median over the rounds
    of each round's difference between many bytes and few, divided by the bytes between (the
    two calls of a round are made one after the other, so the machine's drifts and the other
    cases' traces in its caches cancel in the difference)."""
    tag = "" if batch == 1 else f" x{batch}"
    few, many = (timings[(model, f"generate(){tag} {n}")]["times_s"] for n in ("few", "many"))
    steps = lengths[f"generate(){tag} many"] - lengths[f"generate(){tag} few"]
    s = statistics.median(b - a for a, b in zip(few, many)) / steps
    return {
        "part": "generation",
        "prompt": prompt,
        "model": model,
        "mode": f"generate(){' batch ' + str(batch) if batch > 1 else ''}",
        "batch": batch,
        "ms_per_token": 1e3 * s,
        "tokens_per_s": batch / s,
        "of_deq_cached": s / base,
        "solver_steps": None,
    }


def _generation_rows(prompts, context, repeats, size) -> list[dict]:
    """Per prompt length: each model's single calls (a cached byte, the window re-solved),
    each timed on its own, call after call, and the end-to-end `generate()` calls round-robin
    (their rows are paired differences). Round-robin with the end-to-end calls, which take a
    hundred times longer, a cached byte's call came out 2.2-2.7x slower than on its own (a
    trial at commit 3a8a4fb: one process, two runs of each way, not kept in the results)."""
    rows, params = [], {}
    for prompt in prompts:
        timings, ends = {}, {}
        for model in ("deq", "explicit"):
            config = TextConfig(model=model, context=context, **size)
            m = TextTask.build_model(config, jax.random.key(0))
            params[model] = count_params(TextTask.build_model, config)
            for mode, (fn, *args) in _generation_cases(m, prompt).items():
                timings[(model, mode)] = time_jitted(fn, *args, repeats=repeats)
            generate_cases, lengths = _generate_cases(m, prompt, context)
            ends.update({(model, mode): case for mode, case in generate_cases.items()})
        single = dict(timings)
        timings.update(time_interleaved(ends, repeats=repeats))
        base = timings[("deq", "cached")]["median_s"]
        for (model, mode), t in single.items():
            rows.append(
                {
                    "part": "generation",
                    "prompt": prompt,
                    "model": model,
                    "mode": mode if model == "explicit" or mode != "re-run" else "re-solve cold",
                    "ms_per_token": 1e3 * t["median_s"],
                    "tokens_per_s": 1 / t["median_s"],
                    "of_deq_cached": t["median_s"] / base,
                    "solver_steps": int(t["output"][1]),
                }
            )
        rows += [
            _generate_row(prompt, name, timings, lengths, base, batch)
            for batch in BATCHES
            for name in ("deq", "explicit")
        ]
        jax.clear_caches()
    # the model each figure is of: its context and parameters
    return [dict(r, context=context, params=params[r["model"]]) for r in rows]


GENERATION_CONTEXT = 1280
"""The generation rows' context: the text task's default model at `--context 1280`. After a
1024-byte prompt, 255 bytes lie between a round's two `generate()` calls (at 1088, 63 bytes:
within a call's noise, the explicit model's runs read -0.12 to 0.17 ms a byte)."""


def generation_rows() -> dict:
    """The suite's generation rows (prompts of 256 and 1024 bytes, `GENERATION_CONTEXT`), for
    a fresh process (`in_fresh_process`): after the training steps' rows, in the same process,
    the small calls these rows time were slower, and varied from run to run by up to 2x."""
    rows = _generation_rows([256, 1024], context=GENERATION_CONTEXT, repeats=10, size={})
    return {"rows": rows}


GENERATION_RUNS = 3
"""Fresh processes the suite's generation rows are measured in (a verdict: their median)."""


def generation_runs(runs: int = GENERATION_RUNS) -> list[dict]:
    """`generation_rows` in `runs` fresh processes, one after the other, combined."""
    return combined_runs(
        [in_fresh_process("benchmarks._text_speed", "generation_rows")["rows"] for _ in range(runs)]
    )


def combined_runs(runs: list[list[dict]]) -> list[dict]:
    """One row per case of several runs' generation rows (the same cases in the same order):
    the median of the runs' times (`ms_per_token`, with every run's in `ms_runs`) and what
    follows from it; `of_deq_cached` over the median of the DEQ's cached call."""
    rows = []
    for case in zip(*runs):
        ms = [r["ms_per_token"] for r in case]
        row = dict(case[0], ms_per_token=statistics.median(ms), ms_runs=ms)
        row["tokens_per_s"] = 1e3 * row.get("batch", 1) / row["ms_per_token"]
        rows.append(row)
    base = {
        r["prompt"]: r["ms_per_token"]
        for r in rows
        if r["mode"] == "cached" and r["model"] == "deq"
    }
    for r in rows:
        r["of_deq_cached"] = r["ms_per_token"] / base[r["prompt"]]
    return rows


def context_step(context: int = 4096, batch: int = 16) -> dict:
    """One DEQ training step of `eqattn train --task text --context CONTEXT` at its batch (run in
    a fresh process by the suite, so the peak resident memory is this step's)."""
    import resource

    fn, args = _step(TextConfig(context=context, batch_size=batch), batch)
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(*args))
    stats = jax.devices()[0].memory_stats()  # an accelerator's allocator (None on a CPU)
    device = {"device_peak_mb": stats["peak_bytes_in_use"] / MB} if stats else {}
    return {
        **device,
        "part": "long-context",
        "context": context,
        "batch": batch,
        "temp_mb": compiled.memory_analysis().temp_size_in_bytes / MB,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "step_s": time.perf_counter() - t0,
        "compile_s": compile_s,
        "solver_steps": float(out[3][1]),
        "loss": float(out[2]),
    }
