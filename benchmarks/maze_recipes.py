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

from eqattn import mazes, nn, train

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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("deq", "explicit"), default="deq")
    parser.add_argument("--warm", type=float, default=1.0)
    parser.add_argument("--penalty", type=float, default=0.0)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--out", default=None, help="a JSON file for the result")
    args = parser.parse_args(argv)
    result = run(args.model, args.warm, args.penalty, args.steps, args.lr)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
