"""Timing and reporting shared by the suites.

Timing rules: jit first, compile (and time the compile) separately, one warm-up call, then the
median of `repeats` calls each ended by `block_until_ready`; inputs are put on the device before.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

import eqattn

RESULTS = Path(__file__).parent / "results"


def _compile(fn, args):
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t0
    output = jax.block_until_ready(compiled(*args))  # warm-up
    return compiled, compile_s, output


def _once(compiled, args) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    return time.perf_counter() - t0


def time_jitted(fn, *args, repeats: int = 10) -> dict[str, Any]:
    """Compile `jax.jit(fn)` for `args`, then time it. Returns seconds (median and all repeats)."""
    args = jax.device_put(args)
    compiled, compile_s, output = _compile(fn, args)
    times = [_once(compiled, args) for _ in range(repeats)]
    return {
        "median_s": statistics.median(times),
        "times_s": times,
        "compile_s": compile_s,
        "output": output,
    }


class External:
    """A case that is not a JAX function (e.g. PyTorch): `call()` runs it once and waits for
    the device (`torch.cuda.synchronize()`). Its first call is the warm-up, reported as compile
    time."""

    def __init__(self, call):
        self.call = call

    def __call__(self):
        return self.call()


def time_interleaved(
    cases: dict[str, tuple], repeats: int = 10, errors: dict | None = None
) -> dict[str, dict[str, Any]]:
    """Time several `name: (fn, *args)` cases round-robin: each round calls every case once,
    in the opposite order to the round before.

    Ratios between cases then compare runs made at the same moments, so slow drifts of the
    machine (frequency, neighbours) do not bias them. Returns `time_jitted`'s dict per case
    (`output`: the warm-up call's result, so callers need not compile again to inspect it).
    A case `(External(call),)` is timed in the same rounds by calling `call()`. With `errors` (a
    dict), a case that fails to compile or run is left out and its error stored there.
    `temp_bytes`: the compiled program's temporary memory (XLA's memory analysis; None for an
    `External` case or where the backend gives none).
    """
    compiled = {}
    for name, (fn, *args) in cases.items():
        try:
            if isinstance(fn, External):
                t0 = time.perf_counter()
                output = fn()
                compiled[name] = (lambda fn=fn: fn(), time.perf_counter() - t0, output, ())
                continue
            args = jax.device_put(tuple(args))
            compiled[name] = (*_compile(fn, args), args)
        except Exception as e:
            if errors is None:
                raise
            errors[name] = f"{type(e).__name__}: {str(e)[:300]}"
    times = {name: [] for name in compiled}
    order = list(compiled.items())
    for i in range(repeats):
        # alternate the order: a case that follows a large one (whose buffers were just freed)
        # is not always the same one
        for name, (c, _, _, args) in order if i % 2 == 0 else order[::-1]:
            times[name].append(_once(c, args))
    return {
        name: {
            "median_s": statistics.median(t),
            "times_s": t,
            "compile_s": compiled[name][1],
            "output": compiled[name][2],
            "temp_bytes": _temp_bytes(compiled[name][0]),
        }
        for name, t in times.items()
    }


def _temp_bytes(compiled) -> int | None:
    analysis = getattr(compiled, "memory_analysis", lambda: None)()
    return None if analysis is None else analysis.temp_size_in_bytes


def in_fresh_process(module: str, function: str) -> dict:
    """`module.function()` (no arguments, a JSON-able result) run in a new Python process, so
    that the process's peak resident memory is that call's."""
    code = f"import json; from {module} import {function} as f; print(json.dumps(f()))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"{module}.{function}() failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def matmul_rate(size: int = 2048, repeats: int = 10, dtype=np.float32) -> float:
    """Achieved FLOP/s of a `size x size` matmul on the default device (the ceiling)."""
    a = jax.random.normal(jax.random.key(0), (size, size), dtype)
    t = time_jitted(lambda x, y: x @ y, a, a, repeats=repeats)["median_s"]
    return 2 * size**3 / t


def copy_bandwidth(nbytes: int = 1 << 28, repeats: int = 10) -> float:
    """Achieved bytes/s of an elementwise pass over a float32 array of `nbytes` on the default
    device (read once, written once: `2 * nbytes` moved), the memory-bandwidth ceiling."""
    x = jax.random.normal(jax.random.key(0), (nbytes // 4,), np.float32)
    t = time_jitted(lambda a: a * 2.0, x, repeats=repeats)["median_s"]
    return 2 * nbytes / t


def device_description() -> dict[str, Any]:
    dev = jax.devices()[0]
    return {
        "platform": dev.platform,
        "device_kind": dev.device_kind,
        "device_count": jax.device_count(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
    }


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("jax", "jaxlib", "jaxopt", "equinox"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    out["eqattn"] = eqattn.__version__  # an uninstalled source tree's too
    return out


def git_commit() -> str | None:
    """`EQATTN_COMMIT` from the environment where it is set (a copy of the tree on another
    machine, whose repository, if any, may be stale); else the checkout's commit, with "-dirty"
    when files of `eqattn/` or `benchmarks/` differ from it (`uncommitted`)."""
    if os.environ.get("EQATTN_COMMIT"):
        return os.environ["EQATTN_COMMIT"][:7]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("-dirty" if uncommitted() else "")


def uncommitted() -> list[str] | None:
    """The files under `eqattn/` and `benchmarks/` (tracked, or new Python files) that differ
    from the checkout's commit; None where that cannot be told (no git, or a copy of the tree
    whose commit `EQATTN_COMMIT` names)."""
    if os.environ.get("EQATTN_COMMIT"):
        return None
    root = Path(__file__).parent.parent
    try:
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", "eqattn", "benchmarks"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    changed = [line[3:] for line in status.splitlines()]
    return [f for f in changed if not (f.startswith("benchmarks/results/") or f.endswith("/"))]


def tree_state(out_dir: Path, allow_dirty: bool) -> str:
    """What a results file records of the tree that produced it. Into the committed results
    folder (`RESULTS`), a tree with uncommitted changes to `eqattn/` or `benchmarks/` is refused
    (its figures would name a commit that did not produce them) unless `allow_dirty`, and the
    file then says so."""
    changed = uncommitted()
    if changed is None:
        return "as committed (EQATTN_COMMIT)" if os.environ.get("EQATTN_COMMIT") else "unknown"
    if not changed:
        return "clean"
    listed = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
    if Path(out_dir).resolve() == RESULTS.resolve() and not allow_dirty:
        raise SystemExit(
            f"refusing to write results into {RESULTS} from a tree with uncommitted changes "
            f"({listed}): commit them first, or pass --allow-dirty (the file then says so)"
        )
    return f"uncommitted changes: {listed}"


def results_path(out_dir: Path, suite: str) -> Path:
    """Where `write_results` writes `suite`'s results of this device."""
    dev = device_description()
    tag = dev["device_kind"].lower().replace(" ", "-")
    return Path(out_dir) / f"{suite}-{dev['platform']}-{tag}.json"


def write_results(
    out_dir: Path,
    suite: str,
    rows: list[dict],
    extra: dict | None = None,
    *,
    allow_dirty: bool = False,
    started: tuple[str | None, str] | None = None,
    merge: Callable[[dict], dict] | None = None,
) -> Path:
    """The suite's rows and `extra` as `<suite>-<platform>-<device>.json` in `out_dir`, with
    the device, versions, date, commit and the tree's state (see `tree_state`): `started`, the
    `(git_commit(), tree_state(...))` taken when the run began (the tree that ran, whatever
    changed while it did), or else taken now. `merge`: what is written instead of the payload
    (a seeded run's, with the file's earlier seeds: `benchmarks._seeds`)."""
    commit, tree = started or (git_commit(), tree_state(out_dir, allow_dirty))
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC)
    path = results_path(out_dir, suite)
    payload = {
        "suite": suite,
        "date": stamp.isoformat(timespec="seconds"),
        "device": device_description(),
        "versions": versions(),
        "git_commit": commit,
        "tree": tree,
        **(extra or {}),
        "rows": rows,
    }
    if merge is not None:
        payload = merge(payload)
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path


def print_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> None:
    """Print `rows` with `columns` = [(key, header, format)]."""
    cells = [[h for _, h, _ in columns]]
    for r in rows:
        cells.append([("" if r.get(k) is None else format(r[k], f)) for k, _, f in columns])
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    for j, line in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(line, widths)))
        if j == 0:
            print("  ".join("-" * w for w in widths))


def result_paths(results: Path, suite: str) -> list[Path]:
    """The suite's results files (the compile suite's tile sweeps are sources, not tables)."""
    paths = sorted(results.glob(f"{suite}-*.json"))
    return [p for p in paths if not p.name.startswith("compile-sweep")]


def load_results(results: Path, suite: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in result_paths(results, suite)]


def source_line(payload) -> str:
    dev, v = payload["device"], payload["versions"]
    if payload["suite"] == "compile" or payload.get("compiled"):
        return (
            f"{dev['description']}, compiled with no device (not run), jax {v.get('jax')}, "
            f"{payload['date'][:10]}, commit {payload.get('git_commit')}"
        )
    return (
        f"{dev['device_kind']} ({dev['platform']}), jax {v.get('jax')}, {payload['date'][:10]}, "
        f"commit {payload.get('git_commit')}"
    )


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def seeds_cell(seeds) -> str:
    """`[0, 1, 2, 3, 4]` -> "0-4"."""
    if list(seeds) == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 2:
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds))
