"""`graphs`: the graph task's differentiable algorithms against their controls.
`eqattn train --task graphs --algorithm A` trains on graphs of 8-16 nodes, for each algorithm
(`bfs`, `shortest-paths`, `mst`), the DEQ (`nn.ImplicitGraphAttention` over the algorithm's
step) and its explicit twin (equal parameters, 16 untied steps of the same kind: as many as the
training graphs' longest distance needs); both are then scored on every family at 16, 64, 256,
1024 and 4096 nodes, graphs drawn with seeds no training run saw.

1. Runs: both models with the command's defaults, seeds 0 to 2. Per run: the share of nodes
   with a valid parent (reachability and the parent right) and of nodes left unresolved, per
   family and size at the budget rule (`graphs.budget_for`: 2 n + 8), and by hops from the
   source (`eqattn.train.evaluate`); training time, parameters, the training step's compiled
   memory.
2. Controls of every DEQ run, on the same graphs: the untrained model (the run's
   initialisation: what the structure answers before any training), the layer at its
   algorithm's exact parameters (the algorithm written as the layer, hand-set), and the fair
   control of the explicit twin, the DEQ's own trained step tied and run 16 times. The exact
   algorithm (the reference) is right on every node by definition.
3. By weight distribution (shortest paths and spanning trees, the seed-0 DEQ): ties (all equal,
   {1, 2}, integers 1-5, 2 decimals), heavy tails (lognormal sigma 1, 2, 3), near ties (1 +
   U(0, 1e-3)), zeros, weights from 1e-6 to 1e6, and distinct uniform ones, on every family and
   networkx's Watts-Strogatz, Barabási-Albert (m = 3) and powerlaw-cluster graphs, at 64 and
   4096 nodes (`benchmarks/_generators.py`).
4. Per run (with networkx, the `bench` extra): parents on graphs the project did not generate:
   networkx's random 3-regular, Barabasi-Albert, Watts-Strogatz, powerlaw-cluster graphs,
   uniform random trees and connected caves at 64 and 1024 nodes, and its real graphs (karate
   club, Les Miserables, Florentine families; for the weighted algorithms also with their own
   weights), 16 sources each (2 graphs at 1024); with PyGSP, Minnesota's road network and an
   airfoil's mesh (2642 and 4253 nodes, by length), 2 sources each.
5. Per DEQ run, every family at 16, 64 and 256 nodes: solver steps against each graph's depth
   (the source's eccentricity in hops); the answers at four times the rule with the solver's
   stopping test off, against the rule's (no overthinking); and path independence: the fixed
   point from three random starts (normal, the state's scale) against the one from zeros, as
   the share of nodes whose parents agree and the asymptotic-alignment score of Anil et al.
   (2022): the cosine of the two states, each graph's flattened, the mean over graphs.

`--quick`: BFS's two models (seed 0) and the shortest paths' DEQ (seed 2, whose initial
orientation is the right one: at seed 0 it takes two epochs of 200 steps to flip), each one epoch
of 100 steps (`QUICK_RUNS`), the evaluation and controls on two graphs of three families
(`QUICK_FAMILIES`) at 64 nodes, the dynamics on paths, two distributions on two families, two generators at 64
nodes and one real graph: it exercises the code only. With `REUSE` set to a folder holding
BFS's runs at the command's defaults (`deq/` and `explicit/`, as `eqattn train
--out FOLDER` writes them), it reads those instead of training BFS (the tests share one).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import jax

from eqattn import graphs, train

from . import _generators, _graph_parts
from ._harness import markdown_table, print_table, seeds_cell

SEEDS = (0, 1, 2)
SIZES = {16: 32, 64: 16, 256: 8}
"""Nodes and graphs per family of the DEQs' dynamics."""
WEIGHT_SIZES = {64: 4, 4096: 1}
"""Nodes and graphs per family and distribution of the table by weight distribution."""
DEPTH = 16
"""The explicit twin's depth, and the tied control's."""
REUSE = "EQATTN_QUICK_GRAPH_RUNS"
"""The environment variable naming BFS's runs for `--quick` to read instead of training."""


QUICK_RUNS = (
    # (model, settings, seed, whether the shared BFS runs of `REUSE` stand in for it)
    ("deq", dict(algorithm="bfs", epoch_steps=40, epochs=1), 0, True),
    ("explicit", dict(algorithm="bfs", epoch_steps=40, epochs=1), 0, True),
    ("deq", dict(algorithm="shortest-paths", epoch_steps=40, epochs=1), 2, False),
)
"""`--quick`'s training runs."""
QUICK_SIZES = {64: 2}
"""`--quick`'s nodes and graphs per family (each family's graphs compile a program of their
own: the quick suite is compile-bound)."""
QUICK_FAMILIES = ("path", "geometric", "delaunay")
"""`--quick`'s families of the evaluation and the controls (a path is deeper than the explicit
twin at 64 nodes; the geometric and Delaunay graphs are weighted by their geometry)."""
QUICK_DYNAMICS = ("path",)
"""`--quick`'s families of the dynamics (the deepest; each family compiles three programs a
model: at the rule, unstopped, from random starts)."""


def _runs(quick: bool) -> list[tuple[str, str, dict, int, bool]]:
    """(case, model, settings, seed, reusable) of every training run, algorithm by algorithm
    (`--quick`: `QUICK_RUNS`)."""
    if quick:
        return [(f"{m} {s['algorithm']}", m, s, seed, reuse) for m, s, seed, reuse in QUICK_RUNS]
    return [
        (f"{m} {algorithm}", m, {"algorithm": algorithm}, seed, False)
        for algorithm in graphs.ALGORITHMS
        for seed in SEEDS
        for m in ("deq", "explicit")
    ]


def _train(model: str, settings: dict, seed: int, out: Path, reusable: bool) -> dict:
    given = Path(os.environ.get(REUSE, "")) / model
    if reusable and os.environ.get(REUSE) and given.is_dir():
        shutil.copytree(given, out)
        return json.loads((out / "metrics.json").read_text())
    config = graphs.GraphConfig(model=model, seed=seed, **settings)
    return train.train(graphs.GraphTask(config), out, progress=False)


def _evaluate(out: Path, sizes: dict[int, int] | None) -> dict:
    """`eqattn.train.evaluate` of the run (`sizes`: only these on `QUICK_FAMILIES`, the rule's
    budget alone)."""
    if sizes is None:
        return train.evaluate(out, graphs.GraphTask, progress=False)
    model, config, _ = train.load_model(out, graphs.GraphTask)
    rows = graphs.evaluate_sizes(
        model, config, None, sizes=sizes, sweep=False, families=QUICK_FAMILIES
    )
    return {"sizes": rows, "by_distance": graphs.distance_table(rows)}


def _per_size(evaluation: dict, key: str) -> dict[str, float]:
    return {f"{r['family']}@{r['n']}": r["at_rule"][key] for r in evaluation["sizes"]}


def _run(case, model, settings, seed, reusable, out, quick, sizes) -> list[dict]:
    """One training run's rows: the run, and for a DEQ its controls, its table by weight
    distribution (the first seed, weighted algorithms), its generated graphs and its dynamics."""
    metrics = _train(model, settings, seed, out, reusable)
    t0 = time.perf_counter()
    evaluation = _evaluate(out, sizes if quick else None)
    rows = [
        dict(part="run", case=case, seed=seed, params=metrics["params"],
             train_time_s=metrics["train_time_s"], evaluate_s=time.perf_counter() - t0,
             step_temp_mb=metrics["step_temp_memory_mb"], test_accuracy=metrics["test_accuracy"],
             accuracy=_per_size(evaluation, "accuracy"),
             unresolved=_per_size(evaluation, "unresolved"),
             by_distance=evaluation["by_distance"])
    ]  # fmt: skip
    loaded, config, _ = train.load_model(out, graphs.GraphTask)
    algorithm = settings["algorithm"]
    if _generators.available():
        generated = _graph_parts.generated(loaded, algorithm, quick)
        rows += [dict(part="generators", case=case, seed=seed, **r) for r in generated]
    if model != "deq":
        return rows
    # the controls on the evaluation's graphs (None: `graphs.evaluate_sizes`' own sizes)
    quick_graphs = dict(sizes=sizes, families=QUICK_FAMILIES) if quick else {}
    for name, control in _graph_parts.controls(loaded, config, DEPTH, **quick_graphs).items():
        rows.append(dict(part="control", case=f"{name} {algorithm}", seed=seed, **control))
    if (quick or seed == SEEDS[0]) and graphs.ALGORITHMS[algorithm].weighted:
        weight_sizes = {64: 2} if quick else WEIGHT_SIZES
        table = _graph_parts.by_weights(loaded, algorithm, weight_sizes, quick)
        rows += [dict(part="weights", case=case, seed=seed, **r) for r in table]
    families = QUICK_DYNAMICS if quick else graphs.WEIGHTED_FAMILIES
    dynamics = _graph_parts.dynamics(loaded, algorithm, sizes, families)
    return rows + [dict(part="dynamics", case=case, seed=seed, **d) for d in dynamics]


def run(quick: bool = False) -> tuple[list[dict], dict]:
    sizes = QUICK_SIZES if quick else SIZES
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case, model, settings, seed, reusable in _runs(quick):
            out = Path(tmp) / f"{case}-{seed}".replace(" ", "-")
            rows += _run(case, model, settings, seed, reusable, out, quick, sizes)
            # every run compiles its programs again (each graph shape, each budget): free the
            # last run's, or a process of 18 runs exhausts the memory maps the CPU JIT needs
            # (`--quick`'s three runs keep theirs: the untied twin's program is the tied
            # control's)
            if not quick:
                jax.clear_caches()
    _print(rows)
    meta = {"sizes": sizes, "seeds": [0] if quick else list(SEEDS), "starts": _graph_parts.STARTS}
    return rows, meta


def _median(values):
    return statistics.median(values) if values else float("nan")


def _cases(rows, part="run"):
    runs = [r for r in rows if r["part"] == part]
    return {c: [r for r in runs if r["case"] == c] for c in dict.fromkeys(r["case"] for r in runs)}


def _print(rows) -> None:
    for part in ("run", "control"):
        for case, runs in _cases(rows, part).items():
            print(f"\n{case} ({len(runs)} seed(s)): a valid parent at the budget rule")
            keys = list(runs[0]["accuracy"])
            table = [{"at": k, "acc": _median([r["accuracy"][k] for r in runs])} for k in keys]
            print_table(table, [("at", "family@nodes", "s"), ("acc", "median", ".4f")])
    weights = [r for r in rows if r["part"] == "weights"]
    if weights:
        seeds = ", ".join(map(str, sorted({r["seed"] for r in weights})))
        print(
            f"\nby weight distribution (DEQs of seed {seeds}): the lowest share right over families"
        )
        for key in dict.fromkeys((r["case"], r["distribution"], r["n"]) for r in weights):
            rs = [r for r in weights if (r["case"], r["distribution"], r["n"]) == key]
            low = min(rs, key=lambda r: r["accuracy"])
            print(
                f"  {key[0]:22s} {key[1]:14s} @ {key[2]:5d}: {low['accuracy']:.4f} ({low['family']})"
            )


def _cell(values) -> str:
    """Median (min-max) of shares, as percentages."""
    low, mid, high = min(values), _median(values), max(values)
    if low == high:
        return f"{100 * mid:.2f}%"
    return f"{100 * mid:.2f}% ({100 * low:.2f}-{100 * high:.2f})"


def _groups(cases: dict) -> dict[str, dict]:
    """The cases by algorithm (a case's last word), in order."""
    out: dict[str, dict] = {}
    for case, runs in cases.items():
        out.setdefault(case.rsplit(" ", 1)[1], {})[case] = runs
    return out


def _accuracy_tables(cases: dict) -> str:
    keys = list(next(iter(cases.values()))[0]["accuracy"])
    header = [
        "family @ nodes",
        *[f"{c} ({seeds_cell([r['seed'] for r in rs])})" for c, rs in cases.items()],
    ]
    body = [
        [k, *[_cell([r["accuracy"][k] for r in rs]) if k in rs[0]["accuracy"] else "-"
              for rs in cases.values()]]
        for k in keys
    ]  # fmt: skip
    out = markdown_table(header, body)
    buckets = list(next(iter(cases.values()))[0]["by_distance"])
    body = [
        [b, *[_cell([r["by_distance"][b][0] / max(r["by_distance"][b][1], 1) for r in rs])
              if b in rs[0]["by_distance"] else "-" for rs in cases.values()]]
        for b in buckets
    ]  # fmt: skip
    return out + "\n\n" + markdown_table(["distance from the source", *header[1:]], body)


def _generated_table(cases: dict, generated: list[dict]) -> str:
    """The cases' shares right on the graphs of other generators and the real graphs."""
    rows = [r for r in generated if r["case"] in cases]
    if not rows:
        return ""
    keys = list(dict.fromkeys((r["family"], r["n"]) for r in rows))
    body = [
        [f"{family} @ {n}", *[
            _cell([r["accuracy"] for r in rows if (r["case"], r["family"], r["n"]) == (c, family, n)])
            if any((r["case"], r["family"], r["n"]) == (c, family, n) for r in rows) else "-"
            for c in cases
        ]]
        for family, n in keys
    ]  # fmt: skip
    return "\n\n" + markdown_table(["not generated by eqattn @ nodes", *cases], body)


def _weights_table(weights: list[dict]) -> str:
    """Per model, distribution and size: the lowest share right over the families (which
    family), the most unresolved, and the share of solves converged (the lowest)."""
    body = []
    for key in dict.fromkeys((r["case"], r["distribution"], r["n"]) for r in weights):
        rs = [r for r in weights if (r["case"], r["distribution"], r["n"]) == key]
        low = min(rs, key=lambda r: r["accuracy"])
        body.append(
            [key[0], key[1], f"{key[2]}", f"{100 * low['accuracy']:.2f}% ({low['family']})",
             f"{100 * max(r['unresolved'] for r in rs):.2f}%",
             f"{100 * min(r['converged'] for r in rs):.1f}%", f"{len(rs)}"]
        )  # fmt: skip
    seeds = ", ".join(map(str, sorted({r["seed"] for r in weights})))
    header = [f"DEQ (seed {seeds})", "weights", "nodes", "right (lowest family)", "unresolved (most)",
              "converged (lowest)", "families"]  # fmt: skip
    return "\n\n" + markdown_table(header, body)


def table(payload) -> str:
    """The graphs results file as Markdown: per algorithm, accuracy per family and size by case
    and control (median over the seeds, min-max) and by distance from the source (hops); the
    graphs of other generators; by weight distribution; the runs' sizes and times; the DEQs'
    dynamics."""
    rows = payload["rows"]
    cases = {**_cases(rows), **_cases(rows, "control")}
    generated = [r for r in rows if r["part"] == "generators"]
    out = "\n\n".join(
        _accuracy_tables(group) + _generated_table(group, generated)
        for group in _groups(cases).values()
    )
    weights = [r for r in rows if r["part"] == "weights"]
    if weights:
        out += _weights_table(weights)
    body = [
        [c, f"{_median([r['params'] for r in rs]):,.0f}", f"{_median([r['train_time_s'] for r in rs]):.1f}",
         f"{_median([r['evaluate_s'] for r in rs]):.1f}", f"{_median([r['step_temp_mb'] for r in rs]):.2f}"]
        for c, rs in _cases(rows).items()
    ]  # fmt: skip
    out += "\n\n" + markdown_table(
        ["case", "params", "training s", "evaluation s", "train-step MB"], body
    )
    return out + _dynamics_table([r for r in rows if r["part"] == "dynamics"])


def _dynamics_table(dyn: list[dict]) -> str:
    if not dyn:
        return ""
    body = []
    for key in dict.fromkeys((r["case"], f"{r['family']}@{r['n']}") for r in dyn):
        rs = [r for r in dyn if (r["case"], f"{r['family']}@{r['n']}") == key]
        extra = max(max(s - d for s, d in zip(r["steps"], r["depth"])) for r in rs)
        body.append(
            [key[0], key[1], f"{_median([max(r['depth']) for r in rs]):.0f}", f"{extra}",
             _cell([r["accuracy_4x_unstopped"] for r in rs]),
             _cell([r["agreement_random_starts"] for r in rs]),
             f"{min(r['asymptotic_alignment'] for r in rs):.3f}"]
        )  # fmt: skip
    header = ["DEQ", "family @ nodes", "max depth (hops)", "max steps - depth",
              "4x budget, no stop", "random starts agree", "alignment (min)"]  # fmt: skip
    return "\n\n" + markdown_table(header, body)
