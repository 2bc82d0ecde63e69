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
below the budget's end: accuracy against solver steps). The tied control, the unstopped solve
and that sweep are one run of the step scored at each count (`prefix_sums.score_steps`). A full
run keeps each seed's trained runs and finished parts in `runs/benchmarks/reasoning/seed-S`
(`_reasoning_parts.Work`): started again, it goes on from there. The target (issue's): >= 99% of 512-bit
strings, the DEQ >= 20 points above its twin there.

The common part (training, controls, tables) is `benchmarks._reasoning_parts`'s, shared with
`reasoning_mazes`.

`--quick`: 8 channels, 2 heads, 20 steps on strings of 4 bits, 8 strings of 12 bits, one seed,
a twin of 8 steps: it exercises the code only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from eqattn import prefix_sums

from . import _reasoning_parts

SEEDS = (0, 1, 2)
WORK = Path(__file__).parent.parent / "runs" / "benchmarks" / "reasoning"
"""Where a full run keeps each seed's trained runs and finished parts (`_reasoning_parts.Work`):
run again, it goes on from there."""
FULL = dict(config={}, sizes=(32, 64, 128, 256, 512), count=64,
            budgets=(128, 256, 512, 1024, 2048))  # fmt: skip
QUICK = dict(config=dict(dim=8, heads=2, lengths=(4,), epochs=1, epoch_steps=20, test_strings=8),
             sizes=(12,), count=8, budgets=(4, 16))  # fmt: skip


def _draw(count: int, n: int):
    bits = prefix_sums.draw_bits(np.random.default_rng(10_000 + n), count, n)
    return bits, prefix_sums.prefix_parity(bits)


PARTS = _reasoning_parts.Parts(
    name="prefix sums",
    unit="strings",
    size="bits",
    label=lambda n: f"{n} bits",
    task=prefix_sums.PrefixSumsTask,
    config=prefix_sums.PrefixSumsConfig,
    draw=_draw,
    score=lambda model, data, **options: prefix_sums.score(model, *data, **options),
    score_steps=lambda model, data, counts: prefix_sums.score_steps(model, *data, counts=counts),
    paths=lambda model, data, **options: prefix_sums.path_independence(model, data[0], **options),
    load=prefix_sums.load_model,
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
    """Strings right per case and size (median over the seeds, min-max), the DEQ's solver
    steps and convergence, path independence, accuracy against the step budget, the runs."""
    return _reasoning_parts.table(PARTS, payload)
