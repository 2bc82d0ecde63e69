"""`reasoning_mazes`: the generic equilibrium layer trained on small mazes and asked far larger
ones (`eqattn.mazes`: the cells of the path between a start and a goal), with every control.

Per seed: the DEQ and its explicit twin of equal parameters trained as `eqattn train --task
mazes --seed S` trains them (`MazesTask` through `train.train` at the command's defaults:
`mazes.deq(32, 4)`, mazes of 5, 7 and 9 cells a side; the twin `nn.GraphReasoner.matched`'s,
`reach(9)` untied steps), the last epoch's models; then on 16 fresh mazes of each of 9, 13, 21,
33 and 59 cells a side (seed 10,000 + k), the share solved (every cell right) and of cells right
of the same cases as the prefix sums' `reasoning` suite: the DEQ at the budget rule `4 k^2 +
100`, the untrained DEQ, the trained step tied and run as many times as training runs it
(`reach(9)`), 4 x the budget with the stopping test off, the explicit twin; path independence on
the first 4 mazes of each size; and at 59 x 59 the mazes solved against the step budget. The
tied control, the unstopped solve and the budget sweep are one run of the step scored at each
count (`mazes.score_steps`). The target (the issue's): >= 95% of 59 x 59 mazes, the DEQ >= 20
points above its twin there.

A seed is long: its two trainings (the command's, about 14 minutes on a 2-core CPU), then at 59 x
59 one step of 16 mazes costs about 83 ms there (measured on the untrained model, whose step is
the trained one's), and the solves take up to 14,024 steps each (the DEQ, the untrained DEQ), the
unstopped run 56,096, path independence four solves of 4 mazes: up to about 2.5 hours at that
size where solves do not converge. So `python -m benchmarks reasoning_mazes --seeds S` runs seed
S alone and adds its rows to the results file's (`benchmarks._seeds`), and a full run keeps each
seed's trained runs and finished parts in `runs/benchmarks/reasoning_mazes/seed-S`
(`_reasoning_parts.Work`): interrupted and started again, it goes on from the part in flight.

`--quick`: 8 channels, 2 heads, 5 steps on mazes of 2 cells a side, 2 mazes of 4: it
exercises the code only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from eqattn import mazes

from . import _reasoning_parts

SEEDS = (0, 1, 2)
WORK = Path(__file__).parent.parent / "runs" / "benchmarks" / "reasoning_mazes"
"""Where a full run keeps each seed's trained runs and finished parts (`_reasoning_parts.Work`):
run again, it goes on from there."""
FULL = dict(config={}, sizes=(9, 13, 21, 33, 59), count=16, paths_count=4,
            budgets=(1000, 2000, 4000, 8000, mazes.budget_for(59)))  # fmt: skip
QUICK = dict(config=dict(dim=8, heads=2, sizes=(2,), epochs=1, epoch_steps=5, test_mazes=2,
                         test_sizes=(4,)),
             sizes=(4,), count=2, paths_count=1, budgets=(4, 16))  # fmt: skip


def _draw(count: int, k: int) -> mazes.Mazes:
    return mazes.draw_mazes(np.random.default_rng(10_000 + k), count, k)


PARTS = _reasoning_parts.Parts(
    name="mazes",
    unit="mazes",
    size="cells a side",
    label=lambda k: f"{k} x {k}",
    task=mazes.MazesTask,
    config=mazes.MazesConfig,
    draw=_draw,
    score=mazes.score,
    score_steps=lambda model, data, counts: mazes.score_steps(model, data, counts=counts),
    paths=mazes.path_independence,
    load=mazes.load_model,
)


def settings(quick: bool = False) -> dict:
    """What the results file records of the run's settings."""
    return _reasoning_parts.recorded(PARTS, QUICK if quick else FULL)


def run(quick: bool = False, seeds: tuple[int, ...] | None = None) -> tuple[list[dict], dict]:
    """Every seed's rows (`seeds`: only those; default all three, or seed 0 with `quick`)."""
    chosen = seeds if seeds is not None else (0,) if quick else SEEDS
    work = None if quick else WORK
    return _reasoning_parts.run(PARTS, QUICK if quick else FULL, chosen, work)


def table(payload) -> str:
    """Mazes solved per case and size (median over the seeds, min-max), the DEQ's solver steps
    and convergence, path independence, mazes solved against the step budget, the runs."""
    return _reasoning_parts.table(PARTS, payload)
