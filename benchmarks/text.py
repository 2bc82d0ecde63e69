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
   reported) of the text task's default model at context 1280 (`GENERATION_CONTEXT`; each row
   states its context and parameters), in `GENERATION_RUNS` (3) fresh processes, each figure
   the median of the runs' with their range: the time of the token after a prompt of 256 and
   of 1024 bytes, DEQ with its equilibrium cache (`eqattn.nn.extend`: one row solved against
   the cached keys and values), DEQ re-solving the whole prefix (from zeros, and warm-started
   from the previous fixed points), the explicit model with its key/value cache and re-running
   the prefix; and `eqattn.text.generate` end to end (`generate()`: sampling and the host's
   loop included, the marginal time of a byte between 2 and as many bytes as fit the context
   without a slide: the median over the rounds of each round's difference, the two calls made
   back to back; at batch 64, up to 128 bytes).
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
from pathlib import Path

import jax

import eqattn
from eqattn import text
from eqattn.train import train

from ._harness import (
    in_fresh_process,
    markdown_table,
    print_table,
    seeds_cell,
)
from ._text_speed import (
    _context_rows,
    _generation_rows,
    _solver_rows,
    combined_runs,
    generation_runs,
)

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
                config = text.TextConfig(
                    model=model, seed=seed, **(small if quick else {}), **fields
                )
                out = f"{tmp}/{i}-{seed}"
                task = text.TextTask(config)
                runs[model, _case(fields)][seed] = train(task, out, progress=False)
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
    print(f"\ngeneration: the token after a prompt ({_generation_model(part('generation'))})")
    print_table(
        [dict(r, runs=_runs_range(r)) for r in part("generation")],
        [
            ("prompt", "prompt", "d"),
            ("model", "model", "s"),
            ("mode", "mode", "s"),
            ("ms_per_token", "ms/token", ".3g"),
            ("runs", "runs' range", "s"),
            ("tokens_per_s", "tokens/s", ".0f"),
            ("of_deq_cached", "x DEQ cached", ".2f"),
            ("solver_steps", "steps", "d"),
        ],
    )


def _generation_model(rows) -> str:
    """The model the generation rows are of: fresh parameters, and the context and parameters
    of each model where the rows record them."""
    sizes = {r["model"]: (r["context"], r["params"]) for r in rows if "params" in r}
    if not sizes:
        return "fresh parameters"
    (context,) = {c for c, _ in sizes.values()}
    counts = ", ".join(f"{m} {p:,} parameters" for m, (_, p) in sizes.items())
    return f"fresh parameters, context {context}: {counts}"


def _runs_range(r) -> str:
    """The runs' range of a generation row's time (none in results from before the runs)."""
    runs = r.get("ms_runs") or []
    return "" if len(runs) < 2 else f"{min(runs):.3g}-{max(runs):.3g} ({len(runs)} runs)"


def run(quick: bool = False, short: bool = False) -> tuple[list[dict], dict]:
    rows = [] if short else _paired(quick)
    if quick:  # one timed call of each: nothing is judged
        rows += _context_rows([16], tokens_per_step=32, repeats=1, size=_QUICK)
        rows += _solver_rows([2, 4], context=16, batch=2, repeats=1, size=_QUICK)
        rows += combined_runs([_generation_rows([8], context=16, repeats=1, size=_QUICK)])
    else:
        rows += _context_rows([256, 1024, 4096], tokens_per_step=4096, repeats=5, size={})
        rows += _solver_rows([5, 10, 20, 40], context=256, batch=16, repeats=5, size={})
        rows += generation_runs()
    _print(rows)
    if not quick:
        long = in_fresh_process("benchmarks._text_speed", "context_step")
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


def _text_paired(payload) -> str:
    """The text suite's paired runs (the defaults, then the candidates) and the target."""
    rows = [r for r in payload["rows"] if r["part"] == "paired"]
    if not rows:  # `--short`: no training runs
        return ""
    target = payload["target"]
    paired = markdown_table(
        [
            "model",
            "case",
            "seeds",
            "test bits per byte (per seed)",
            "- explicit (median)",
            "train s",
            "x explicit",
            "solver steps (test)",
            "converged",
            "params",
            "step MB",
        ],
        [
            [
                r["model"],
                r.get("case", "defaults"),
                seeds_cell(r["seeds"]),
                f"{r['bpb_mean']:.3f} ({', '.join(f'{b:.3f}' for b in r['test_bits_per_byte'])})",
                f"{r['bpb_minus_explicit']:+.3f}",
                f"{r['train_s']:.0f}",
                f"{r['train_ratio_to_explicit']:.2f}",
                "" if r["model"] == "explicit" else f"{r['test_solver_steps']:.1f}",
                "" if r["model"] == "explicit" else f"{r['test_converged']:.0%}",
                f"{r['params']:,}",
                f"{r['step_temp_mb']:.1f}",
            ]
            for r in rows
        ],
    )
    verdict = "met" if payload["meets_target"] else "not met"
    paired += (
        f"\n\nTarget (DEQ <= explicit + {target['bits_per_byte']} bits per byte at <= "
        f"{target['time_ratio']}x its training time), at the defaults: **{verdict}**."
    )
    if rows[2:]:
        met = [f"`{r['case']}`" for r in rows[2:] if r["meets_target"]]
        paired += f" Candidates that meet it: {', '.join(met) or 'none'}."
    return paired + _text_curves(rows)


def _text_curves(rows) -> str:
    """The paired runs' learning curves (results files from before they were recorded: none)."""
    rows = [r for r in rows if "validation_bpb_by_epoch" in r]
    if not rows:
        return ""

    def cells(r):
        bpb = [f"{b:.3f}" for b in r["validation_bpb_by_epoch"]]
        conv = r.get("train_converged_by_epoch")
        return bpb if conv is None else [f"{b} ({c:.0%})" for b, c in zip(bpb, conv)]

    epochs = len(rows[0]["validation_bpb_by_epoch"])
    table = markdown_table(
        ["model", "case", *(f"epoch {e}" for e in range(1, epochs + 1))],
        [[r["model"], r.get("case", "defaults"), *cells(r)] for r in rows],
    )
    return (
        "\n\nValidation bits per byte after each epoch, the mean over the seeds (in brackets, "
        "the DEQ's training solves of that epoch that converged):\n\n" + table
    )


def table(payload) -> str:
    """The paired runs (with the target), the training step against context and solver budget,
    generation speed, and the long-context step's memory."""
    part = lambda name: [r for r in payload["rows"] if r["part"] == name]  # noqa: E731
    paired = _text_paired(payload)
    context = markdown_table(
        ["context", "model", "batch", "step memory MB", "step ms", "x explicit", "solver steps"],
        [
            [
                r["context"],
                r["model"],
                r["batch"],
                f"{r['temp_mb']:.1f}",
                f"{r['step_ms']:.3g}",
                f"{r['ratio_to_explicit']:.2f}",
                "" if r["model"] == "explicit" else f"{r['solver_steps']:.1f}",
            ]
            for r in part("context")
        ],
    )
    solver = markdown_table(
        ["solver step budget", "step memory MB", "step ms"],
        [[r["steps"], f"{r['temp_mb']:.1f}", f"{r['step_ms']:.3g}"] for r in part("solver")],
    )
    generation = markdown_table(
        [
            "prompt",
            "model",
            "mode",
            "ms per token (runs' range)",
            "tokens/s",
            "x DEQ cached",
            "solver steps",
        ],
        [
            [
                r["prompt"],
                r["model"],
                r["mode"],
                f"{r['ms_per_token']:.3g}" + (f" ({_runs_range(r)})" if _runs_range(r) else ""),
                f"{r['tokens_per_s']:.0f}",
                f"{r['of_deq_cached']:.2f}",
                "" if r["model"] == "explicit" or r["solver_steps"] is None else r["solver_steps"],
            ]
            for r in part("generation")
        ],
    )
    if part("generation"):
        generation = f"Generation ({_generation_model(part('generation'))}):\n\n{generation}"
    out = "\n\n".join(t for t in [paired, context, solver, generation] if t)
    for r in part("long-context"):
        device = r.get("device_peak_mb")
        out += (
            f"\n\n`--context {r['context']}`, batch {r['batch']}: one DEQ training step, peak "
            f"resident memory {r['peak_rss_mb']:.0f} MB ({r['temp_mb']:.0f} MB temporary, "
            f"compiled"
            + ("" if device is None else f"; the device's peak allocation {device:.0f} MB")
            + f"), {r['step_s']:.1f} s."
        )
    return out
