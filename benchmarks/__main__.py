"""`python -m benchmarks [SUITE ...] [--quick] [--short] [--out DIR]`: run suites, print, write
JSON. `python -m benchmarks compile ...` compiles for accelerators with no device (see
`benchmarks.compile`); `python -m benchmarks gpu ...` is the one command for a lent GPU (see
`benchmarks.gpu`)."""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import sys
import time
from pathlib import Path

from ._xla_flags import use_quickest

if "--quick" in sys.argv:  # before JAX starts: quick runs exercise the code, nothing is timed
    use_quickest()

from ._harness import device_description, git_commit, tree_state, write_results  # noqa: E402

SUITES = (
    "core",
    "causal",
    "kernel",
    "deq",
    "training",
    "memory",
    "layers",
    "scaling",
    "ring",
    "closure",
    "text",
    "text_frontier",
    "graphs",
    "graphs_engine",
    "spanning",
)


# Commands with options of their own: `python -m benchmarks compile ...`, `... gpu ...`.
COMMANDS = ("compile", "gpu")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in COMMANDS:
        sys.exit(importlib.import_module(f"benchmarks.{argv[0]}").main(argv[1:]))
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument(
        "suites",
        nargs="*",
        choices=[*SUITES, []],
        metavar="SUITE",
        help=f"suites to run (default: all of {', '.join(SUITES)})",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, a few repeats, XLA's quickest compile settings: it exercises the code",
    )
    parser.add_argument(
        "--short", action="store_true", help="the suites that have it (training): fewer cases"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).parent / "results",
        help="folder for the JSON results (default: benchmarks/results)",
    )
    parser.add_argument(
        "--allow-dirty",
        action="store_true",
        help="write into benchmarks/results from a tree with uncommitted changes to eqattn/ or "
        "benchmarks/ (refused otherwise; the results file records them)",
    )
    args = parser.parse_args(argv)
    # refused before anything runs; the files record the tree that ran, not one edited since
    started = (git_commit(), tree_state(args.out, args.allow_dirty))
    dev = device_description()
    print(f"device: {dev['device_kind']} ({dev['platform']}, {dev['device_count']} device(s))")
    took: dict[str, float] = {}
    for suite in args.suites or SUITES:
        print(f"\n== {suite} ==")
        t0 = time.perf_counter()
        module = importlib.import_module(f"benchmarks.{suite}")
        options = {"quick": args.quick}
        if args.short and "short" in inspect.signature(module.run).parameters:
            options["short"] = True
        rows, extra = module.run(**options)
        if args.quick:  # what the code was compiled with
            extra = {**extra, "xla_flags": os.environ.get("XLA_FLAGS", "")}
        name = f"{suite}-quick" if args.quick else f"{suite}-short" if "short" in options else suite
        written = write_results(
            args.out, name, rows, extra, allow_dirty=args.allow_dirty, started=started
        )
        took[suite] = time.perf_counter() - t0
        print(f"wrote {written} ({suite}: {took[suite]:.0f} s)")
    print(suite_times(took))


def suite_times(took: dict[str, float]) -> str:
    """Each suite's time, the slowest first, and the total: a slow suite is seen when it is
    added (the quick run's budget is 180 s on a 2-core CPU)."""
    width = max(map(len, took), default=5)
    lines = [f"{s:<{width}} {t:6.1f} s" for s, t in sorted(took.items(), key=lambda x: -x[1])]
    return "\n".join(
        ["", "suite times:", *lines, f"{'total':<{width}} {sum(took.values()):6.1f} s"]
    )


if __name__ == "__main__":
    main()
