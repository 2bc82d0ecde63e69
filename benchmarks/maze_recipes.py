"""`python -m benchmarks.maze_recipes [--model deq|explicit] [--warm W] [--penalty P] [--steps N]
[--lr LR]`: one training recipe of the mazes task, measured (the findings page's mazes figures
come from it).

The DEQ of `eqattn.mazes.deq(32, 4)` (Picard to a relative residual of 1e-4) trained `N`
optimizer steps (AdamW, warm-up over N/20 steps then cosine decay from `LR`, weight decay 1e-4,
gradient norm clipped to 1), each on 8 fresh mazes of each of 5, 7 and 9 cells a side, by
`mazes.mixed_loss`: a partial solve of at most `W x reach(k)` steps without gradient from
zeros or a random start, then `reach(k)` steps with gradient; with `P > 0`, plus `P` times the
relative residual `||f(z) - z|| / ||f(z)||` of the state after `reach(k)` steps from zeros (with
gradient: a push toward a fixed point). Then on 16 mazes of each of 9, 13, 21 and 33 cells a
side (seed 1000 + k): the share solved (every cell right) at the budget rule
`mazes.budget_for(k)`, cells right, solver steps, convergence, and the step tied and run
`reach(9)` times (the training depth). Every size is also scored before training (the
untrained model at its initialisation, seed 0).

`--of RUN` trains nothing: a saved run's DEQ (`eqattn train --task mazes`) on `--count` mazes of
each of 13, 21, 33 and 59 cells a side (`eqattn evaluate`'s held-out mazes, seed 10,000 + k),
each solved alone at the budget rule, and the same DEQ untrained (the run's initialisation)
first: its cells right by their distance, in passages, from the
nearer end of the path (on the path and off it apart), and whether each solve converged. Where
the answer fails far from both ends and right near them, the fixed point carries the ends'
signal only so far.

`--model explicit` trains the DEQ's explicit twin of equal parameters instead
(`nn.GraphReasoner.matched`, `reach(9)` untied steps: as deep as the DEQ's training runs with
gradient) by the same recipe (no partial solve, no penalty: it has no fixed point).
"""

from __future__ import annotations

import argparse
import json
import time

import equinox as eqx
import jax
import numpy as np
import optax
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import shortest_path

from eqattn import mazes, nn, train

from ._harness import device_description, git_commit

SIZES = (5, 7, 9)
TESTS = (9, 13, 21, 33)


def _scores(model, reach_of_training: int) -> list[dict]:
    rows = []
    for k in TESTS:
        batch = mazes.draw_mazes(np.random.default_rng(1000 + k), 16, k)
        solved = mazes.score(model, batch, budget=mazes.budget_for(k))
        row = dict(k=k, solved=solved)
        line = f"{k} x {k}: solved {solved['mazes']:.3f}, cells {solved['cells']:.4f}"
        if model.is_deq:
            row["tied"] = tied = mazes.score(model, batch, steps=reach_of_training)
            line += (
                f", steps {solved['steps']:.0f}, converged {solved['converged']:.2f}; tied x"
                f"{reach_of_training} {tied['mazes']:.3f}"
            )
        rows.append(row)
        print(line, flush=True)
    return rows


def run(model_kind: str, warm: float, penalty: float, steps: int, lr: float) -> dict:
    depth = mazes.reach(max(SIZES))
    model = mazes.deq(32, 4, key=jax.random.key(0))
    if model_kind == "explicit":
        if penalty:
            raise SystemExit("--penalty: the explicit model has no fixed point to push toward")
        model = nn.GraphReasoner.matched(model, depth=depth, key=jax.random.key(1))
    params = sum(x.size for x in jax.tree.leaves(eqx.filter(model, eqx.is_array)))
    print(f"{model_kind}: {params} parameters; untrained:", flush=True)
    untrained = _scores(model, depth)
    schedule = optax.warmup_cosine_decay_schedule(0, lr, steps // 20, steps)
    optimizer = optax.chain(
        optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=1e-4)
    )
    state = optimizer.init(eqx.filter(model, eqx.is_array))
    update = train.reasoning_step(
        optimizer, lambda m, b, k: mazes.mixed_loss(m, b, k, warm=warm, penalty=penalty)
    )
    rng, key, start = np.random.default_rng(0), jax.random.key(0), time.time()
    for i in range(steps):
        batches = [mazes.draw_mazes(rng, 8, k) for k in SIZES]
        key, sub = jax.random.split(key)
        model, state, value, stats = update(model, state, batches, sub)
        if i % 250 == 0 or i == steps - 1:
            print(
                f"step {i}: {time.time() - start:.0f} s, loss {float(value):.4f}, "
                f"solved {float(stats[0]):.3f}, residual {float(stats[2]):.4f}",
                flush=True,
            )
    result = dict(model=model_kind, params=params, warm=warm, penalty=penalty, steps=steps,
                  lr=lr, train_s=round(time.time() - start, 1), untrained=untrained)  # fmt: skip
    print("trained:", flush=True)
    result["sizes"] = _scores(model, depth)
    return result


BANDS = (0, 12, 23, 45, 89, 177, 10**9)
"""Distances from the nearer end, in passages: the bands' lower bounds (45: beyond `reach(9)`,
the training's steps with gradient)."""


def _from_the_ends(passages, inputs, k: int) -> np.ndarray:
    """Each cell's distance in passages from the nearer of the maze's start and goal."""
    a, b = np.asarray(passages).T
    n = k * k
    adjacency = coo_matrix((np.ones(2 * len(a)), (np.r_[a, b], np.r_[b, a])), shape=(n, n))
    ends = np.flatnonzero(np.asarray(inputs) == 1)
    return shortest_path(adjacency, unweighted=True, indices=ends).min(0)


def by_distance(model, count: int) -> list[dict]:
    """A DEQ maze by maze (module docstring, `--of`)."""
    rows = []
    for k in (13, 21, 33, 59):
        batch = mazes.draw_mazes(np.random.default_rng(10_000 + k), count, k)
        right, far, on_path, converged, steps = [], [], [], [], []
        for i in range(count):
            graph = jax.tree.map(lambda a: a[i], batch.graph)  # noqa: B023
            p = model.predict(batch.inputs[i], graph, budget=mazes.budget_for(k))
            right.append(np.asarray(p.logits).argmax(-1) == batch.targets[i])
            far.append(_from_the_ends(batch.passages[i], batch.inputs[i], k))
            on_path.append(batch.targets[i] == 1)
            converged.append(bool(p.converged))
            steps.append(int(p.steps))
        right, far, on_path = map(np.concatenate, (right, far, on_path))
        bands = []
        for low, high in zip(BANDS, BANDS[1:]):
            band = (far >= low) & (far < high)
            shares = {name: float(right[band & part].mean()) if (band & part).any() else None
                      for name, part in (("on_path", on_path), ("off_path", ~on_path))}  # fmt: skip
            bands.append(dict(low=low, high=high, cells=int(band.sum()), **shares))
        row = dict(k=k, mazes=count, solved=float(np.mean(np.all(np.split(right, count), 1))),
                   cells=float(right.mean()), converged=converged, steps=steps, bands=bands)  # fmt: skip
        rows.append(row)
        print(f"{k} x {k}: solved {row['solved']:.3f}, cells {row['cells']:.4f}, converged "
              f"{np.mean(converged):.2f} (steps {', '.join(map(str, steps))})", flush=True)  # fmt: skip
        for b in bands:
            if b["cells"]:
                on, off = (
                    f"{b[x]:.4f}" if b[x] is not None else "-" for x in ("on_path", "off_path")
                )
                span = f"{b['low']}+" if b["high"] == BANDS[-1] else f"{b['low']}-{b['high'] - 1}"
                print(f"  {span} passages from an end: {b['cells']} cells, "
                      f"right on the path {on}, off it {off}", flush=True)  # fmt: skip
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("deq", "explicit"), default="deq")
    parser.add_argument("--warm", type=float, default=1.0)
    parser.add_argument("--penalty", type=float, default=0.0)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--out", default=None, help="a JSON file for the result")
    parser.add_argument(
        "--of",
        default=None,
        metavar="RUN",
        help="no training: a saved run's DEQ by distance from the path's ends",
    )
    parser.add_argument("--count", type=int, default=8, help="with --of: mazes of each size")
    args = parser.parse_args(argv)
    if args.of:
        loaded = train.load_model(args.of, mazes.MazesTask)
        print("untrained (the run's initialisation):", flush=True)
        untrained = by_distance(train.initial_model(mazes.MazesTask, loaded.config), args.count)
        print("trained:", flush=True)
        result: dict = dict(run=args.of, sizes=by_distance(loaded.model, args.count))
        result["untrained"] = untrained
        result.update(git_commit=git_commit(), device=device_description()["device_kind"])
    else:
        result = run(args.model, args.warm, args.penalty, args.steps, args.lr)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
