"""The reasoning suites' common part: one task's DEQ and explicit twin trained as `eqattn train
--task NAME --seed S` trains them, then scored beside every control at sizes far beyond the
training's (`benchmarks.reasoning`: prefix sums; `benchmarks.reasoning_mazes`: mazes)."""

from __future__ import annotations

import dataclasses
import json
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

from eqattn import Picard, train

from . import _seeds
from ._harness import markdown_table, print_table


@dataclasses.dataclass(frozen=True)
class Parts:
    """How a suite reaches one task: its `train.ReasoningTask` and configuration, `draw(count,
    n)` its test instances of size `n` (seed 10,000 + n), `score(model, instances, budget=,
    steps=)` and `paths(model, instances, key=, budget=)` its package's scoring and path
    independence, `load(run)` a run's model; `unit` names the share of instances right in a
    score (`strings`, `mazes`), `size` the sizes' unit in tables and `label(n)` a size in
    them."""

    name: str
    unit: str
    size: str
    label: Callable[[int], str]
    task: type[train.ReasoningTask]
    config: Callable[..., Any]
    draw: Callable[[int, int], Any]
    score: Callable[..., dict]
    paths: Callable[..., dict]
    load: Callable[[Path], Any]


def unstopped(model, steps: int):
    """`model` solving exactly `steps` steps (a stopping test only an exact fixed point
    passes)."""
    return model.with_solver(Picard(rtol=1e-30, atol=0.0, max_steps=steps))


def _sizes(parts: Parts, seed: int, s: dict, deq, untrained, twin, depth: int) -> list[dict]:
    rows = []
    for n in s["sizes"]:
        data, budget = parts.draw(s["count"], n), parts.task.budget_for(n)
        cases = {
            "deq": parts.score(deq, data, budget=budget),
            "untrained": parts.score(untrained, data, budget=budget),
            f"tied x{depth}": parts.score(deq, data, steps=depth),
            "4x budget, no stop": parts.score(unstopped(deq, 4 * budget), data, budget=4 * budget),
            "explicit twin": parts.score(twin, data),
        }
        rows += [dict(part="size", case=c, seed=seed, n=n, **r) for c, r in cases.items()]
        paths = parts.paths(deq, data, key=jax.random.key(seed), budget=budget)
        rows.append(dict(part="paths", seed=seed, n=n, **paths))
    n = max(s["sizes"])
    data = parts.draw(s["count"], n)
    longest = unstopped(deq, max(s["budgets"]))  # one program, the budget its argument
    for steps in s["budgets"]:
        r = parts.score(longest, data, budget=steps)
        rows.append(dict(part="budget", seed=seed, n=n, budget=steps, **r))
    return rows


def _trained(parts: Parts, config, folder: Path):
    """The run `eqattn train --task NAME` makes of `config`: its last model and a row."""
    run = folder / config.model
    metrics = train.train(parts.task(config), run, progress="off")
    model = parts.load(run)
    step = model.core.step if model.is_deq else model.core.steps[0]
    last = metrics["history"][-1]
    row = dict(part="run", case="deq" if model.is_deq else "explicit twin", seed=config.seed,
               train_s=metrics["train_time_s"], compile_s=metrics["compile_time_s"],
               params=metrics["params"], dim=step.dim, heads=step.num_heads,
               hidden=step.mlp.width_size, depth=1 if model.is_deq else len(model.core.steps),
               final_loss=last["loss"], validation=last["validation_accuracy"])  # fmt: skip
    return model, row


def _seed(parts: Parts, seed: int, s: dict) -> list[dict]:
    """One seed's training runs and scores."""
    deq_config = parts.config(seed=seed, **s["config"])
    untrained = train.initial_model(parts.task, deq_config)
    rows, trained = [], {}
    with tempfile.TemporaryDirectory() as folder:
        for model in ("deq", "explicit"):
            config = dataclasses.replace(deq_config, model=model)
            trained[model], row = _trained(parts, config, Path(folder))
            rows.append(row)
            jax.clear_caches()
    depth = deq_config.depth
    assert depth is not None
    return rows + _sizes(parts, seed, s, trained["deq"], untrained, trained["explicit"], depth)


def run(parts: Parts, settings: dict, seeds: tuple[int, ...]) -> tuple[list[dict], dict]:
    """Every seed's rows (printed), and the payload's settings."""
    rows = []
    for seed in seeds:
        rows += _seed(parts, seed, settings)
        jax.clear_caches()
    _print(parts, rows)
    return rows, {"settings": recorded(parts, settings), "seeds": list(seeds)}


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
    header = [f"DEQ: {parts.size}", "solver steps (median)", "converged (lowest)",
              "random starts agree (lowest)", "alignment (lowest)"]  # fmt: skip
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
