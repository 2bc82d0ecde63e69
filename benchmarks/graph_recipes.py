"""`python -m benchmarks.graph_recipes [--algorithm A] [--model deq|explicit] [--steps N]
[--dim D] [--heads H] [--unroll S] [--warm W] [--penalty P] [--lr LR] [--seed K]
[--out FILE] [--of RUN]`: the
generic graph model (`eqattn.graphs.GenericGraphModel`: the library's generic graph
transformer, nothing of the algorithm in its step) learning BFS, shortest paths or the minimum
spanning tree from the parents alone, measured (the findings page's figures of the generic
graph models come from it).

The DEQ (`GenericGraphModel.deq(D, H)`, Picard to a relative residual of 1e-4) trained `N`
optimizer steps (AdamW, warm-up over N/20 steps then cosine decay from `LR`, weight decay 1e-4,
gradient norm clipped to 1), each on 32 fresh graphs of 8-16 nodes of the algorithm's families
(`eqattn train --task graphs`'s data: `GraphTask.batches`), by `graphs.generic_loss`: a partial
solve of at most `W` steps without gradient from zeros or a random start, then `S` steps with
gradient (default 16: a graph of 16 nodes is at most 15 edges deep); with `P > 0`, plus `P`
times the relative residual of the state after `S` steps from zeros (a push toward a fixed
point). Then on 8 graphs of each family at 16, 64 and 256 nodes (seed 7 + n), through
`graphs.predict` at its budget rule 2 n + 8: the share of nodes with a valid parent (ties:
any; the spanning tree: its tie rule's), the share unresolved (-1), the solves' steps and
convergence; for the DEQ also its trained step tied and run `S` times (the fair control of the
twin), and the DEQ at 4 x the budget, with its stopping test and without (the overthinking
control: exactly 4 x the budget's steps). Every size is also scored before training (the
untrained model at its initialisation, seed 0).

Then the trained model on networkx's generators at 64 and 256 nodes (`generated`), and a DEQ's
fade (`fade`: how far the source's signal carries in its fixed point, along a 64-node path).
`--of RUN` trains nothing and reports those two of a saved run's model (`eqattn train --task
generic-graphs`; the findings page's figures of the command's BFS runs).

`--seed K` draws the model (its twin: key K + 1), the training graphs and the partial solves
from `K` (default 0); the evaluation graphs are the same for every seed.

`--model explicit` trains the DEQ's explicit twin of equal parameters instead
(`GenericGraphModel.matched`, `S` untied steps) by the same recipe (no partial solve, no
penalty).

Each run writes its figures to `--out FILE`; `benchmarks/results/graph_recipes-cpu.json`
collects the committed runs' under `rows`, and `python -m benchmarks.report` prints them as one
table per algorithm (the median of the seeds and their range, at each size, for every control).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import equinox as eqx
import jax
import numpy as np
import optax

from benchmarks import _generators
from benchmarks._harness import markdown_table
from eqattn import Picard, graphs, nn, train

SIZES = (16, 64, 256)
GRAPHS = 8


def _tied(model: graphs.GenericGraphModel, steps: int) -> graphs.GenericGraphModel:
    """The DEQ's step, tied and run `steps` times from zeros (an explicit model)."""
    stack = nn.ExplicitGraphTransformer([model.core.step] * steps)  # type: ignore[union-attr]
    return eqx.tree_at(lambda m: m.core, model, stack)


def _unstopped(model: graphs.GenericGraphModel, steps: int) -> graphs.GenericGraphModel:
    """The DEQ solving exactly `steps` steps (a stopping test only an exact fixed point
    passes)."""
    return eqx.tree_at(lambda m: m.core.solver, model, Picard(rtol=1e-30, atol=0.0,
                                                                max_steps=steps))  # fmt: skip


HOPS = ((0, 15), (16, 31), (32, 63), (64, 255))
"""Buckets of edges from the source (the training graphs are at most 15 deep)."""


def _score(model, families, n: int, times: int = 1) -> dict:
    """Shares over 8 graphs of each family of `n` nodes: nodes with a valid parent, nodes
    unresolved; by family and by hops from the source (`HOPS`); the solves' steps and
    convergence."""
    right, unresolved, steps, converged = [], [], [], []
    by_family, hop = {}, []
    for i, family in enumerate(families):
        g = graphs.sample_weighted(family, n, GRAPHS, seed=7 + n + 1000 * i)
        out = graphs.predict(model, g.graph, g.source, budget=times * graphs.budget_for(n))
        ok = graphs.score_parents(g, out.parent, model.algorithm)
        right.append(ok.ravel())
        unresolved.append((out.parent < 0).ravel())
        hop.append(graphs.hops(g).ravel())
        by_family[family] = float(ok.mean())
        steps.append(float(out.steps.mean()))
        converged.append(float(out.converged.mean()))
    ok, h = np.concatenate(right), np.concatenate(hop)
    by_hops = {
        f"{lo}-{hi}": float(ok[(h >= lo) & (h <= hi)].mean())
        for lo, hi in HOPS
        if ((h >= lo) & (h <= hi)).any()
    }
    return dict(
        right=float(ok.mean()),
        unresolved=float(np.concatenate(unresolved).mean()),
        steps=float(np.mean(steps)),
        converged=float(np.mean(converged)),
        by_family=by_family,
        by_hops=by_hops,
    )


def _scores(model, families, unroll: int) -> list[dict]:
    rows = []
    for n in SIZES:
        row = dict(n=n, model=_score(model, families, n))
        line = (
            f"{n} nodes: right {row['model']['right']:.4f}, unresolved "
            f"{row['model']['unresolved']:.4f}"
        )
        if model.is_deq:
            row["tied"] = tied = _score(_tied(model, unroll), families, n)
            row["4x budget"] = more = _score(model, families, n, 4)
            budget = 4 * graphs.budget_for(n)
            row["4x budget, no stop"] = _score(_unstopped(model, budget), families, n, 4)
            line += (
                f", steps {row['model']['steps']:.0f}, converged "
                f"{row['model']['converged']:.2f}; tied x{unroll} {tied['right']:.4f}; 4x "
                f"budget {more['right']:.4f} (converged {more['converged']:.2f}), no stop "
                f"{row['4x budget, no stop']['right']:.4f}"
            )
        rows.append(row)
        print(line, flush=True)
        hops = ", ".join(f"{k}: {v:.3f}" for k, v in row["model"]["by_hops"].items())
        print(f"    by hops {hops}", flush=True)
    return rows


FADE_NODES = 64
FADE_HOPS = (0, 1, 8, 15, 16, 20, 24, 28, 32, 48, 62)


def fade(model: graphs.GenericGraphModel) -> dict:
    r"""How far the source's signal carries in the DEQ's fixed point: on a path of `FADE_NODES`
    nodes from its first node (weights 1), the distance between the states of neighbouring
    nodes (`||z[h+1] - z[h]||`, node `h` is `h` edges from the source) at the hops
    `FADE_HOPS`; where it is 0 the states no longer tell how far a node is. With the solve's
    steps and convergence, and the learned factors of the heads' inverse temperatures
    ($\gamma$ of $\gamma / \sqrt{d_k}$)."""
    n = FADE_NODES
    g = graphs.from_edges(n, [[(i, i + 1) for i in range(n - 1)]], [0])
    (graph, anchors), _ = graphs.examples(g, model.algorithm)
    one = jax.tree.map(lambda a: a[0], (graph, anchors))
    out = model.predict(one, budget=graphs.budget_for(n))
    z = np.asarray(out.fixed_point, np.float64)
    step = np.linalg.norm(np.diff(z, axis=0), axis=1)
    gamma = np.exp(np.asarray(model.core.step.log_gamma))  # type: ignore[union-attr]
    return dict(
        nodes=n,
        neighbour_distance={h: float(step[h]) for h in FADE_HOPS},
        steps=int(out.steps),
        converged=bool(out.converged),
        gamma=[float(x) for x in gamma],
    )


def generated(model: graphs.GenericGraphModel) -> list[dict]:
    """The share of nodes with a valid parent on 8 graphs of each of networkx's generators
    (`benchmarks._generators.GENERATORS`: weights uniform in (0, 1], nodes in a random order, a
    random source) at 64 and 256 nodes, through `graphs.predict` at its budget rule; none
    without networkx."""
    if not _generators.available():
        return []
    rows = []
    for n in (64, 256):
        for name in _generators.GENERATORS:
            g = _generators.draw(name, n, GRAPHS, seed=n)
            out = graphs.predict(model, g.graph, g.source, budget=graphs.budget_for(n))
            ok = graphs.score_parents(g, out.parent, model.algorithm)
            rows.append(dict(family=name, n=n, right=float(ok.mean()),
                             unresolved=float((out.parent < 0).mean())))  # fmt: skip
        line = ", ".join(f"{r['family']} {r['right']:.4f}" for r in rows if r["n"] == n)
        print(f"networkx's generators at {n} nodes: {line}", flush=True)
    return rows


def _print_fade(row: dict) -> None:
    steps = ", ".join(f"{h}: {d:.3g}" for h, d in row["neighbour_distance"].items())
    print(
        f"fade on a {row['nodes']}-node path (||z[h+1] - z[h]|| by hop h): {steps}; "
        f"{row['steps']} steps, converged {row['converged']}; gamma "
        + ", ".join(f"{x:.2f}" for x in row["gamma"]),
        flush=True,
    )


def run(algorithm: str, kind: str, steps: int, dim: int, heads: int, unroll: int, warm: int,
        penalty: float, lr: float, seed: int = 0) -> dict:  # fmt: skip
    model = graphs.GenericGraphModel.deq(dim, heads, algorithm, key=jax.random.key(seed))
    if kind == "explicit":
        model = graphs.GenericGraphModel.matched(model, depth=unroll, key=jax.random.key(seed + 1))
    task = graphs.GraphTask(graphs.GraphConfig(algorithm=algorithm, epoch_steps=steps))
    params = sum(x.size for x in jax.tree.leaves(eqx.filter(model, eqx.is_array)))
    print(f"{algorithm} {kind}: {params} parameters; untrained:", flush=True)
    untrained = _scores(model, task.families, unroll)
    schedule = optax.warmup_cosine_decay_schedule(0, lr, max(steps // 20, 1), steps)
    optimizer = optax.chain(
        optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=1e-4)
    )
    state = optimizer.init(eqx.filter(model, eqx.is_array))
    loss = lambda m, batch, key: graphs.generic_loss(  # noqa: E731
        m, *batch, key, steps=unroll, warm=warm, penalty=penalty
    )
    update = train.reasoning_step(optimizer, loss)
    key, start = jax.random.key(seed), time.time()
    for i, (batch, _) in enumerate(task.batches(np.random.default_rng(seed), None)):
        key, sub = jax.random.split(key)
        model, state, value, stats = update(model, state, batch, sub)
        if i % 250 == 0 or i == steps - 1:
            print(
                f"step {i}: {time.time() - start:.0f} s, loss {float(value):.4f}, "
                f"right {float(stats[0]):.3f}, residual {float(stats[2]):.4f}",
                flush=True,
            )
    train_s = round(time.time() - start, 1)
    print("trained:", flush=True)
    result = dict(algorithm=algorithm, model=kind, seed=seed, params=params, steps=steps, dim=dim,
                  heads=heads, unroll=unroll, warm=warm, penalty=penalty, lr=lr,
                  train_s=train_s, untrained=untrained,
                  sizes=_scores(model, task.families, unroll))  # fmt: skip
    result["generated"] = generated(model)
    if model.is_deq:
        result["fade"] = fade(model)
        _print_fade(result["fade"])
    return result


def _of(path: str) -> dict:
    """A saved run's model and, first, the same model untrained (the run's initialisation):
    on networkx's generators, and a DEQ's fade."""
    loaded = train.load_model(path, graphs.GenericGraphTask)
    model: Any = loaded.model
    print("untrained:", flush=True)
    untrained = generated(train.initial_model(graphs.GenericGraphTask, loaded.config))  # type: ignore[arg-type]
    print("trained:", flush=True)
    result = dict(run=path, untrained=untrained, generated=generated(model))
    if model.is_deq:
        result["fade"] = fade(model)
        _print_fade(result["fade"])
    return result


CASES = (
    ("the DEQ", "deq", "sizes", "model"),
    ("the DEQ untrained", "deq", "untrained", "model"),
    ("its step tied x16", "deq", "sizes", "tied"),
    ("4 x the budget", "deq", "sizes", "4x budget"),
    ("4 x the budget, no stop", "deq", "sizes", "4x budget, no stop"),
    ("the explicit twin", "explicit", "sizes", "model"),
    ("the explicit twin untrained", "explicit", "untrained", "model"),
)
"""A table's rows: (label, the runs' model, their part, the case within it)."""


def shares(rows: list[dict], algorithm: str, case: tuple) -> dict[int, list[float]]:
    """Size -> one case's share of parents right, a value per seed's run."""
    _, kind, part, name = case
    out: dict[int, list[float]] = {}
    for run in rows:
        if run.get("algorithm") == algorithm and run["model"] == kind:
            for size in run[part]:
                if name in size:
                    out.setdefault(size["n"], []).append(size[name]["right"])
    return out


def _cell(values: list[float]) -> str:
    mid = 100 * float(np.median(values))
    if len(values) == 1 or min(values) == max(values):
        return f"{mid:.2f}%"
    return f"{mid:.2f}% ({100 * min(values):.2f}-{100 * max(values):.2f})"


def table(payload: dict) -> str:
    """Per algorithm: parents right at each size (the median over the seeds' runs, min-max)
    of the DEQ and every control; then the runs' parameters and training times."""
    rows = [r for r in payload["rows"] if "algorithm" in r]
    parts = []
    for algorithm in dict.fromkeys(r["algorithm"] for r in rows):
        seeds = sorted({r.get("seed", 0) for r in rows if r["algorithm"] == algorithm})
        body = []
        for case in CASES:
            by_n = shares(rows, algorithm, case)
            if by_n:
                body.append([case[0], *[_cell(by_n[n]) for n in sorted(by_n)]])
        sizes = sorted(shares(rows, algorithm, CASES[0]))
        header = [f"{algorithm} (seeds {', '.join(map(str, seeds))}): parents right",
                  *[f"{n} nodes" for n in sizes]]  # fmt: skip
        parts.append(markdown_table(header, body))
    runs: dict[tuple, list[dict]] = {}
    for r in rows:
        runs.setdefault((r["algorithm"], r["model"]), []).append(r)
    body = [
        [a, m, f"{rs[0]['params']:,}", f"{rs[0]['steps']}", f"{len(rs)}",
         f"{np.median([r['train_s'] for r in rs]):.0f}"]
        for (a, m), rs in runs.items()
    ]  # fmt: skip
    header = ["algorithm", "model", "params", "optimizer steps", "seeds", "training s (median)"]
    return "\n\n".join([*parts, markdown_table(header, body)])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algorithm", choices=tuple(graphs.ALGORITHMS), default="bfs")
    parser.add_argument("--model", choices=("deq", "explicit"), default="deq")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--unroll", type=int, default=16)
    parser.add_argument("--warm", type=int, default=16)
    parser.add_argument("--penalty", type=float, default=0.0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="a JSON file for the result")
    parser.add_argument(
        "--of", default=None, metavar="RUN",
        help="no training: a saved run's model (of `eqattn train --task generic-graphs`) on "
        "networkx's generators, and a DEQ's fade",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.of:
        result = _of(args.of)
    else:
        result = run(args.algorithm, args.model, args.steps, args.dim, args.heads, args.unroll,
                     args.warm, args.penalty, args.lr, args.seed)  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
