"""`graphs`: where the fixed point pays. `eqattn train --task graphs --algorithm A` trains on
graphs of 8-16 nodes, for each algorithm (`bfs`, `shortest-paths`, `mst`), the DEQ
(`nn.ImplicitGraphAttention`) and its explicit twin (equal parameters, 16 untied steps of the
same kind: as many as the training graphs' longest distance needs); both are then scored on
every family at 16, 64, 256, 1024 and 4096 nodes, graphs drawn with seeds no training run saw.

1. Runs: both models with the command's defaults, seeds 0 to 2. Per run: the share of nodes
   with a valid parent (and so reachability right) per family and size at the budget rule
   (`graphs.budget_for`: 2 n + 8), and by hops from the source (`eqattn.train.evaluate`);
   training time, parameters, the training step's compiled memory.
2. Per DEQ run, every family at 16, 64 and 256 nodes: solver steps against each graph's depth
   (the source's eccentricity in hops); the answers at four times the rule with the solver's
   stopping test off (rtol 0: every step runs), against the rule's (no overthinking); and path
   independence: the fixed point from three random starts (normal, the state's scale) against
   the one from zeros, as the share of nodes whose parents agree and the asymptotic-alignment
   score of Anil et al. (2022): the cosine of the two states, each graph's flattened, the mean
   over graphs.

3. Per run (with networkx, the `bench` extra): parents on graphs the project did not generate
   (`benchmarks/_generators.py`): networkx's random 3-regular, Barabasi-Albert, Watts-Strogatz,
   powerlaw-cluster graphs, uniform random trees and connected caves at 64 and 1024 nodes, and
   its real graphs (karate club, Les Miserables, Florentine families; for shortest paths also
   with their own weights), 16 sources each (2 graphs at 1024); with PyGSP, Minnesota's road
   network and an airfoil's mesh (2642 and 4253 nodes, by length), 2 sources each.

`--quick`: BFS's two models and the shortest paths' DEQ, one seed, one epoch of 100 steps, the
evaluation and the dynamics at 16 and 64 nodes, two generators at 64 nodes and one real graph:
it exercises the code only.
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

from eqattn import Picard, graphs, train

from . import _generators
from ._harness import markdown_table, print_table, seeds_cell

SEEDS = (0, 1, 2)
SIZES = {16: 32, 64: 16, 256: 8}
"""Nodes and graphs per family of the DEQs' dynamics."""
STARTS = 3


def _runs(quick: bool) -> list[tuple[str, str, dict, int]]:
    """(case, model, settings, seed) of every training run, algorithm by algorithm (`--quick`:
    BFS's pair and the shortest paths' DEQ)."""
    runs = [
        (f"{m} {algorithm}", m, {"algorithm": algorithm}, seed)
        for algorithm in graphs.ALGORITHMS
        for seed in ((0,) if quick else SEEDS)
        for m in ("deq", "explicit")
    ]
    return runs[:3] if quick else runs


def _train(model: str, settings: dict, seed: int, out: Path, quick: bool) -> dict:
    extra = dict(epoch_steps=100, epochs=1) if quick else {}
    config = graphs.GraphConfig(model=model, seed=seed, **settings, **extra)
    return train.train(graphs.GraphTask(config), out, progress=False)


@eqx.filter_jit
def _solve(model, inputs, budget, z0):
    """Parents and fixed points of a batch, the solves starting from the states `z0`."""
    p = jax.vmap(lambda x, z: model.predict(x, budget=budget, z0=z))(inputs, z0)
    return jax.vmap(graphs.choose_parent)(*p.logits, *inputs[1:3]), p.fixed_point


def _independence(model, inputs, budget) -> tuple[float, float]:
    """The fixed point from `STARTS` random starts (normal, the state's scale; its flag channel
    too) against the one from zeros: the lowest share of nodes whose parents agree, and the
    lowest asymptotic alignment (Anil et al. 2022: the cosine of the two states, each graph's
    flattened, the mean over graphs)."""
    count, n = inputs[0].shape
    zeros = jnp.zeros((count, n, model.layer.cell.width + 1))
    parent, z = jax.device_get(_solve(model, inputs, budget, zeros))
    agree, align = [], []
    for start in range(STARTS):
        z0 = jax.random.normal(jax.random.key(100 + start), zeros.shape)
        p2, z2 = jax.device_get(_solve(model, inputs, budget, z0))
        agree.append(float((p2 == parent).mean()))
        flat, flat2 = z.reshape(count, -1), z2.reshape(count, -1)
        norms = np.linalg.norm(flat, axis=-1) * np.linalg.norm(flat2, axis=-1)
        align.append(float(((flat * flat2).sum(-1) / np.maximum(norms, 1e-12)).mean()))
    return min(agree), min(align)


def _dynamics(model, algorithm: str, sizes: dict[int, int]) -> list[dict]:
    """Per family and size (up to 256 nodes): the share of valid parents at the budget rule and
    at four times it with the stopping test off, solver steps against hops from the source
    (the depth), and path independence from random starts."""
    from eqattn.graphs._weighted import weighted_examples

    unstopped = eqx.tree_at(
        lambda m: m.layer.solver, model, Picard(rtol=0.0, atol=1e-30, max_steps=4096)
    )
    rows = []
    for n, count in sizes.items():
        if n > 256:
            continue
        for family in graphs.WEIGHTED_FAMILIES:
            g = graphs.sample_weighted(family, n, count, seed=2000 + n)
            rule = graphs.budget_for(n)
            w = None if algorithm == "bfs" else g.weights
            rule_out = graphs.predict(model, g.edges, g.source, weights=w, budget=rule)
            long = graphs.predict(unstopped, g.edges, g.source, weights=w, budget=4 * rule)
            inputs = tuple(map(jnp.asarray, weighted_examples(g, algorithm)[0]))
            agree, align = _independence(model, inputs, jnp.asarray(rule))
            rows.append(
                dict(
                    family=family,
                    n=n,
                    depth=graphs.hops(g).max(-1).tolist(),
                    steps=rule_out.steps.tolist(),
                    converged=float(rule_out.converged.mean()),
                    accuracy=float(graphs.score_parents(g, rule_out.parent, algorithm).mean()),
                    accuracy_4x_unstopped=float(
                        graphs.score_parents(g, long.parent, algorithm).mean()
                    ),
                    agreement_random_starts=agree,
                    asymptotic_alignment=align,
                )
            )
    return rows


def _evaluate(out: Path, sizes: dict[int, int] | None) -> dict:
    """`eqattn.train.evaluate` of the run (`sizes`: only these, the rule's budget alone)."""
    if sizes is None:
        return train.evaluate(out, graphs.GraphTask, progress=False)
    model, config, _ = train.load_model(out, graphs.GraphTask)
    rows = graphs.evaluate_sizes(model, config, None, sizes=sizes, sweep=False)
    return {"sizes": rows, "by_distance": graphs.distance_table(rows)}


def _parents_right(model, g, algorithm: str) -> np.ndarray:
    """Per node: a valid parent (and so reachability right)."""
    weights = None if algorithm == "bfs" else g.weights
    out = graphs.predict(model, g.edges, g.source, weights=weights)
    return graphs.score_parents(g, out.parent, algorithm)


def _generated(model, algorithm: str, quick: bool) -> list[dict]:
    """Per networkx generator and size, and per real graph: the share of nodes answered right
    at the budget rule (`graphs.predict`'s default)."""
    sets = []
    for n, count in ({64: 16} if quick else {64: 16, 1024: 2}).items():
        for name in _generators.GENERATORS[:2] if quick else _generators.GENERATORS:
            sets.append((name, n, _generators.draw(name, n, count, seed=n)))
    for name in _generators.REAL[:1] if quick else _generators.REAL:
        g = _generators.draw(name, 0, 16, seed=1)
        sets.append((name, g.edges.num_nodes, g))
        if algorithm == "shortest-paths" and name != "Florentine families":
            sets.append(
                (
                    f"{name} (own weights)",
                    g.edges.num_nodes,
                    _generators.own_weights(name, 16, seed=1),
                )
            )
    if not quick and _generators.available_large():
        sets += [(name, 0, _generators.large(name, 2, seed=1)) for name in _generators.LARGE]
    return [
        dict(
            family=name,
            n=n or g.edges.num_nodes,
            accuracy=float(_parents_right(model, g, algorithm).mean()),
        )
        for name, n, g in sets
    ]


def _size_rows(evaluation: dict) -> dict[str, float]:
    return {f"{r['family']}@{r['n']}": r["at_rule"]["accuracy"] for r in evaluation["sizes"]}


def run(quick: bool = False) -> tuple[list[dict], dict]:
    sizes = {16: 8, 64: 4} if quick else SIZES
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case, model, settings, seed in _runs(quick):
            out = Path(tmp) / f"{case}-{seed}".replace(" ", "-")
            metrics = _train(model, settings, seed, out, quick)
            t0 = time.perf_counter()
            evaluation = _evaluate(out, sizes if quick else None)
            row = dict(
                part="run",
                case=case,
                seed=seed,
                params=metrics["params"],
                train_time_s=metrics["train_time_s"],
                evaluate_s=time.perf_counter() - t0,
                step_temp_mb=metrics["step_temp_memory_mb"],
                test_accuracy=metrics["test_accuracy"],
                accuracy=_size_rows(evaluation),
                by_distance=evaluation["by_distance"],
            )
            rows.append(row)
            loaded = graphs.load_model(out)
            algorithm = settings["algorithm"]
            if _generators.available():
                generated = _generated(loaded, algorithm, quick)
                rows += [dict(part="generators", case=case, seed=seed, **r) for r in generated]
            if model == "deq":
                dynamics = _dynamics(loaded, algorithm, sizes)
                rows += [dict(part="dynamics", case=case, seed=seed, **d) for d in dynamics]
            # every run compiles its programs again (each graph shape, each budget): free the
            # last run's, or a process of 18 runs exhausts the memory maps the CPU JIT needs
            jax.clear_caches()
    _print(rows)
    return rows, {"sizes": sizes, "seeds": [0] if quick else list(SEEDS), "starts": STARTS}


def _median(values):
    return statistics.median(values) if values else float("nan")


def _cases(rows):
    runs = [r for r in rows if r["part"] == "run"]
    return {c: [r for r in runs if r["case"] == c] for c in dict.fromkeys(r["case"] for r in runs)}


def _print(rows) -> None:
    for case, runs in _cases(rows).items():
        print(f"\n{case} ({len(runs)} seed(s)): a valid parent at the budget rule")
        keys = list(runs[0]["accuracy"])
        table = [{"at": k, "acc": _median([r["accuracy"][k] for r in runs])} for k in keys]
        print_table(table, [("at", "family@nodes", "s"), ("acc", "median", ".4f")])
    generated = [r for r in rows if r["part"] == "generators"]
    if not generated:
        print("\n(networkx is not installed: no rows on graphs of other generators)")
    for case in dict.fromkeys(r["case"] for r in generated):
        print(f"\n{case}: right on graphs eqattn did not generate (networkx; seed 0)")
        table = [
            dict(at=f"{r['family']}@{r['n']}", acc=r["accuracy"])
            for r in generated
            if r["case"] == case and r["seed"] == generated[0]["seed"]
        ]
        print_table(table, [("at", "graph@nodes", "s"), ("acc", "share", ".4f")])
    dyn = [r for r in rows if r["part"] == "dynamics"]
    print("\nDEQ dynamics (seed 0): steps - depth, 4x unstopped, random starts")
    print_table(
        [
            dict(
                at=f"{r['family']}@{r['n']}",
                extra=max(s - d for s, d in zip(r["steps"], r["depth"])),
                long=r["accuracy_4x_unstopped"],
                agree=r["agreement_random_starts"],
                align=r["asymptotic_alignment"],
            )
            for r in dyn
            if r["seed"] == 0
        ],
        [
            ("at", "family@nodes", "s"),
            ("extra", "max steps - depth", "d"),
            ("long", "4x unstopped", ".4f"),
            ("agree", "random starts agree", ".4f"),
            ("align", "alignment", ".3f"),
        ],
    )


def _cell(values) -> str:
    """Median (min-max) of shares, as percentages."""
    low, mid, high = min(values), _median(values), max(values)
    if low == high:
        return f"{100 * mid:.2f}%"
    return f"{100 * mid:.2f}% ({100 * low:.2f}-{100 * high:.2f})"


def _groups(cases: dict) -> dict[str, dict]:
    """The cases by algorithm, in order."""
    out: dict[str, dict] = {}
    for case, runs in cases.items():
        out.setdefault(case.split(" ", 1)[1], {})[case] = runs
    return out


def _accuracy_tables(cases: dict) -> str:
    keys = list(next(iter(cases.values()))[0]["accuracy"])
    header = [
        "family @ nodes",
        *[f"{c} ({seeds_cell([r['seed'] for r in rs])})" for c, rs in cases.items()],
    ]
    body = [[k, *[_cell([r["accuracy"][k] for r in rs]) for rs in cases.values()]] for k in keys]
    out = markdown_table(header, body)
    buckets = list(next(iter(cases.values()))[0]["by_distance"])
    body = [
        [
            b,
            *[
                _cell([r["by_distance"][b][0] / max(r["by_distance"][b][1], 1) for r in rs])
                for rs in cases.values()
            ],
        ]
        for b in buckets
    ]
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
            for c in cases
        ]]
        for family, n in keys
    ]  # fmt: skip
    return "\n\n" + markdown_table(["not generated by eqattn @ nodes", *cases], body)


def table(payload) -> str:
    """The graphs results file as Markdown: per algorithm, accuracy per family and size by case
    (median over the seeds, min-max) and by distance from the source (hops); the runs' sizes
    and times; the DEQs' dynamics."""
    rows = payload["rows"]
    cases = _cases(rows)
    generated = [r for r in rows if r["part"] == "generators"]
    out = "\n\n".join(
        _accuracy_tables(group) + _generated_table(group, generated)
        for group in _groups(cases).values()
    )
    body = [
        [c, f"{_median([r['params'] for r in rs]):,.0f}", f"{_median([r['train_time_s'] for r in rs]):.1f}",
         f"{_median([r['evaluate_s'] for r in rs]):.1f}", f"{_median([r['step_temp_mb'] for r in rs]):.2f}"]
        for c, rs in cases.items()
    ]  # fmt: skip
    out += "\n\n" + markdown_table(
        ["case", "params", "training s", "evaluation s", "train-step MB"], body
    )
    dyn = [r for r in rows if r["part"] == "dynamics"]
    if dyn:
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
        out += "\n\n" + markdown_table(
            [
                "DEQ",
                "family @ nodes",
                "max depth (hops)",
                "max steps - depth",
                "4x budget, no stop",
                "random starts agree",
                "alignment (min)",
            ],
            body,
        )
    return out
