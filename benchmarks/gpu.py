"""`gpu`: the one command to run when a GPU (or TPU) is at hand.

`python -m benchmarks gpu [--out DIR] [--step N|NAME ...] [--all] [--list] [--dry-run]`

Ten steps, each a process of its own limited to 8 minutes, each writing one file into `DIR`
(default `gpu-run/`, ignored by git), so a machine lent for half an hour with commands of at most
10 minutes can run them one call at a time:

1. `tests`: the accelerator-only tests (`-m accelerator`: the compiled kernel against the float64
   reference, cuDNN), their report in `accelerator-tests.txt`;
2. `kernel`: the fused kernel's tile sweep; 3. `core`; 4. `memory`; 5. `deq` (P1 and P2);
6. `layers`; 7. `scaling`: the benchmark suites, each its JSON file;
8. `training`: the training suite's `--short` run (the explicit baseline and the defaults);
9. `causal`: `causal=True` against a dense causal mask, cuDNN's causal kernel and no causality;
10. `text`: the text suite's `--short` run (the language model's training step against context
    up to 4096 and solver budget, generation, one step at `--context 4096`; no training runs).

Without `--step`, a call runs the first step whose file is not in `DIR` yet (`--all`: every such
step), so calling it again resumes; `--step` reruns the steps named. A step past its time limit
leaves `<step>-timed-out.txt` instead and counts as done. Needs eqattn's own dependencies only
(jax, equinox, optax, jaxtyping, jaxopt, optimistix, lineax: pure-Python wheels that can be
carried to a machine without network; scikit-learn for the training step). Set `EQATTN_COMMIT`
where the tree has no git repository, so the results name their commit. At the end it prints
the files to copy into `benchmarks/results/` and commit with the commit that ran.

`--dry-run` runs every step at a tiny size on whatever machine this is (the suites' `--quick`),
so the command is tested where no GPU is: `tests/test_benchmarks.py` runs it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).parent.parent
LIMIT_S = 8 * 60
ACCELERATOR_TESTS = "tests/attention"
"""The folder of every `accelerator`-marked test: the step collects it alone (the whole suite
takes longer to collect than these run; `tests/test_benchmarks.py` checks none is elsewhere)."""


@dataclasses.dataclass(frozen=True)
class Step:
    name: str
    what: str

    def command(self, out: Path, dry_run: bool) -> list[str]:
        if self.name == "tests":
            pytest = [sys.executable, "-m", "pytest", "-m", "accelerator", "-n", "0", "-q"]
            return [*pytest, ACCELERATOR_TESTS]
        short = self.name in ("training", "text")
        size = ["--quick"] if dry_run else ["--short"] if short else []
        return [sys.executable, "-m", "benchmarks", self.name, *size, "--out", str(out)]

    def outputs(self, out: Path) -> list[Path]:
        """This step's file(s) in `out`: its result, or the mark of its time-out."""
        if self.name == "tests":
            found = [out / "accelerator-tests.txt"]
        else:
            found = sorted(out.glob(f"{self.name}-*.json"))
        return [p for p in [*found, out / f"{self.name}-timed-out.txt"] if p.exists()]


STEPS = (
    Step("tests", "accelerator-only tests (compiled kernel and cuDNN vs float64 references)"),
    Step("kernel", "the fused kernel's tile sweep"),
    Step("core", "attention core vs XLA, cuDNN and the kernel"),
    Step("memory", "compiled and device memory"),
    Step("deq", "P1 and P2: solvers and adjoints"),
    Step("layers", "the equilibrium layers"),
    Step("scaling", "sequence length and devices"),
    Step("training", "a short training run: explicit baseline and defaults"),
    Step("causal", "causal=True against dense causal masks, cuDNN and no causality"),
    Step("text", "the language model: step against context and solver budget, generation"),
)


def _select(names: list[str] | None) -> list[Step]:
    if not names:
        return list(STEPS)
    chosen = []
    for name in names:
        match = [s for i, s in enumerate(STEPS, 1) if name in (s.name, str(i))]
        if not match:
            raise SystemExit(f"gpu: no step {name!r}; the steps: {_listing()}")
        chosen += match
    return chosen


def _listing() -> str:
    return ", ".join(f"{i} {s.name}" for i, s in enumerate(STEPS, 1))


def run_step(step: Step, out: Path, dry_run: bool) -> str:
    """Run one step; returns its status line."""
    t0 = time.perf_counter()
    env = {**os.environ}
    try:
        proc = subprocess.run(
            step.command(out, dry_run),
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=LIMIT_S,
        )
    except subprocess.TimeoutExpired as e:
        tail = (e.stdout or b"")[-4000:]
        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        (out / f"{step.name}-timed-out.txt").write_text(
            f"{step.name}: stopped after {LIMIT_S} s\n{tail}"
        )
        return f"{step.name}: timed out after {LIMIT_S} s"
    elapsed = time.perf_counter() - t0
    if step.name == "tests":
        (out / "accelerator-tests.txt").write_text(proc.stdout + proc.stderr[-4000:])
        ok = proc.returncode == 0
    else:
        ok = proc.returncode == 0
    print(proc.stdout[-6000:], end="")
    if not ok:
        print(proc.stderr[-4000:], file=sys.stderr)
    return f"{step.name}: {'done' if ok else f'FAILED (exit status {proc.returncode})'} in {elapsed:.0f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks gpu", description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "gpu-run")
    parser.add_argument(
        "--step", nargs="+", help=f"steps to (re)run, by number or name: {_listing()}"
    )
    parser.add_argument("--all", action="store_true", help="every step not done yet")
    parser.add_argument("--list", action="store_true", help="list the steps and what is done")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes, on any machine")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.list:
        for i, s in enumerate(STEPS, 1):
            done = ", ".join(p.name for p in s.outputs(out)) or "not done"
            print(f"{i}. {s.name}: {s.what} [{done}]")
        return 0
    if args.step:
        todo = _select(args.step)
    else:
        todo = [s for s in STEPS if not s.outputs(out)]
        todo = todo if args.all else todo[:1]
    if not todo:
        print(f"gpu: every step is done in {out}")
    failed = False
    for step in todo:
        print(f"== step {STEPS.index(step) + 1}/{len(STEPS)}: {step.name} ({step.what}) ==")
        status = run_step(step, out, args.dry_run)
        print(status, flush=True)
        failed |= "FAILED" in status
    left = [s.name for s in STEPS if not s.outputs(out)]
    print(f"steps left: {', '.join(left)} (run the command again)" if left else "all steps done")
    files = sorted(p.name for s in STEPS for p in s.outputs(out))
    print(f"results in {out}: {', '.join(files)}")
    if not left:
        print(
            "commit them: copy the JSON files into benchmarks/results/ and the test report "
            "beside them, with the commit that ran (their git_commit)"
        )
    return 1 if failed else 0
