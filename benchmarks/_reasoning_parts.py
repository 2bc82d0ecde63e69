"""The reasoning suites' common part: one task's DEQ and explicit twin trained as `eqattn train
--task NAME --seed S` trains them, then scored beside every control at sizes far beyond the
training's (`benchmarks.reasoning`: prefix sums; `benchmarks.reasoning_mazes`: mazes)."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

from eqattn import train

from . import _seeds
from ._harness import git_commit, markdown_table, print_table


@dataclasses.dataclass(frozen=True)
class Parts:
    """How a suite reaches one task: its `train.ReasoningTask` and configuration, `draw(count,
    n)` its test instances of size `n` (seed 10,000 + n), `score(model, instances, budget=,
    steps=)`, `score_steps(model, instances, counts)` and `paths(model, instances, key=,
    budget=)` its package's scoring, scoring after counts of steps and path independence,
    `load(run)` a run's model; `unit` names the share of instances right in a score
    (`strings`, `mazes`), `size` the sizes' unit in tables and `label(n)` a size in them."""

    name: str
    unit: str
    size: str
    label: Callable[[int], str]
    task: type[train.ReasoningTask]
    config: Callable[..., Any]
    draw: Callable[[int, int], Any]
    score: Callable[..., dict]
    score_steps: Callable[[Any, Any, list[int]], list[dict]]
    paths: Callable[..., dict]
    load: Callable[[Path], Any]


class Work:
    """A seed's work folder: its trained runs and each finished part's rows (`NAME.json`, with
    the commit that made them), so that a run interrupted and started again loses only the
    part in flight; rows kept from another commit than the run's say which (`made_at`).
    `folder` None: nothing kept (quick runs)."""

    def __init__(self, folder: Path | None, recorded: dict):
        self.folder = folder
        if folder is None:
            return
        folder.mkdir(parents=True, exist_ok=True)
        mark = folder / "settings.json"
        if mark.exists() and json.loads(mark.read_text()) != recorded:
            raise SystemExit(
                f"{folder} holds a run of other settings; its parts and these cannot be set "
                "side by side (move it aside first)"
            )
        _write(mark, recorded)

    def runs(self, scratch: Path) -> Path:
        """Where the trained runs go (`scratch` when nothing is kept)."""
        return scratch if self.folder is None else self.folder

    def part(self, name: str, make: Callable[[], list[dict]]) -> list[dict]:
        """`make()`'s rows, or the rows a run before this one kept of the part `name`."""
        if self.folder is None:
            return make()
        path = self.folder / f"{name}.json"
        if path.exists():
            kept = json.loads(path.read_text())
            print(f"{path}: kept from commit {kept['git_commit']}")
            if kept["git_commit"] == git_commit():
                return kept["rows"]
            return [dict(r, made_at=kept["git_commit"]) for r in kept["rows"]]  # said so
        rows = make()
        _write(path, {"git_commit": git_commit(), "rows": rows})
        return rows


def _write(path: Path, payload) -> None:
    """`payload` as JSON at `path`, whole or not at all."""
    part = path.with_name(f".{path.name}.part")
    part.write_text(json.dumps(payload, indent=1))
    os.replace(part, path)


def _size(parts: Parts, seed: int, s: dict, models, depth: int, n: int, work: Work):
    """Size `n`'s rows of every case, path independence, and at the largest size the budget
    sweep: the tied control, 4 x the budget without stopping and the sweep are one run of the
    step (`score_steps`), scored at each count."""
    deq, untrained, twin = models
    data, budget = parts.draw(s["count"], n), parts.task.budget_for(n)
    sweep = s["budgets"] if n == max(s["sizes"]) else ()
    counts = sorted({depth, 4 * budget, *sweep})

    def steps() -> list[dict]:
        return [dict(count=c, **r) for c, r in zip(counts, parts.score_steps(deq, data, counts))]

    def paths() -> list[dict]:
        few = jax.tree.map(lambda a: a[:paths_count], data)  # the first few instances
        out = parts.paths(deq, few, key=jax.random.key(seed), budget=budget)
        return [dict(part="paths", seed=seed, n=n, count=paths_count, **out)]

    paths_count = s.get("paths_count", s["count"])
    at = {r.pop("count"): r for r in work.part(f"n{n}-steps", steps)}
    scored = {  # case: its part's name and rows
        "deq": ("deq", lambda: [parts.score(deq, data, budget=budget)]),
        "untrained": ("untrained", lambda: [parts.score(untrained, data, budget=budget)]),
        f"tied x{depth}": (None, lambda: [at[depth]]),
        "4x budget, no stop": (None, lambda: [at[4 * budget]]),
        "explicit twin": ("explicit", lambda: [parts.score(twin, data)]),
    }
    rows = [
        dict(part="size", case=case, seed=seed, n=n,
             **(make() if name is None else work.part(f"n{n}-{name}", make))[0])
        for case, (name, make) in scored.items()
    ]  # fmt: skip
    rows += work.part(f"n{n}-paths", paths)
    budgets = [dict(part="budget", seed=seed, n=n, budget=b, **at[b]) for b in sweep]
    return rows, budgets


def _trained(parts: Parts, config, folder: Path):
    """The run `eqattn train --task NAME` makes of `config` in `folder`: its last model and a
    row. A finished run there is read, an interrupted one resumed."""
    run = folder / config.model
    metrics_file = run / "metrics.json"
    metrics = json.loads(metrics_file.read_text()) if metrics_file.exists() else None
    if metrics is None or metrics.get("epochs_done", 0) < config.epochs:
        try:
            metrics = train.resume(run, parts.task, progress="off")
        except train.RunError:  # nothing to resume from: a run from the start
            metrics = train.train(parts.task(config), run, progress="off", overwrite=True)
    model = parts.load(run)
    step = model.core.step if model.is_deq else model.core.steps[0]
    last = metrics["history"][-1]
    row = dict(part="run", case="deq" if model.is_deq else "explicit twin", seed=config.seed,
               train_s=metrics["train_time_s"], compile_s=metrics["compile_time_s"],
               params=metrics["params"], dim=step.dim, heads=step.num_heads,
               hidden=step.mlp.width_size, depth=1 if model.is_deq else len(model.core.steps),
               final_loss=last["loss"], validation=last["validation_accuracy"])  # fmt: skip
    return model, row


def _seed(parts: Parts, seed: int, s: dict, work: Work) -> list[dict]:
    """One seed's training runs and scores."""
    deq_config = parts.config(seed=seed, **s["config"])
    untrained = train.initial_model(parts.task, deq_config)
    rows, trained = [], {}
    with tempfile.TemporaryDirectory() as scratch:
        for model in ("deq", "explicit"):
            config = dataclasses.replace(deq_config, model=model)
            trained[model], row = _trained(parts, config, work.runs(Path(scratch)))
            rows.append(row)
            jax.clear_caches()
    depth = deq_config.depth
    assert depth is not None
    models, sweeps = (trained["deq"], untrained, trained["explicit"]), []
    for n in s["sizes"]:
        sized, budgets = _size(parts, seed, s, models, depth, n, work)
        rows, sweeps = rows + sized, sweeps + budgets
    return rows + sweeps


def run(
    parts: Parts, settings: dict, seeds: tuple[int, ...], work: Path | None = None
) -> tuple[list[dict], dict]:
    """Every seed's rows (printed), and the payload's settings. `work`: the folder that keeps
    each seed's runs and finished parts (`work/seed-S`, see `Work`); None keeps nothing."""
    rows, recorded_settings = [], recorded(parts, settings)
    for seed in seeds:
        folder = None if work is None else work / f"seed-{seed}"
        if folder is not None:
            print(f"seed {seed}: runs and finished parts kept in {folder}")
        rows += _seed(parts, seed, settings, Work(folder, recorded_settings))
        jax.clear_caches()
    _print(parts, rows)
    return rows, {"settings": recorded_settings, "seeds": list(seeds)}


def recorded(parts: Parts, settings: dict) -> dict:
    """What a results file records of a run's `settings` (its configuration whole): runs of
    the same are set side by side (`benchmarks._seeds`)."""
    config = parts.config(**settings["config"]).to_dict()
    meta = {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()}
    return json.loads(json.dumps(meta | {"config": config}))  # as the file reads back


def median(values) -> float:
    return statistics.median(values) if values else float("nan")


def _by_case(rows) -> dict[str, dict[int, list[dict]]]:
    out: dict[str, dict[int, list[dict]]] = {}
    for r in rows:
        if r["part"] == "size":
            out.setdefault(r["case"], {}).setdefault(r["n"], []).append(r)
    return out


def _cell(rs: list[dict], unit: str) -> str:
    """Instances right: the median over the seeds (min-max), as percentages."""
    values = [r[unit] for r in rs]
    low, mid, high = min(values), median(values), max(values)
    if low == high:
        return f"{100 * mid:.2f}%"
    return f"{100 * mid:.2f}% ({100 * low:.2f}-{100 * high:.2f})"


def _print(parts: Parts, rows) -> None:
    for case, by_n in _by_case(rows).items():
        print(f"\n{parts.name}, {case}: {parts.unit} right (median over seeds)")
        table = [{"n": n, "acc": median([r[parts.unit] for r in rs])} for n, rs in by_n.items()]
        print_table(table, [("n", parts.size, "d"), ("acc", parts.unit, ".4f")])


def table(parts: Parts, payload) -> str:
    """Instances right per case and size (median over the seeds, min-max), the DEQ's solver
    steps and convergence, path independence, accuracy against the step budget, the runs."""
    rows, unit, label = payload["rows"], parts.unit, parts.label
    by_case = _by_case(rows)
    sizes = sorted({n for by_n in by_case.values() for n in by_n})
    body = [[case, *[_cell(by_n[n], unit) if n in by_n else "-" for n in sizes]]
            for case, by_n in by_case.items()]  # fmt: skip
    out = markdown_table([f"{parts.name}: {unit} right", *map(label, sizes)], body)
    deq = by_case.get("deq", {})
    paths = [r for r in rows if r["part"] == "paths"]
    body = [
        [label(n).removesuffix(f" {parts.size}"),
         f"{median([r['steps'] for r in deq[n]]):.0f}",
         f"{100 * min(r['converged'] for r in deq[n]):.1f}%",
         f"{100 * min(r['agree'] for r in paths if r['n'] == n):.2f}%",
         f"{min(r['alignment'] for r in paths if r['n'] == n):.4f}"]
        for n in sizes if n in deq
    ]  # fmt: skip
    counts = {r.get("count") for r in paths}
    few = f" of {counts.pop()} {unit}" if len(counts) == 1 and None not in counts else ""
    header = [f"DEQ: {parts.size}", "solver steps (median)", "converged (lowest)",
              f"random starts agree (lowest{few})", "alignment (lowest)"]  # fmt: skip
    out += "\n\n" + markdown_table(header, body)
    budget = [r for r in rows if r["part"] == "budget"]
    if budget:
        steps = sorted({r["budget"] for r in budget})
        n = budget[0]["n"]
        cells = [_cell([r for r in budget if r["budget"] == b], unit) for b in steps]
        out += "\n\n" + markdown_table([f"DEQ at {label(n)}: steps", *map(str, steps)],
                                       [[f"{unit} right", *cells]])  # fmt: skip
    out += "\n\n" + _runs_table(rows)
    seeds = _seeds.runs_line(payload)  # seeds run at different commits or days, run by run
    return out if seeds is None else f"{out}\n\n{seeds}"


def _runs_table(rows) -> str:
    runs = [r for r in rows if r["part"] == "run"]
    body = [
        [c, f"{rs[0]['params']:,}", f"{rs[0]['dim']} x {rs[0]['heads']} heads, MLP {rs[0]['hidden']}",
         f"{rs[0]['depth']}", f"{median([r['train_s'] for r in rs]):.0f}",
         f"{median([r['final_loss'] for r in rs]):.4f}"]
        for c in dict.fromkeys(r["case"] for r in runs)
        for rs in [[r for r in runs if r["case"] == c]]
    ]  # fmt: skip
    header = ["model", "params", "width", "untied steps", "training s", "final loss"]
    return markdown_table(header, body)
