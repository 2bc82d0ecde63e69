"""`python -m benchmarks [SUITE ...] [--quick [--jobs N]] [--short] [--seeds S ...] [--out DIR]`:
run suites, print, write JSON (`--quick`: side by side, see `benchmarks._side_by_side`;
`--seeds`: a seeded suite seed by seed, see `benchmarks._seeds`). `python -m
benchmarks compile ...` compiles for accelerators with no device (see `benchmarks.compile`);
`python -m benchmarks gpu ...` is the one command for a lent GPU (see `benchmarks.gpu`)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from pathlib import Path

from ._xla_flags import use_quickest

if "--quick" in sys.argv:  # before JAX starts: quick runs exercise the code, nothing is timed
    use_quickest()

from . import _side_by_side  # noqa: E402
from ._harness import device_description, git_commit, tree_state  # noqa: E402

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
    "reasoning",
    "reasoning_mazes",
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
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="with --quick, suites run side by side, N processes at a time (default: the CPU's "
        "cores); the full suites run one at a time",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        metavar="S",
        help="the seeded suites (reasoning, reasoning_mazes): only these seeds, their rows added "
        "to the suite's results file of this device (a seed run again replaces its own rows)",
    )
    parser.add_argument(
        "--allow-dirty",
        action="store_true",
        help="write into benchmarks/results from a tree with uncommitted changes to eqattn/ or "
        "benchmarks/ (refused otherwise; the results file records them)",
    )
    args = parser.parse_args(argv)
    if args.jobs is not None and (args.jobs < 1 or (args.jobs > 1 and not args.quick)):
        parser.error(
            f"--jobs must be 1, or more with --quick (timed suites run alone); got {args.jobs}"
        )
    # refused before anything runs; the files record the tree that ran, not one edited since
    _check_writable(parser, args.out)
    suites = args.suites or list(SUITES)
    _check_seeds(parser, suites, args.seeds)
    started = (git_commit(), tree_state(args.out, args.allow_dirty))
    dev = device_description()
    print(f"device: {dev['device_kind']} ({dev['platform']}, {dev['device_count']} device(s))")
    jobs = min(args.jobs or (_side_by_side.default_jobs() if args.quick else 1), len(suites))
    options = dict(
        quick=args.quick, short=args.short, out=args.out, allow_dirty=args.allow_dirty,
        started=started, seeds=None if args.seeds is None else tuple(args.seeds),
    )  # fmt: skip
    if jobs == 1:
        print(suite_times({s: _side_by_side.run_suite(s, **options) for s in suites}))
        return
    t0 = time.perf_counter()
    took, failed = _side_by_side.side_by_side(suites, jobs, **options)
    print(suite_times(took, wall=(time.perf_counter() - t0, jobs)))
    if failed:
        sys.exit(f"failed: {', '.join(failed)} (their output above)")


def _check_writable(parser: argparse.ArgumentParser, out: Path) -> None:
    """Refuse a results folder that cannot be made or written before any suite runs (a full
    run would otherwise lose its results when it ends)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        writable = os.access(out, os.W_OK | os.X_OK)
    except OSError as error:
        parser.error(f"--out {out}: cannot make the folder ({error.strerror})")
    if not writable:
        parser.error(f"--out {out}: the folder cannot be written")


def _check_seeds(parser: argparse.ArgumentParser, suites: list[str], seeds) -> None:
    """`--seeds`: named suites that are all seeded, seeds >= 0 and each once."""
    if seeds is None:
        return
    if min(seeds) < 0 or len(set(seeds)) < len(seeds):
        parser.error(f"--seeds must be distinct seeds >= 0; got {' '.join(map(str, seeds))}")
    from ._seeds import takes_seeds

    unseeded = [s for s in suites if not takes_seeds(importlib.import_module(f"benchmarks.{s}"))]
    if unseeded:
        parser.error(f"--seeds: {', '.join(unseeded)} cannot run seed by seed (name seeded suites)")


def suite_times(took: dict[str, float], wall: tuple[float, int] | None = None) -> str:
    """Each suite's time, the slowest first, and the total: a slow suite is seen when it is
    added (the quick run's budget is 180 s on a 2-core CPU). `wall`: (the run's time, the
    processes it ran side by side), for suites run so: the total is the run's time, and the
    suites' sum is said beside it."""
    width = max([*map(len, took), len("total")])
    lines = [f"{s:<{width}} {t:6.1f} s" for s, t in sorted(took.items(), key=lambda x: -x[1])]
    total = f"{'total':<{width}} {sum(took.values()):6.1f} s"
    if wall is not None:
        total = (
            f"{'total':<{width}} {wall[0]:6.1f} s ({wall[1]} processes side by side; "
            f"the suites' sum {sum(took.values()):.1f} s)"
        )
    return "\n".join(["", "suite times:", *lines, total])


if __name__ == "__main__":
    main()
