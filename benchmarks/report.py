"""`python -m benchmarks.report [--results DIR] [--quick] [SUITE ...]`: the Benchmarks page's
tables, in Markdown, from the suites' JSON files (every figure on the page comes from a results
file). Each suite formats its own table (its module's `table`); this only collects them."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from ._harness import RESULTS, load_results, result_paths, source_line  # noqa: F401 (the docs hook)

SUITES = (
    "core", "causal", "kernel", "training", "memory", "deq", "layers", "scaling", "ring",
    "closure", "text", "text_frontier", "graphs", "graphs_engine", "spanning", "reasoning",
    "reasoning_mazes", "graph_recipes", "compile",
)  # fmt: skip


def table(suite: str, payload: dict) -> str:
    """The suite's table of one results file."""
    return importlib.import_module(f"benchmarks.{suite}").table(payload)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument(
        "--quick", action="store_true", help="report the --quick runs' results (tiny sizes) only"
    )
    parser.add_argument("suites", nargs="*", metavar="SUITE", help=f"of {', '.join(SUITES)}")
    args = parser.parse_args(argv)
    unknown = set(args.suites) - set(SUITES)
    if unknown:
        parser.error(f"unknown suite(s) {sorted(unknown)}; choose from {', '.join(SUITES)}")
    printed = skipped = 0
    for suite in args.suites or SUITES:
        for payload in load_results(args.results, suite):
            quick = payload["suite"].endswith("-quick")
            if quick != args.quick:
                skipped += 1
                continue
            mark = " (--quick: tiny sizes, not for comparison)" if quick else ""
            if payload["suite"].endswith("-short"):
                mark = " (--short: fewer cases and seeds)"
            print(f"### {suite}: {source_line(payload)}{mark}\n")
            print(table(suite, payload) + "\n")
            printed += 1
    if not printed:
        why = (
            f"only {'full' if args.quick else '--quick'} results there"
            + ("" if args.quick else "; pass --quick to print those")
            if skipped
            else "no result files; run `python -m benchmarks [SUITE ...]` first"
        )
        print(f"nothing to report from {args.results}: {why}", file=sys.stderr)


if __name__ == "__main__":
    main()
