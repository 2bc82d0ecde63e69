"""Running suites: one in this process, or several side by side (`python -m benchmarks --quick`
runs them in a process per core). The quick suites are compile-bound and XLA compiles a program
on one core, so one process leaves the others idle; nothing in a quick run is timed for a
verdict, so its suites may share the machine. The full suites run one at a time."""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import io
import multiprocessing
import os
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from . import _seeds
from ._harness import results_path, seeds_cell, write_results
from ._one_context import use_one

SLOWEST_FIRST = (
    "graphs",
    "reasoning",
    "text",
    "text_frontier",
    "spanning",
    "ring",
    "training",
    "graphs_engine",
    "deq",
    "layers",
    "core",
    "memory",
    "causal",
    "kernel",
    "closure",
    "scaling",
)
"""The quick suites by their time on a 2-core CPU (the run's `suite times`), the longest first:
started first, they do not run alone at the end."""


def default_jobs() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def run_suite(
    suite: str,
    *,
    quick: bool,
    short: bool,
    out: Path,
    allow_dirty: bool,
    started,
    seeds: tuple[int, ...] | None = None,
) -> float:
    """Run `suite` in this process: print its tables, write its results into `out` (`started`:
    the tree's state when the run began, see `write_results`; `seeds`: only those, added to the
    results file's others, see `benchmarks._seeds`); returns its time in seconds."""
    print(f"\n== {suite} ==")
    t0 = time.perf_counter()
    module = importlib.import_module(f"benchmarks.{suite}")
    options: dict = {"quick": quick}
    if quick:  # nothing is timed: one MLIR context for all its lowerings
        use_one()
    if short and "short" in inspect.signature(module.run).parameters:
        options["short"] = True
    name = f"{suite}-quick" if quick else f"{suite}-short" if "short" in options else suite
    merge = None
    if seeds is not None:
        earlier = _seeds.previous(results_path(out, name), module.settings(quick))
        options["seeds"] = seeds
        merge = functools.partial(_merged, earlier)
    rows, extra = module.run(**options)
    if quick:  # what the code was compiled with
        extra = {**extra, "xla_flags": os.environ.get("XLA_FLAGS", "")}
    written = write_results(
        out, name, rows, extra, allow_dirty=allow_dirty, started=started, merge=merge
    )
    took = time.perf_counter() - t0
    print(f"wrote {written} ({suite}: {took:.0f} s)")
    return took


def _merged(earlier: dict | None, payload: dict) -> dict:
    """A seeded run's payload with the results file's other seeds (said which it kept and which
    it replaced)."""
    ran = payload["seeds"]
    payload, replaced = _seeds.merged(earlier, payload)
    if earlier is not None:
        kept = sorted(set(earlier["seeds"]) - set(ran))
        again = f"; seeds {seeds_cell(replaced)} run again" if replaced else ""
        print(f"added to {seeds_cell(kept) if kept else 'no'} earlier seeds{again}: the file "
              f"holds seeds {seeds_cell(payload['seeds'])}")  # fmt: skip
    return payload


def _captured(suite: str, options: dict) -> tuple[str, float | None]:
    """`run_suite` in a worker: what it printed (and its traceback, if it failed), and its time
    (None: it failed)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        try:
            took = run_suite(suite, **options)
        except (Exception, SystemExit):
            traceback.print_exc(file=printed)
            took = None
    return printed.getvalue(), took


def side_by_side(suites: list[str], jobs: int, **options) -> tuple[dict[str, float], list[str]]:
    """`run_suite` for each suite in `jobs` worker processes (each imports JAX once and runs
    suites one after another, the slowest first), each suite's output printed whole when it
    ends. Returns each suite's time and the suites that failed."""
    order = sorted(suites, key=lambda s: SLOWEST_FIRST.index(s) if s in SLOWEST_FIRST else -1)
    took: dict[str, float] = {}
    failed: list[str] = []
    # spawned, not forked: this process has started JAX, whose threads a fork would not copy
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(jobs, mp_context=spawn) as pool:
        futures = {pool.submit(_captured, suite, options): suite for suite in order}
        for future in as_completed(futures):
            printed, seconds = future.result()
            print(printed, end="", flush=True)
            if seconds is None:
                failed.append(futures[future])
            else:
                took[futures[future]] = seconds
    return took, failed
