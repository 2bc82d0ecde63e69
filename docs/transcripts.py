"""Re-run every command transcript of the README and the guides and check its figures.

A transcript is a ```text block right after a `<!-- transcript -->` line (or `<!-- transcript:
full -->` for a slow one): its `$ COMMAND` lines are run in order, each page's in one fresh
folder, and every line printed beneath a command must come out of it again (in order; a line
`...` stands for any number of lines). Durations and rates (`12 s`, `0.45 ms`, `40,700
tokens/s`) may differ; any other figure that differs fails the check, naming the page, the
command and both lines.

    python docs/transcripts.py            # the quick transcripts (CI runs these)
    python docs/transcripts.py --full     # every transcript: before committing docs
    python docs/transcripts.py --full --write   # ... and write what came out into the pages

Run from the repository's root, with eqattn installed (`pip install -e ".[cli]"`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
MARKER = re.compile(r"^<!-- transcript(?:: (full))? -->\n```text\n(.*?)^```", re.M | re.S)
DURATION = re.compile(r"[\d,]+(?:\.\d+)? (?:tokens/s|bytes/s)|\d+(?:\.\d+)? ?(?:s|ms)\b")
NUMBER = re.compile(r"\d[\d,.]*")
TIMEOUT_S = 1800


@dataclasses.dataclass
class Command:
    line: str
    expected: list[str]


@dataclasses.dataclass
class Transcript:
    page: Path
    full: bool
    start: int  # where the block's text starts in the page
    end: int
    commands: list[Command]


def transcripts(page: Path) -> list[Transcript]:
    """The page's transcripts, in order."""
    found = []
    for m in MARKER.finditer(page.read_text()):
        commands: list[Command] = []
        for line in m.group(2).splitlines():
            if line.startswith("$ "):
                commands.append(Command(line[2:], []))
            elif commands:
                commands[-1].expected.append(line)
            else:
                raise SystemExit(f"{page}: a transcript must start with a `$ command` line")
        found.append(Transcript(page, m.group(1) == "full", m.start(2), m.end(2), commands))
    return found


def timeless(line: str) -> str:
    """`line` with its durations masked (they vary from run to run)."""
    return DURATION.sub("<time>", line.rstrip())


def shape(line: str) -> str:
    """`line` with every number masked: which printed line a transcript's line is."""
    return NUMBER.sub("#", timeless(line))


def match(expected: list[str], printed: list[str]) -> list[tuple[str, str | None]]:
    """Each expected line (but `...`) paired with the printed line of its shape, in order; a
    `...` lets lines be skipped, otherwise the next printed line must be it. A line not found
    (None) is filled, where it can be, with the printed line that stands in its place: between
    the lines found before and after it, as many printed lines as lines not found."""
    found: list[int | None] = []
    at, elided, lost = 0, False, False
    lines = [line for line in expected if line.strip() != "..."]
    skips = []  # whether a `...` stands before each line
    for line in expected:
        if line.strip() == "...":
            elided = True
            continue
        skips.append(elided)
        # after a changed line (lost), what follows may stand a line further on
        end = len(printed) if elided or lost else min(at + 1, len(printed))
        hit = next((i for i in range(at, end) if shape(printed[i]) == shape(line)), None)
        found.append(hit)
        if hit is not None:
            at, elided, lost = hit + 1, False, False
        else:
            lost = True
    return [
        (line, printed[hit] if hit is not None else _in_place(found, skips, k, printed))
        for k, (line, hit) in enumerate(zip(lines, found))
    ]


def _in_place(found, skips, k, printed) -> str | None:
    """The printed line standing where expected line `k` (not found) stood, if that is sure."""
    low = k
    while low > 0 and found[low - 1] is None:
        low -= 1
    high = k
    while high + 1 < len(found) and found[high + 1] is None:
        high += 1
    before = -1 if low == 0 else found[low - 1]
    after = len(printed) if high + 1 == len(found) else found[high + 1]
    if any(skips[low : high + 2 if high + 1 < len(found) else high + 1]):
        return None  # a `...` among them: where each stood is not known
    if before is None or after is None or after - before - 1 != high - low + 1:
        return None
    return printed[before + 1 + (k - low)]


def run(command: str, cwd: Path) -> list[str]:
    """`command`'s output (stdout and stderr as they came), run as a user runs it: XLA's own
    settings (`XLA_FLAGS` unset: other compiler settings, such as the tests' quickest ones,
    round differently, and a trained model's figures move)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = env.get("JAX_PLATFORMS", "cpu")
    done = subprocess.run(
        command,
        shell=True,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=TIMEOUT_S,
    )
    if done.returncode:
        raise SystemExit(f"`{command}` exited with {done.returncode}:\n{done.stdout[-3000:]}")
    return done.stdout.splitlines()


def check_page(
    page: Path, full: bool, write: bool, printed_by: dict[str, list[str]] | None = None
) -> list[str]:
    """Run the page's transcripts (the quick ones, or all); the failures, one line each. With
    `write`, the page gets what came out in place of the lines that differ. `printed_by` holds
    what commands printed when they were run already (a test suite running one once for several
    checks): such a command is checked against it instead of being run again."""
    chosen = [t for t in transcripts(page) if full or not t.full]
    if not chosen:
        return []
    failures, text = [], page.read_text()
    replaced: list[tuple[int, int, str]] = []
    with tempfile.TemporaryDirectory() as folder:
        for t in chosen:
            lines = []
            for command in t.commands:
                t0 = time.perf_counter()
                if printed_by and command.line in printed_by:
                    printed = printed_by[command.line]
                else:
                    printed = run(command.line, Path(folder))
                name = f"{page.relative_to(ROOT)}: `{command.line}`"
                print(f"{name} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
                checked = []
                pairs = match(command.expected, printed)
                for want, got in pairs:
                    if got is None:
                        failures.append(f"{name}: no line like {want!r}")
                        checked.append(want)
                    elif shape(got) != shape(want) or timeless(got) != timeless(want):
                        failures.append(f"{name}: {want!r} is now {got.rstrip()!r}")
                        checked.append(got.rstrip())
                    else:
                        checked.append(want)
                lines.append(f"$ {command.line}")
                if write and any(got is None for _, got in pairs):
                    lines += [line.rstrip() for line in printed]  # not sure where: all of it
                    continue
                kept = iter(checked)  # the `...` lines where they stood
                lines += [e if e.strip() == "..." else next(kept) for e in command.expected]
            replaced.append((t.start, t.end, "\n".join(lines) + "\n"))
    if write:
        for start, end, block in reversed(replaced):
            text = text[:start] + block + text[end:]
        page.write_text(text)
    return failures


def main(argv=None, printed_by: dict[str, list[str]] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--full", action="store_true", help="every transcript, the slow ones too")
    p.add_argument("--write", action="store_true", help="write what came out into the pages")
    args = p.parse_args(argv)
    failures = []
    for page in PAGES:
        failures += check_page(page, args.full, args.write, printed_by)
    for failure in failures:
        print(failure, file=sys.stderr)
    if failures and args.write:
        print(f"{len(failures)} line(s) rewritten from this run", file=sys.stderr)
        return 0
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
