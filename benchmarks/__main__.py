"""`python -m benchmarks [SUITE ...] [--quick] [--out DIR]`: run suites, print, write JSON."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from ._harness import device_description, write_results

SUITES = ("core", "kernel", "deq", "training", "memory", "layers", "scaling", "ring", "closure")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument(
        "suites",
        nargs="*",
        choices=[*SUITES, []],
        metavar="SUITE",
        help=f"suites to run (default: all of {', '.join(SUITES)})",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, a few repeats")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).parent / "results",
        help="folder for the JSON results (default: benchmarks/results)",
    )
    args = parser.parse_args(argv)
    dev = device_description()
    print(f"device: {dev['device_kind']} ({dev['platform']}, {dev['device_count']} device(s))")
    for suite in args.suites or SUITES:
        print(f"\n== {suite} ==")
        module = importlib.import_module(f"benchmarks.{suite}")
        rows, extra = module.run(quick=args.quick)
        name = f"{suite}-quick" if args.quick else suite
        print(f"wrote {write_results(args.out, name, rows, extra)}")


if __name__ == "__main__":
    main()
