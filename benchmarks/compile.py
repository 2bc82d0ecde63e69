"""`compile`: eqattn's fused kernel compiled for accelerators this host does not have.

`python -m benchmarks compile [--target h100 v5e v6e v5p v4] [--check] [--sweep] [--out DIR]`

Needs the compilers: `pip install -e ".[compile]"` (`jax[cuda12]` at the installed jax version,
and the `libtpu` that jax's `tpu` extra pins). Each target compiles in a process of its own (two
at a time); see `_deviceless` for how, and what is read from the compilers.

- Default: every configuration, the fused kernel's forward and gradient programs through the
  public API (`eqattn.attention_with_lse(..., implementation="pallas")`) for each dtype the
  target takes, d = 32, 64, 128, 256, with no mask, a key-padding mask and a dense causal mask at
  n = m = 4096 (batch 1, 8 heads), and a ragged 1000 x 3000; writes
  `compile-<target>.json` under `--out` (default `benchmarks/results`), and its memory and ring
  rows also as `memory-<target>-compiled.json` and `ring-<target>-compiled.json`.
  Then whole programs (`PROGRAMS`: the `eqattn train` step, an `ImplicitAttention` gradient on
  16,384 tokens with the fused kernel, a `MultiHeadAttention` gradient with `"auto"`), the
  memory suite's attention cases at n = m = 16,384 against XLA's dense attention, and causal
  ring attention on eight devices (`RING_TOKENS`) with eqattn's core, the default and the fused
  kernel per device, for the targets with an eight-device topology (h100: 8 x H100; v5e: a 2 x 4 slice).
- `--check`: the gradient programs only (they hold all three kernels), the memory cases and the
  `"auto"` program, then the verdict: any compile error, any register spill, a kernel the report
  does not describe, VMEM over the generation's limit, or the fused kernel's temporaries above
  `MEMORY_TARGET` of dense fails it (exit status 1); a configuration eqattn refuses before
  compiling passes only where the tile tables say none is spill-free (d = 256 at most). A
  negative control runs every time: an oversized tiling must be judged a failure, or the check
  itself fails. Writes results only with `--out`.
- `--sweep`: the tile sweep behind the tile tables (`_sweep`), to `compile-sweep-<target>.json`.

The compiler reports resources (registers, spills, shared memory, VMEM, compiled temporaries),
never speed: nothing here is a timing of the device.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import importlib.metadata as md
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from . import _deviceless
from ._compile_programs import (  # noqa: F401 (the suite's names)
    CHECKED_PROGRAMS,
    DTYPES,
    HEADS,
    LONG,
    MASKS,
    PROGRAMS,
    RAGGED,
    RING_DIM,
    RING_DTYPE,
    RING_TOKENS,
    SQUARE,
    WIDTHS,
    _memory_rows,
    _program,
    _program_rows,
    _ring_rows,
    _uses,
    cases,
    negative_control,
)
from ._harness import markdown_table, tree_state

RESULTS = Path(__file__).parent / "results"
CHECKED = ("h100", "v5e", "v6e")


# --- whole programs ----------------------------------------------------------------------------


def verdict(row: dict, target: _deviceless.Target) -> list[str]:
    """Why a compiled configuration fails the check (empty: it passes)."""
    if not row["compiled"]:
        if row.get("refused") and row["d"] == 256:
            return []
        return [f"did not compile: {row['error'][:300]}"]
    kernels = row["kernels"]
    if not kernels:
        return ["no eqattn kernel in the compiled program"]
    problems = []
    for name, k in sorted(kernels.items()):
        if target.platform == "cuda":
            if "registers" not in k or "threads" not in k:
                problems.append(f"{name}: ptxas's report or the launch was not found")
            elif k["spill_stores"] or k["spill_loads"]:
                problems.append(
                    f"{name}: spills {k['spill_stores']} bytes of registers "
                    f"({k['spill_loads']} bytes reloaded)"
                )
        elif k["vmem_bytes"] > k["vmem_limit"]:
            problems.append(f"{name}: {k['vmem_bytes']} bytes of VMEM > {k['vmem_limit']}")
    return problems


def _refusal(error: str) -> bool:
    from eqattn._attention._pallas import _triton

    return _triton.REFUSAL in error


def worker(target_name: str, mode: str, out: Path) -> None:
    """Compile one target's configurations in this process and write them as JSON to `out`."""
    target = _deviceless.TARGETS[target_name]
    if mode == "sweep":
        from . import _sweep

        payload = {"rows": _sweep.run(target)}
    else:
        sharding = _deviceless.one_device_sharding(target)
        rows = []
        for case in cases(target.platform, check=mode == "check"):
            fn, args = _program(case, sharding)
            row = {**case, **_deviceless.compile_program(target, fn, args)}
            if not row["compiled"]:
                row["refused"] = _refusal(row["error"])
            row["problems"] = verdict(row, target)
            rows.append(row)
            print(f"{target.name}: {_describe(row)}", flush=True)
        check = mode == "check"
        programs = _program_rows(target, sharding, check) + _memory_rows(target, sharding)
        programs += [] if check else _ring_rows(target)
        for row in programs:
            row["problems"] = [] if row["compiled"] else [f"did not compile: {row['error']}"]
            print(f"{target.name}: {row['case']}: {_program_status(row)}", flush=True)
        control = negative_control(target)
        control["problems"] = verdict(control, target)
        payload = {"rows": rows, "programs": programs, "negative_control": control}
    out.write_text(_dumps({**_header(target), **payload}))


def _dumps(payload: dict) -> str:
    """JSON with one row per line (the sweep has thousands)."""
    head = json.dumps({k: v for k, v in payload.items() if k != "rows"}, indent=1)
    rows = ",\n".join(json.dumps(r) for r in payload["rows"])
    return f'{head[:-2]},\n "rows": [\n{rows}\n ]\n}}\n'


def _program_status(row: dict) -> str:
    if not row["compiled"]:
        return f"FAILED: {row['error'][:200]}"
    share = f" ({row['of_dense']:.1%} of dense)" if "of_dense" in row else ""
    paths = "cuDNN" if row["cudnn"] else ", ".join(row["pallas_kernels"]) or "XLA"
    return f"{row['temp_bytes'] / 2**20:.1f} MB temporary{share}; {paths}; {row['compile_s']:.1f} s"


def _describe(row: dict) -> str:
    head = f"{row['dtype']} d={row['d']} {row['n']}x{row['m']} {row['mask']} {row['pass']}"
    if not row["compiled"]:
        return f"{head}: {'refused' if row.get('refused') else 'FAILED'}: {row['error'][:160]}"
    status = "; ".join(row["problems"]) or "ok"
    return f"{head}: {row['compile_s']:.1f} s, {status}"


def _header(target: _deviceless.Target) -> dict:
    from ._harness import git_commit

    versions = {}
    for pkg in ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "libtpu", "eqattn"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    device = {"target": target.name, "platform": target.platform, "topology": target.topology}
    device["description"] = target.description
    device["ring_topology"] = target.ring_topology
    if target.platform == "cuda":
        device["spec"] = _deviceless.H100_SPEC.read_text()
    else:
        device["vmem_limit"] = target.vmem_limit
    stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return {
        "suite": "compile",
        "date": stamp,
        "device": device,
        "versions": versions,
        "git_commit": git_commit(),
        "compiled_on": f"{os.cpu_count()}-core CPU host, no device (deviceless compilation)",
    }


def _spawn(target: str, mode: str, out: Path) -> tuple[str, int, str]:
    """Run one target's worker, echoing its lines as they come; returns (target, exit status,
    the tail of its error output)."""
    env = {**os.environ, **_deviceless.environment(_deviceless.TARGETS[target])}
    command = [sys.executable, "-m", "benchmarks.compile", "--worker", target, mode, str(out)]
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        for line in proc.stdout:
            print(line, end="", flush=True)
        code = proc.wait()
        err.seek(0)
        return target, code, err.read()[-3000:]


def missing_compilers(targets) -> list[str]:
    """The packages the targets need that are not installed."""
    need = {"cuda": "jax-cuda12-plugin", "tpu": "libtpu"}
    missing = []
    for t in targets:
        pkg = need[_deviceless.TARGETS[t].platform]
        try:
            md.version(pkg)
        except md.PackageNotFoundError:
            missing.append(pkg)
    return sorted(set(missing))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks compile", description=__doc__)
    parser.add_argument("--target", nargs="+", choices=sorted(_deviceless.TARGETS))
    parser.add_argument("--check", action="store_true", help="gate: exit 1 on any failure")
    parser.add_argument("--sweep", action="store_true", help="the tile sweep")
    parser.add_argument("--out", type=Path, help="results folder (default: benchmarks/results)")
    parser.add_argument(
        "--allow-dirty",
        action="store_true",
        help="write into benchmarks/results from a tree with uncommitted changes (recorded)",
    )
    args = parser.parse_args(argv)
    targets = args.target or (list(CHECKED) if args.check else list(_deviceless.TARGETS))
    if missing := missing_compilers(targets):
        print(
            f'compile: {", ".join(missing)} not installed; run `pip install -e ".[compile]"`',
            file=sys.stderr,
        )
        return 2
    mode = "sweep" if args.sweep else ("check" if args.check else "suite")
    out = args.out or (Path(tempfile.mkdtemp()) if args.check else RESULTS)
    tree = tree_state(out, args.allow_dirty)  # refused before anything compiles
    out.mkdir(parents=True, exist_ok=True)
    prefix = "compile-sweep" if args.sweep else "compile"
    paths = {t: out / f"{prefix}-{t}.json" for t in targets}
    failures = []
    with concurrent.futures.ThreadPoolExecutor(max(1, min(2, os.cpu_count() or 1))) as pool:
        jobs = [pool.submit(_spawn, t, mode, paths[t]) for t in targets]
        for job in concurrent.futures.as_completed(jobs):
            target, code, error = job.result()
            if code:
                print(error, file=sys.stderr)
                failures.append(f"{target}: the compiling process failed (exit status {code})")
    if mode == "sweep":
        return 1 if failures else 0
    for t in targets:
        if paths[t].exists():
            payload = {**json.loads(paths[t].read_text()), "tree": tree}
            paths[t].write_text(_dumps(payload))
            failures += _failures(payload)
            if args.out or not args.check:
                print(f"wrote {paths[t]}")
            if mode == "suite":
                for name, derived in compiled_results(payload, RESULTS).items():
                    (out / name).write_text(json.dumps(derived, indent=1) + "\n")
                    print(f"wrote {out / name}")
    return _report(failures, args.check)


def compiled_results(payload: dict, results: Path) -> dict[str, dict]:
    """The memory and ring rows of a compile run as results of those suites, labelled compiled
    (`memory-<target>-compiled.json`, `ring-<target>-compiled.json`): compiled temporaries,
    nothing run. A ring row's `of_cpu` is its share of the causal ring's per-device temporaries
    on simulated CPU devices (`ring-cpu-cpu.json` in `results`, where present)."""
    from . import memory as memory_suite

    target = payload["device"]["target"]
    keys = ("date", "device", "versions", "git_commit", "tree", "compiled_on")
    head = {k: payload[k] for k in keys if k in payload}
    head["compiled"] = True
    keep = ("case", "n", "temp_mb", "of_dense", "compile_s")
    memory = [
        {"part": "core", **{k: r[k] for k in keep}}
        for r in payload["programs"]
        if r["part"] == "core" and "temp_mb" in r
    ]
    out = {}
    if memory:
        out[f"memory-{target}-compiled.json"] = {
            "suite": "memory",
            **head,
            "batch_heads": memory_suite.BH,
            "dim": memory_suite.DIM,
            "dtype": "float32",
            "rows": memory,
        }
    cpu = results / "ring-cpu-cpu.json"
    cpu_rows = json.loads(cpu.read_text())["rows"] if cpu.exists() else []
    cpu_mb = next((r["temp_mb"] for r in cpu_rows if r.get("case") == "ring, causal"), None)
    ring = []
    for r in payload["programs"]:
        if r["part"] == "ring" and r["compiled"]:
            row = {"part": "memory", **{k: r[k] for k in ("case", "n", "devices")}}
            row["temp_mb"] = r["temp_bytes"] / 2**20
            row |= {k: r[k] for k in ("collective_permutes", "all_gathers", "compile_s")}
            ring.append(row | ({"of_cpu": row["temp_mb"] / cpu_mb} if cpu_mb else {}))
    if ring:
        topology = payload["device"]["ring_topology"]
        out[f"ring-{target}-compiled.json"] = {
            "suite": "ring",
            **head,
            "devices": f"{ring[0]['devices']} devices, topology {topology}",
            "dim": RING_DIM,
            "dtype": RING_DTYPE,
            "rows": ring,
        }
    return out


# The fused kernel's compiled forward+backward temporaries at n = m = 16,384, at most this
# share of XLA's dense attention's.
MEMORY_TARGET = 0.05


def _failures(payload: dict) -> list[str]:
    target = payload["device"]["target"]
    out = [f"{target}: {_describe(r)}" for r in payload["rows"] if r["problems"]]
    cuda = payload["device"]["platform"] == "cuda"
    for r in payload["programs"]:
        if r["problems"]:
            out.append(f"{target}: {r['case']}: {'; '.join(r['problems'])[:300]}")
        elif r["case"] in CHECKED_PROGRAMS and r["cudnn"] != cuda:
            # "auto" follows the platform compiled for: cuDNN for the H100, never for a TPU
            out.append(f"{target}: {r['case']}: cuDNN {'missing' if cuda else 'present'}")
        elif r["case"] == "eqattn-pallas" and r["of_dense"] > MEMORY_TARGET:
            out.append(f"{target}: the fused kernel holds {r['of_dense']:.1%} of dense's memory")
    control = payload["negative_control"]
    if not control["problems"]:
        out.append(f"{target}: the negative control (an oversized tiling) passed the check")
    limit = payload["device"].get("vmem_limit")
    if limit and control.get("reported_vmem_limit") != limit:
        out.append(
            f"{target}: the compiler's scoped-VMEM limit ({control.get('reported_vmem_limit')} "
            f"bytes) is not the table's ({limit})"
        )
    return out


def _report(failures: list[str], check: bool) -> int:
    print()
    if not failures:
        print("compile check: every configuration compiled within the limits; " if check else "")
        return 0
    print("\n".join(["compile: failures:", *failures]), file=sys.stderr)
    return 1 if check else 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], Path(sys.argv[4]))
    else:
        sys.exit(main())


def _kernel_cells(rows, gpu: bool) -> list[str]:
    """Per kernel (forward, dk/dv, dq): the worst figures over the configurations."""
    cells = []
    for name in ("forward", "dkdv", "dq"):
        ks = [r["kernels"].get(f"eqattn_attention_{name}") for r in rows if r["compiled"]]
        ks = [k for k in ks if k]
        if not ks:
            cells.append("")
        elif gpu:
            mma = "/".join(sorted({k.get("mma", "?") for k in ks}))
            regs = max(k.get("registers", 0) for k in ks)
            smem = max(k.get("shared_bytes", 0) for k in ks) / 1024
            blocks = min(k.get("blocks_per_sm", 0) for k in ks)
            cells.append(f"{regs} r, {smem:.0f} KB, {mma}, {blocks} b/SM")
        else:
            cells.append(f"{max(k['vmem_bytes'] for k in ks) / 2**20:.2f} MiB")
    return cells


def _program_cells(r: dict) -> list[str]:
    if not r["compiled"]:
        return ["no", "", ""]
    path = "cuDNN" if r.get("cudnn") else "fused kernel" if r.get("pallas_kernels") else "XLA"
    return ["yes", f"{r['temp_bytes'] / 2**20:.1f}", path]


def table(payload) -> str:
    """Per dtype and d: configurations compiled, refused, failed; the kernels' worst resources;
    then the whole programs."""
    gpu = payload["device"]["platform"] == "cuda"
    rows = payload["rows"]
    out = []
    for key in dict.fromkeys((r["dtype"], r["d"]) for r in rows):
        case = [r for r in rows if (r["dtype"], r["d"]) == key]
        spills = max(
            (
                k.get("spill_stores", 0)
                for r in case
                if r["compiled"]
                for k in r["kernels"].values()
            ),
            default=0,
        )
        out.append(
            [
                *key,
                f"{sum(r['compiled'] for r in case)} / {len(case)}",
                sum(bool(r.get("refused")) for r in case),
                sum(bool(r["problems"]) for r in case),
                *([spills] if gpu else []),
                *_kernel_cells(case, gpu),
            ]
        )
    resource = "registers, shared memory, MMA, blocks/SM" if gpu else "scoped VMEM"
    header = ["dtype", "d", "compiled", "refused", "failing the check"]
    header += ["spill bytes"] if gpu else []
    header += [f"forward: {resource}", "dk, dv", "dq"]
    text = markdown_table(header, out)
    limit = payload["device"].get("vmem_limit")
    shapes = sorted({(r["n"], r["m"], r["mask"]) for r in rows})
    text += (
        f"\n\nConfigurations per dtype and d: {len(shapes)} shapes and masks "
        f"({'; '.join(f'{n} x {m} {mask}' for n, m, mask in shapes)}) x "
        f"{len({r['pass'] for r in rows})} programs ({', '.join(sorted({r['pass'] for r in rows}))})"
        + (f"; scoped VMEM limit {limit / 2**20:.0f} MiB." if limit else ".")
    )
    # The memory and ring rows print in those suites' tables (`compile.compiled_results`).
    programs = [r for r in payload.get("programs", []) if r.get("part") == "program"]
    if programs:
        text += "\n\n" + markdown_table(
            ["program", "compiled", "temporaries MB", "attention"],
            [[r["case"], *_program_cells(r)] for r in programs],
        )
    control = payload["negative_control"]
    verdict = "judged a failure" if control["problems"] else "NOT judged a failure"
    why = " ".join(control["problems"][0].split())[:160] if control["problems"] else ""
    if control.get("reported_vmem_limit"):
        why += f" (the limit it names: {control['reported_vmem_limit'] / 2**20:g} MiB)"
    text += f"\n\nNegative control (an oversized tiling): {verdict}: {why}"
    return text
