"""Seeded suites run a few seeds at a time: `python -m benchmarks SUITE --seeds S [S ...]` adds
the seeds' rows to the suite's results file of the device instead of replacing it, so that a
suite too long for one sitting (`reasoning_mazes`: hours a seed on a 2-core CPU) is run seed
by seed. A seeded suite's `run` takes `seeds`, and its `settings(quick)` are what its
payload records as `settings`: seeds of other settings are never mixed (the run is refused
before it starts), and a seed run again replaces only its own rows (said when it does). The
payload's `seed_runs` names each seed's commit, tree and date."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from types import ModuleType
from typing import Any

RUN_FIELDS = ("git_commit", "tree", "date")
"""What `seed_runs` records of the run that made each seed's rows."""


def takes_seeds(module: ModuleType) -> bool:
    """Whether a suite's `run` can be given the seeds to run."""
    return "seeds" in inspect.signature(module.run).parameters and hasattr(module, "settings")


def previous(path: Path, settings: dict[str, Any]) -> dict[str, Any] | None:
    """The results file at `path` that a run of `settings` will add its seeds to (None if there
    is none); refused (SystemExit) if it holds other settings' seeds or cannot be read."""
    if not path.exists():
        return None
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise SystemExit(f"--seeds: cannot read {path} to add to it ({error})") from None
    if payload.get("settings") != settings or "seeds" not in payload:
        raise SystemExit(
            f"--seeds: {path} holds a run of other settings; its seeds and these cannot be "
            "set side by side (move it aside first)"
        )
    return payload


def merged(earlier: dict[str, Any] | None, payload: dict[str, Any]) -> tuple[dict, list[int]]:
    """`payload` (one run's rows, each with its `seed`) with `earlier`'s rows of the seeds it
    did not run, `seeds` the union and `seed_runs` each seed's run; and the seeds whose rows of
    `earlier` it replaced."""
    run = {k: payload[k] for k in RUN_FIELDS}
    new = [int(s) for s in payload["seeds"]]
    runs = {} if earlier is None else _seed_runs(earlier)
    runs.update({str(s): run for s in new})
    if earlier is None:
        return {**payload, "seed_runs": runs}, []
    kept = [r for r in earlier["rows"] if r["seed"] not in new]
    seeds = sorted({*earlier["seeds"], *new})
    replaced = sorted(set(new) & set(earlier["seeds"]))
    ordered = {str(s): runs[str(s)] for s in seeds}
    rows = sorted(kept + payload["rows"], key=lambda r: r["seed"])  # stable: each seed's order
    return {**payload, "seeds": seeds, "rows": rows, "seed_runs": ordered}, replaced


def _seed_runs(payload: dict[str, Any]) -> dict[str, dict]:
    """Each seed's run: the payload's `seed_runs`, or for a file of one run, that run's."""
    if "seed_runs" in payload:
        return dict(payload["seed_runs"])
    return {str(s): {k: payload.get(k) for k in RUN_FIELDS} for s in payload["seeds"]}


def runs_line(payload: dict[str, Any]) -> str | None:
    """The seeds and the runs that made them, where those were several ("seeds 0, 1 (commit
    abc, 2026-12-01), 2 (commit def, 2026-12-02)"); None for one run."""
    runs = payload.get("seed_runs")
    if not runs or len({(r["git_commit"], r["date"]) for r in runs.values()}) < 2:
        return None
    groups: dict[tuple, list[str]] = {}
    for seed, r in runs.items():
        groups.setdefault((r["git_commit"], r["date"][:10], r["tree"]), []).append(seed)
    parts = []
    for (commit, day, tree), seeds in groups.items():
        dirty = "" if tree in ("clean", "as committed (EQATTN_COMMIT)") else f", {tree}"
        parts.append(f"{', '.join(seeds)} (commit {commit}, {day}{dirty})")
    return "seeds " + "; ".join(parts)
