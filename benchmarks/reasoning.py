"""`reasoning`: the generic equilibrium layer on a reasoning task, trained small and asked far
larger: prefix sums (`eqattn.prefix_sums`, a bit string's running parity), with every control.

Per seed (0 to 2): the DEQ and its explicit twin of equal parameters trained as
`eqattn train --task prefix-sums --seed S` trains them (`PrefixSumsTask` through `train.train`:
32 channels, 4 heads, 4 epochs of 500 steps, each step 8 strings of each of 8, 16, 24 and 32
bits; the twin `PrefixSumsModel.matched`'s, 36 untied steps, as many as the DEQ's training runs
on 32 bits), the last epoch's models; then on 64 fresh strings of each of 32, 64, 128, 256 and
512 bits, the share of strings with every bit right (and of bits) of:

- the DEQ solved to its fixed point within 4 n + 100 steps (its steps and convergence);
- the untrained DEQ, solved alike (what the layer answers before training);
- the DEQ's trained step, tied and run 36 times (as in training; the fair control of the twin);
- the DEQ with 4 x the budget and the stopping test off (overthinking must not cost);
- the explicit twin;
- path independence: the DEQ's answers and fixed points from three random starts against the
  start from zeros (`prefix_sums.path_independence`).

And at the largest size, the DEQ's strings right against its step budget (the stopping test off
below the budget's end: accuracy against solver steps). The target (issue's): >= 99% of 512-bit
strings, the DEQ >= 20 points above its twin there.

`--quick`: 8 channels, 2 heads, 20 steps on strings of 4 bits, 8 strings of 12 bits, one seed,
a twin of 8 steps: it exercises the code only.
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
from pathlib import Path

import jax
import numpy as np

from eqattn import Picard, prefix_sums, train

from ._harness import markdown_table, print_table

SEEDS = (0, 1, 2)
FULL = dict(config={}, sizes=(32, 64, 128, 256, 512), strings=64,
            budgets=(128, 256, 512, 1024, 2048))  # fmt: skip
QUICK = dict(config=dict(dim=8, heads=2, lengths=(4,), epochs=1, epoch_steps=20, test_strings=8),
             sizes=(12,), strings=8, budgets=(4, 16))  # fmt: skip


def _unstopped(model, steps: int):
    """`model` solving exactly `steps` steps (a stopping test only an exact fixed point
    passes)."""
    return model.with_solver(Picard(rtol=1e-30, atol=0.0, max_steps=steps))


def _sizes(seed: int, s: dict, deq, untrained, twin, depth: int) -> list[dict]:
    rows = []
    for n in s["sizes"]:
        bits = prefix_sums.draw_bits(np.random.default_rng(10_000 + n), s["strings"], n)
        targets, budget = prefix_sums.prefix_parity(bits), prefix_sums.budget_for(n)
        cases = {
            "deq": prefix_sums.score(deq, bits, targets, budget=budget),
            "untrained": prefix_sums.score(untrained, bits, targets, budget=budget),
            f"tied x{depth}": prefix_sums.score(deq, bits, targets, steps=depth),
            "4x budget, no stop": prefix_sums.score(
                _unstopped(deq, 4 * budget), bits, targets, budget=4 * budget
            ),
            "explicit twin": prefix_sums.score(twin, bits, targets),
        }
        rows += [dict(part="size", case=c, seed=seed, n=n, **r) for c, r in cases.items()]
        paths = prefix_sums.path_independence(deq, bits, key=jax.random.key(seed), budget=budget)
        rows.append(dict(part="paths", seed=seed, n=n, **paths))
    n = max(s["sizes"])
    bits = prefix_sums.draw_bits(np.random.default_rng(10_000 + n), s["strings"], n)
    unstopped = _unstopped(deq, max(s["budgets"]))  # one program, the budget its argument
    for steps in s["budgets"]:
        r = prefix_sums.score(unstopped, bits, prefix_sums.prefix_parity(bits), budget=steps)
        rows.append(dict(part="budget", seed=seed, n=n, budget=steps, **r))
    return rows


def _trained(config: prefix_sums.PrefixSumsConfig, folder: Path):
    """The run `eqattn train --task prefix-sums` makes of `config`: its last model and a row."""
    run = folder / config.model
    metrics = train.train(prefix_sums.PrefixSumsTask(config), run, progress="off")
    model = prefix_sums.load_model(run)
    step = model.core.step if model.is_deq else model.core.steps[0]
    last = metrics["history"][-1]
    row = dict(part="run", case="deq" if model.is_deq else "explicit twin", seed=config.seed,
               train_s=metrics["train_time_s"], compile_s=metrics["compile_time_s"],
               params=metrics["params"], dim=step.dim, heads=step.num_heads,
               hidden=step.mlp.width_size, depth=1 if model.is_deq else len(model.core.steps),
               final_loss=last["loss"], validation=last["validation_accuracy"])  # fmt: skip
    return model, row


def _seed(seed: int, s: dict) -> list[dict]:
    """One seed's training runs and scores."""
    deq_config = prefix_sums.PrefixSumsConfig(seed=seed, **s["config"])
    untrained = train.initial_model(prefix_sums.PrefixSumsTask, deq_config)
    rows, trained = [], {}
    with tempfile.TemporaryDirectory() as folder:
        for model in ("deq", "explicit"):
            config = dataclasses.replace(deq_config, model=model)
            trained[model], row = _trained(config, Path(folder))
            rows.append(row)
            jax.clear_caches()
    depth = deq_config.depth
    assert depth is not None
    return rows + _sizes(seed, s, trained["deq"], untrained, trained["explicit"], depth)


def run(quick: bool = False) -> tuple[list[dict], dict]:
    settings = QUICK if quick else FULL
    rows = []
    for seed in (0,) if quick else SEEDS:
        rows += _seed(seed, settings)
        jax.clear_caches()
    _print(rows)
    config = prefix_sums.PrefixSumsConfig(**settings["config"]).to_dict()
    meta = {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()}
    return rows, {"settings": meta | {"config": config}, "seeds": [0] if quick else list(SEEDS)}


def _median(values) -> float:
    return statistics.median(values) if values else float("nan")


def _by_case(rows) -> dict[str, dict[int, list[dict]]]:
    out: dict[str, dict[int, list[dict]]] = {}
    for r in rows:
        if r["part"] == "size":
            out.setdefault(r["case"], {}).setdefault(r["n"], []).append(r)
    return out


def _cell(rs: list[dict]) -> str:
    """Strings right: the median over the seeds (min-max), as percentages."""
    values = [r["strings"] for r in rs]
    low, mid, high = min(values), _median(values), max(values)
    if low == high:
        return f"{100 * mid:.2f}%"
    return f"{100 * mid:.2f}% ({100 * low:.2f}-{100 * high:.2f})"


def _print(rows) -> None:
    for case, by_n in _by_case(rows).items():
        print(f"\nprefix sums, {case}: strings right (median over seeds)")
        table = [{"n": n, "acc": _median([r["strings"] for r in rs])} for n, rs in by_n.items()]
        print_table(table, [("n", "bits", "d"), ("acc", "strings", ".4f")])


def table(payload) -> str:
    """Strings right per case and size (median over the seeds, min-max), the DEQ's solver
    steps and convergence, path independence, accuracy against the step budget, the runs."""
    rows = payload["rows"]
    by_case = _by_case(rows)
    sizes = sorted({n for by_n in by_case.values() for n in by_n})
    body = [[case, *[_cell(by_n[n]) if n in by_n else "-" for n in sizes]]
            for case, by_n in by_case.items()]  # fmt: skip
    out = markdown_table(["prefix sums: strings right", *[f"{n} bits" for n in sizes]], body)
    deq = by_case.get("deq", {})
    paths = [r for r in rows if r["part"] == "paths"]
    body = [
        [f"{n}", f"{_median([r['steps'] for r in deq[n]]):.0f}",
         f"{100 * min(r['converged'] for r in deq[n]):.1f}%",
         f"{100 * min(r['agree'] for r in paths if r['n'] == n):.2f}%",
         f"{min(r['alignment'] for r in paths if r['n'] == n):.4f}"]
        for n in sizes if n in deq
    ]  # fmt: skip
    header = ["DEQ: bits", "solver steps (median)", "converged (lowest)",
              "random starts agree (lowest)", "alignment (lowest)"]  # fmt: skip
    out += "\n\n" + markdown_table(header, body)
    budget = [r for r in rows if r["part"] == "budget"]
    if budget:
        steps = sorted({r["budget"] for r in budget})
        n = budget[0]["n"]
        cells = [_cell([r for r in budget if r["budget"] == b]) for b in steps]
        out += "\n\n" + markdown_table([f"DEQ at {n} bits: steps", *map(str, steps)],
                                       [["strings right", *cells]])  # fmt: skip
    runs = [r for r in rows if r["part"] == "run"]
    body = [
        [c, f"{rs[0]['params']:,}", f"{rs[0]['dim']} x {rs[0]['heads']} heads, MLP {rs[0]['hidden']}",
         f"{rs[0]['depth']}", f"{_median([r['train_s'] for r in rs]):.0f}",
         f"{_median([r['final_loss'] for r in rs]):.4f}"]
        for c in dict.fromkeys(r["case"] for r in runs)
        for rs in [[r for r in runs if r["case"] == c]]
    ]  # fmt: skip
    header = ["model", "params", "width", "untied steps", "training s", "final loss"]
    return out + "\n\n" + markdown_table(header, body)
