"""What the tasks' evaluations share: the solver budgets tried at test time (a DEQ's "compute at
test time" knob), a sweep over them that stops once every solve converges, and the progress
bar."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from .._errors import ConfigError


def budgets(max_steps: int) -> list[int]:
    """Step budgets around the trained one: 1, 2, 4, ... and 2x the training budget."""
    out = [b for b in (1, 2, 4, 8, 16, 32) if b < max_steps]
    return out + [max_steps, 2 * max_steps]


def check_budgets(steps: list[int]) -> list[int]:
    """`steps` (solver budgets) sorted, each checked to be >= 1."""
    if not steps or any(b < 1 for b in steps):
        raise ConfigError(f"`budgets` must be solver budgets >= 1; got {list(steps)}")
    return sorted(set(steps))


def budget_sweep(
    steps: list[int], score: Callable[[int], dict[str, Any]]
) -> tuple[list[dict[str, Any]], int | None]:
    """`score(budget)` for each budget in increasing order, until one at which every solve
    converged: a solve stops at its own test, so a larger budget runs the same steps and gives
    the same row. Returns the rows and that budget (None if the sweep ran to the end)."""
    rows = []
    for i, budget in enumerate(steps):
        rows.append(dict(max_steps=budget, **score(budget)))
        if rows[-1]["converged"] >= 1.0 and i < len(steps) - 1:
            return rows, budget
    return rows, None


def sweep_note(result: dict[str, Any]) -> list[str]:
    """The line under a budget table that stopped early."""
    stop = result.get("sweep_converged_at")
    if stop is None:
        return []
    return [f"(every solve converged within {stop} steps: larger budgets give the same results)"]


def solve_cells(budget: int | None, steps: float | None, converged: float | None) -> str:
    """The budget, mean solver steps and share of converged solves as three right-aligned cells
    of an evaluation table's row (`-` in each for a model that does not solve: `budget` None):
    the tasks' evaluation reports share them."""
    if budget is None:
        return f"{'-':>7} {'-':>6} {'-':>10}"
    return f"{budget:>7} {steps:>6.0f} {converged:>10.1%}"


def progress_bar(total: int | None, desc: str, enabled: bool | None, unit: str = "batch"):
    """A tqdm bar on stderr (`enabled` None: when stderr is a terminal). A bar that is off is
    plain tqdm's: `tqdm.auto` is imported only for a bar shown (in a notebook without
    ipywidgets it warns as it is imported)."""
    enabled = sys.stderr.isatty() if enabled is None else enabled
    if enabled:
        from tqdm.auto import tqdm
    else:
        from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, file=sys.stderr)
