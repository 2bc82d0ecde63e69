"""`text`: the byte-level language model of `eqattn train --task text`, the DEQ against the
explicit baseline of equal parameters.

1. Paired runs: `eqattn.train.train` of both models with the command's text defaults (the default
   corpus, context 256), seeds 0 to 2, round-robin seed by seed: test bits per byte and training
   time, and the DEQ's over the explicit model's per seed (median over the seeds); the target is
   DEQ bits per byte <= explicit + 0.05 at <= 1.5x its training time. The DEQ settings of
   `CANDIDATES` run over the same seeds, each paired with the same explicit runs.
2. The training step (the command's: the Jacobian penalty included for the DEQ) against context
   (256, 1024, 4096) at 4096 tokens a step (batch 4096 / context, so the rows do the same number
   of tokens): its compiled temporary memory and its time (median, round-robin with the
   explicit model's); against the solver's step budget (5 to 40 steps at context 256, the
   tolerance out of reach so every step runs), with the implicit backward (`--adjoint
   implicit`; the default Jacobian-free one differentiates one step whatever the budget): its
   memory does not grow with the steps.
3. Generation, fresh parameters (speed does not depend on training, solver steps do: they are
   reported), context 1088: the time of the token after a prompt of 256 and of 1024 bytes,
   DEQ with its equilibrium cache (`eqattn.nn.extend`: one row solved against the cached keys
   and values), DEQ re-solving the whole prefix (from zeros, and warm-started from the previous
   fixed points), the explicit model with its key/value cache and re-running the prefix; and
   `eqattn.text.generate` end to end (`generate()`: sampling and the host's loop included, the
   marginal time of a byte between 2 and as many bytes as fit the context without a slide).
4. (full run only) `--context 4096` at the command's batch (16): one DEQ training step in a
   fresh process (the command's step, which differentiates the windows in chunks of at most
   4096 tokens: here one window at a time), its peak resident memory (the 8 GB check) and the
   compiled step's temporary memory.

`--quick`: a small corpus (eqattn's `text` package), context 16, a few steps, no Jacobian
penalty; it exercises the code only. `--short` (the `gpu` command's step): parts 2 to 4 without
the paired training runs, which take an hour on a CPU.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import eqattn
from eqattn.train import TextTask, build_model, optimizer_of, text_configs, train

from ._harness import External, in_fresh_process, print_table, time_interleaved

MB = 2**20
SEEDS = (0, 1, 2)
TARGET_BPB, TARGET_TIME = 0.05, 1.5
"""The target: DEQ bits per byte <= explicit + TARGET_BPB, at <= TARGET_TIME x its training
time (median of the per-seed ratios)."""

_QUICK_CORPUS = (str(Path(eqattn.__file__).parent / "text"),)
_QUICK = dict(dim=16, heads=2, jacobian_weight=0.0)
"""`--quick`'s model (the command's otherwise), without the Jacobian penalty, whose
second-order program is the slowest to compile (the tests train with it)."""


CANDIDATES: tuple[dict, ...] = (
    # the block's attention reading its state alone (the default before `attend_input`; results
    # at 99c4a2d: 3.214 bits per byte)
    dict(attend_input=False),
    # the single weight-tied block of width 64, no stem (results at c7b3e85 of candidates since
    # dropped: a cell of two untied blocks at width 52, `--cell-depth 2 --dim 52`, 3.215 bits
    # per byte at 2.17x the explicit model's time; the phantom gradient through two steps,
    # 3.808, its training solves unconverged from epoch 3; at ec72cf9, two stem blocks at width
    # 44, `--stem-depth 2 --dim 44`, 3.136, and with `attend_input` in trials 3.107, 3.123,
    # 3.131 over seeds 0-2: no better than one stem block)
    dict(stem_depth=0, dim=64),
)
"""DEQ settings other than the command's defaults, each trained over the same seeds and paired
with the same explicit runs (full run only): the options that may move a default."""


def _case(fields: dict) -> str:
    """`fields` as the command's options (`"defaults"` for none; a bool as `--flag` or
    `--no-flag`)."""
    options = []
    for k, v in fields.items():
        flag = k.replace("_", "-")
        options.append(
            (f"--{flag}" if v else f"--no-{flag}") if isinstance(v, bool) else f"--{flag} {v}"
        )
    return " ".join(options) or "defaults"


def _paired(quick: bool) -> list[dict]:
    small = dict(_QUICK, context=16, epochs=1, epoch_steps=2, batch_size=4, text=_QUICK_CORPUS)
    seeds = (0,) if quick else SEEDS
    cases = [("explicit", {}), ("deq", {})] + ([] if quick else [("deq", c) for c in CANDIDATES])
    runs = {(model, _case(fields)): {} for model, fields in cases}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:  # round-robin: each DEQ run beside the explicit run of its seed
            for i, (model, fields) in enumerate(cases):
                model_config, config = text_configs(
                    model, seed=seed, **(small if quick else {}), **fields
                )
                out = f"{tmp}/{i}-{seed}"
                runs[model, _case(fields)][seed] = train(model_config, config, out, progress=False)
                jax.clear_caches()
    explicit = runs["explicit", "defaults"]
    return [_paired_row(model, case, results, explicit) for (model, case), results in runs.items()]


def _paired_row(model: str, case: str, results: dict, explicit: dict) -> dict:
    m = list(results.values())
    bpb = [r["test_bits_per_byte"] for r in m]
    row = {
        "part": "paired",
        "model": model,
        "case": case,
        "seeds": list(results),
        "test_bits_per_byte": bpb,
        "bpb_mean": statistics.mean(bpb),
        "bpb_minus_explicit": statistics.median(
            r["test_bits_per_byte"] - explicit[s]["test_bits_per_byte"] for s, r in results.items()
        ),
        "train_s": statistics.median(r["train_time_s"] for r in m),
        "train_ratio_to_explicit": statistics.median(
            r["train_time_s"] / explicit[s]["train_time_s"] for s, r in results.items()
        ),
        "params": m[0]["params"],
        "test_solver_steps": statistics.mean(r.get("test_mean_solver_steps", 0.0) for r in m),
        "test_converged": statistics.mean(r.get("test_converged", 1.0) for r in m),
        "step_temp_mb": m[0]["step_temp_memory_mb"],
        "model_shape": m[0]["model_shape"],
        # learning curves, means over the seeds: validation bits per byte after each epoch and
        # (the DEQ's) share of that epoch's training solves that converged
        "validation_bpb_by_epoch": _by_epoch(m, "validation_bits_per_byte"),
    }
    if model == "deq":
        row["train_converged_by_epoch"] = _by_epoch(m, "converged")
        row["meets_target"] = (
            row["bpb_minus_explicit"] <= TARGET_BPB
            and row["train_ratio_to_explicit"] <= TARGET_TIME
        )
    return row


def _by_epoch(runs: list[dict], field: str) -> list[float]:
    """`field` of each epoch's history entry, the mean over `runs`."""
    return [statistics.mean(h[field] for h in hs) for hs in zip(*(r["history"] for r in runs))]


def _step(model_config, config, batch):
    """(the training step as a jittable function of arrays, its example arguments)."""
    model = build_model(model_config, jax.random.key(0))
    optimizer = optimizer_of(config, 1000)
    opt_state = optimizer.init(eqx.filter(model, eqx.is_inexact_array))
    step = TextTask.train_step(model_config, config, optimizer)
    params, static = eqx.partition(model, eqx.is_array)
    context = model_config.context
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
            fn, args = _step(*text_configs(model, context=context, **size), batch)
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
        model_config, config = text_configs(
            "deq",
            context=context,
            rtol=1e-12,
            max_steps=steps,
            train_steps=steps,
            adjoint="implicit",
            **size,
        )
        fn, args = _step(model_config, config, batch)
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


def _generate_cases(model, prompt: int, context: int) -> tuple[dict[str, tuple], dict]:
    """`eqattn.text.generate` end to end after `prompt` bytes, for few and for many bytes (as
    many as fit the context without a slide): the difference is the time of the bytes between."""
    from eqattn import text

    data = bytes(np.random.default_rng(0).integers(0, 256, prompt, dtype=np.uint8))
    lengths = {"generate() few": 2, "generate() many": context - prompt - 1}
    return {
        mode: (External(lambda n=n: text.generate(model, data, n, temperature=1.0)),)
        for mode, n in lengths.items()
    }, lengths


def _generate_row(prompt, model, timings, lengths, base) -> dict:
    """The marginal time of a generated byte through `eqattn.text.generate`."""
    few, many = (timings[(model, mode)]["median_s"] for mode in lengths)
    s = (many - few) / (lengths["generate() many"] - lengths["generate() few"])
    return {
        "part": "generation",
        "prompt": prompt,
        "model": model,
        "mode": "generate()",
        "ms_per_token": 1e3 * s,
        "tokens_per_s": 1 / s,
        "of_deq_cached": s / base,
        "solver_steps": None,
    }


def _generation_rows(prompts, context, repeats, size) -> list[dict]:
    rows = []
    for prompt in prompts:
        cases = {}
        for model in ("deq", "explicit"):
            m = build_model(text_configs(model, context=context, **size)[0], jax.random.key(0))
            for mode, case in _generation_cases(m, prompt).items():
                cases[(model, mode)] = case
            generate_cases, lengths = _generate_cases(m, prompt, context)
            cases.update({(model, mode): case for mode, case in generate_cases.items()})
        timings = time_interleaved(cases, repeats=repeats)
        base = timings[("deq", "cached")]["median_s"]
        for (model, mode), t in timings.items():
            if mode in lengths:  # the end-to-end pair: one row below
                continue
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
            _generate_row(prompt, name, timings, lengths, base) for name in ("deq", "explicit")
        ]
        jax.clear_caches()
    return rows


def context_step(context: int = 4096, batch: int = 16) -> dict:
    """One DEQ training step of `eqattn train --task text --context CONTEXT` at its batch (run in
    a fresh process by the suite, so the peak resident memory is this step's)."""
    import resource

    model_config, config = text_configs("deq", context=context, batch_size=batch)
    fn, args = _step(model_config, config, batch)
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


def _print_paired(paired) -> None:
    print(
        "paired runs (the command's text defaults, then the DEQ candidates; median over seeds "
        "of the per-seed figures)"
    )
    print_table(
        paired,
        [
            ("model", "model", "s"),
            ("case", "case", "s"),
            ("bpb_mean", "test bpb", ".3f"),
            ("bpb_minus_explicit", "- explicit", "+.3f"),
            ("train_s", "train s", ".0f"),
            ("train_ratio_to_explicit", "x explicit", ".2f"),
            ("test_solver_steps", "steps", ".1f"),
            ("test_converged", "converged", ".0%"),
            ("params", "params", ",d"),
        ],
    )
    print("\nvalidation bits per byte after each epoch (mean over seeds)")
    for r in paired:
        print(
            f"{r['model']:>8} {r['case']:<40}", *(f"{b:.3f}" for b in r["validation_bpb_by_epoch"])
        )
    print()


def _print(rows) -> None:
    part = lambda name: [r for r in rows if r["part"] == name]  # noqa: E731
    if part("paired"):
        _print_paired(part("paired"))
    print("training step against context (the same tokens per step)")
    print_table(
        part("context"),
        [
            ("context", "context", "d"),
            ("model", "model", "s"),
            ("batch", "batch", "d"),
            ("temp_mb", "temp MB", ".1f"),
            ("step_ms", "step ms", ".1f"),
            ("ratio_to_explicit", "x explicit", ".2f"),
            ("solver_steps", "steps", ".1f"),
        ],
    )
    print("\nDEQ training step against the solver's step budget")
    print_table(
        part("solver"),
        [("steps", "budget", "d"), ("temp_mb", "temp MB", ".1f"), ("step_ms", "step ms", ".1f")],
    )
    print("\ngeneration: the token after a prompt (fresh parameters)")
    print_table(
        part("generation"),
        [
            ("prompt", "prompt", "d"),
            ("model", "model", "s"),
            ("mode", "mode", "s"),
            ("ms_per_token", "ms/token", ".2f"),
            ("tokens_per_s", "tokens/s", ".0f"),
            ("of_deq_cached", "x DEQ cached", ".2f"),
            ("solver_steps", "steps", "d"),
        ],
    )


def run(quick: bool = False, short: bool = False) -> tuple[list[dict], dict]:
    rows = [] if short else _paired(quick)
    if quick:
        rows += _context_rows([16], tokens_per_step=32, repeats=2, size=_QUICK)
        rows += _solver_rows([2, 4], context=16, batch=2, repeats=2, size=_QUICK)
        rows += _generation_rows([8], context=16, repeats=2, size=_QUICK)
    else:
        rows += _context_rows([256, 1024, 4096], tokens_per_step=4096, repeats=5, size={})
        rows += _solver_rows([5, 10, 20, 40], context=256, batch=16, repeats=5, size={})
        rows += _generation_rows([256, 1024], context=1088, repeats=10, size={})
    _print(rows)
    if not quick:
        long = in_fresh_process("benchmarks.text", "context_step")
        rows.append(long)
        print(
            f"\n--context {long['context']} at batch {long['batch']}: one DEQ training step, "
            f"peak resident {long['peak_rss_mb']:.0f} MB, {long['temp_mb']:.0f} MB temporary "
            f"(compiled), {long['step_s']:.1f} s"
            + (f", device peak {long['device_peak_mb']:.0f} MB" if "device_peak_mb" in long else "")
        )
    if short:  # no training runs: no target, no corpus
        return rows, {}
    return rows, {
        "target": {"bits_per_byte": TARGET_BPB, "time_ratio": TARGET_TIME},
        "meets_target": rows[1]["meets_target"],
        "corpus": "eqattn/text (quick)" if quick else "the Python standard library (default)",
    }
