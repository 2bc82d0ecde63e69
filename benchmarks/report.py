"""`python -m benchmarks.report [--results DIR]`: the README's performance tables, in Markdown,
from the suites' JSON files (so every figure in the README comes from a results file)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def result_paths(results: Path, suite: str) -> list[Path]:
    """The suite's results files (the compile suite's tile sweeps are sources, not tables)."""
    paths = sorted(results.glob(f"{suite}-*.json"))
    return [p for p in paths if not p.name.startswith("compile-sweep")]


def _load(results: Path, suite: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in result_paths(results, suite)]


def _source(payload) -> str:
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


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


# Columns beside eqattn's default pass, each where its results file has it.
_CORE_EXTRA = (
    ("eqattn-pallas", "eqattn pallas kernel ms (x xla)"),
    ("eqattn.attention(auto)", "eqattn.attention, auto (cuDNN) ms (x xla)"),
    ("cudnn", "cuDNN ms (x xla)"),
    ("torch-sdpa-flash", "PyTorch SDPA flash ms (x xla)"),
)


def core(payload) -> str:
    rows = payload["rows"]
    by = {(r.get("dtype", "float32"), r["n"], r["mode"], r["impl"]): r for r in rows}
    present = {r["impl"] for r in rows}
    extra = [(impl, header) for impl, header in _CORE_EXTRA if impl in present]

    def cell(r):
        return "" if r is None else f"{r['ms']:.3g} ({r['ratio_to_xla']:.2f}x)"

    out = []
    for (dtype, n, mode, impl), r in by.items():
        if impl != "xla":
            continue
        ours = by[(dtype, n, mode, "eqattn")]
        out.append(
            [
                dtype,
                n,
                mode,
                f"{r['ms']:.3g}",
                cell(ours),
                f"{ours['frac_matmul']:.0%}",
                f"{ours['frac_bandwidth']:.0%}" if "frac_bandwidth" in ours else "",
            ]
            + [cell(by.get((dtype, n, mode, name))) for name, _ in extra]
        )
    return _table(
        [
            "dtype",
            "n = m",
            "mode",
            "xla ms",
            "eqattn ms (x xla)",
            "eqattn % of matmul",
            "eqattn % of bandwidth",
        ]
        + [header for _, header in extra],
        out,
    )


def _share(x: float) -> str:
    """A percentage, with two significant figures below 0.1%."""
    return f"{x:.1%}" if x >= 0.001 else f"{100 * x:.2g}%"


def memory(payload) -> str:
    rows = payload["rows"]
    core = [
        r for r in rows if r["part"] == "core" and r["n"] == max(r["n"] for r in rows if "n" in r)
    ]
    t = {r["case"]: r for r in rows if r["part"] == "core-time"}
    solver = [r for r in rows if r["part"] == "solver"]
    long = [r for r in rows if r["part"] == "long-sequence"]
    timed = [f"fwd+bwd ms at n = m = {next(iter(t.values()))['n']}"] if t else []
    text = _table(
        [f"case (n = m = {core[0]['n']})", "temp MB", "of dense", *timed],
        [
            [r["case"], f"{r['temp_mb']:.1f}", _share(r["of_dense"])]
            + ([f"{t[r['case']]['ms']:.3g}" if r["case"] in t else ""] if t else [])
            for r in core
        ],
    )
    if payload.get("compiled"):
        text += (
            f"\n\nCompiled, not run: the attention core's forward+backward "
            f"(batch x heads = {payload['batch_heads']}, d = {payload['dim']}, "
            f"{payload['dtype']}), temporaries from the compiled program."
        )
    steps = sorted({r["steps"] for r in solver})
    text += (
        ""
        if not solver
        else "\n\n"
        + _table(
            ["backward"] + [f"{s} steps (MB)" for s in steps],
            [
                [case]
                + [
                    f"{next(r['temp_mb'] for r in solver if r['case'] == case and r['steps'] == s):.2f}"
                    for s in steps
                ]
                for case in ("implicit", "unrolled")
            ],
        )
    )
    for r in long:
        peak = r["device_peak_mb"] if r.get("device_peak_mb") else r["peak_rss_mb"]
        where = "device peak" if r.get("device_peak_mb") else "process peak resident"
        text += (
            f"\n\nImplicitAttention training step on {r['tokens']} tokens (width {r['dim']}, "
            f"{r['heads']} heads): {r['temp_mb']:.0f} MB temporary (compiled), {where} "
            f"{peak:.0f} MB, {r['step_s']:.2f} s."
        )
    return text


def deq(payload) -> str:
    """One table per problem (P1; P2 where the file has it); failed cases with their error."""
    tables = []
    rows = payload["rows"]
    groups = dict.fromkeys((r.get("problem", "P1"), r.get("dtype", "float32")) for r in rows)
    for problem, dtype in groups:
        part = [
            r
            for r in rows
            if (r.get("problem", "P1"), r.get("dtype", "float32")) == (problem, dtype)
        ]
        table = _table(
            [
                "method",
                "steps",
                "rel. residual",
                "fwd ms",
                "x baseline",
                "x floor",
                "fwd+bwd ms",
                "x baseline",
                "grad norm",
            ],
            [
                [r["method"], *[""] * 7, f"failed: {r['error'].splitlines()[0][:80]}"]
                if r.get("error")
                else [
                    r["method"],
                    r["steps"],
                    f"{r['relative_residual']:.1e}",
                    f"{r['forward_ms']:.3g}",
                    _maybe(r["forward_ratio"], ".2f"),
                    f"{r['forward_over_floor']:.2f}",
                    f"{r['forward_backward_ms']:.3g}",
                    _maybe(r["forward_backward_ratio"], ".2f"),
                    f"{r['grad_norm']:.2f}",
                ]
                for r in part
            ],
        )
        if len(groups) > 1 or problem != "P1":
            first = part[0]
            size = f"B, N, D = {first.get('B')}, {first.get('N')}, {first.get('D')}"
            table = f"{problem}, {dtype} ({size}):\n\n" + table
        tables.append(table)
    return "\n\n".join(tables)


def _maybe(x, spec) -> str:
    return "" if x is None else format(x, spec)


def layers(payload) -> str:
    return _table(
        [
            "tokens",
            "model",
            "params",
            "step ms",
            "x Transformer d=32 x4",
            "tokens/s",
            "temp MB",
            "solver steps",
        ],
        [
            [
                r["n"],
                r["model"],
                r["params"],
                f"{r['step_ms']:.3g}",
                f"{r['ratio_to_baseline']:.2f}",
                f"{r['tokens_per_s']:.3g}",
                f"{r['temp_mb']:.1f}",
                "" if r["solver_steps"] is None else f"{r['solver_steps']:.1f}",
            ]
            for r in payload["rows"]
        ],
    )


def scaling(payload) -> str:
    rows = payload["rows"]
    fits = {}
    for r in rows:
        if r["part"] in ("batch", "sequence"):
            fits[(r["part"], r["dtype"])] = (
                r["fitted_exponent"],
                r["n"] if r["part"] == "sequence" else r["batch"],
            )
    text = _table(
        ["sweep", "dtype", "fitted exponent of time (three largest sizes)", "largest size"],
        [[p, d, f"{e:.2f}", s] for (p, d), (e, s) in fits.items()],
    )
    devices = [r for r in rows if r["part"] == "devices"]
    if devices:
        text += "\n\n" + _table(
            ["devices", "batch", "step ms", "examples/s", "x 1 device"],
            [
                [
                    r["devices"],
                    r["batch"],
                    f"{r['ms']:.3g}",
                    f"{r['examples_per_s']:.3g}",
                    f"{r['speedup']:.2f}",
                ]
                for r in devices
            ],
        )
    return text


def kernel(payload) -> str:
    """The fastest tiling of each case against the default one."""
    rows = payload["rows"]
    out = []
    for key in dict.fromkeys((r["dtype"], r["d"], r["n"], r["mode"]) for r in rows):
        case = [r for r in rows if (r["dtype"], r["d"], r["n"], r["mode"]) == key]
        timed = [r for r in case if r.get("ms") is not None]
        default = next((r for r in timed if r["tiling"] == "default"), None)
        best = min(timed, key=lambda r: r["ms"]) if timed else None
        out.append(
            [
                *key,
                "" if default is None else f"{default['ms']:.3g}",
                "" if best is None else best["tiling"],
                "" if best is None else f"{best['ms']:.3g} ({best['ratio_to_default']:.2f}x)",
                f"{max(r['rel_error'] for r in timed):.1e}" if timed else "",
                f"{len(timed)} / {len(case)}",
            ]
        )
    return _table(
        [
            "dtype",
            "d",
            "n = m",
            "mode",
            "default ms",
            "fastest tiling",
            "its ms (x default)",
            "max rel. error vs XLA",
            "compiled / tried",
        ],
        out,
    )


def _seeds(seeds) -> str:
    """`[0, 1, 2, 3, 4]` -> "0-4"."""
    if list(seeds) == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 2:
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds))


def training(payload) -> str:
    return _table(
        [
            "case",
            "seeds",
            "test accuracy (mean; min-max over the seeds)",
            "train s",
            "x explicit",
            "first step ms (x explicit)",
            "solver steps (train / test)",
            "converged (test)",
            "step memory MB",
        ],
        [
            [
                r["case"].strip(),
                _seeds(r.get("seeds", payload.get("seeds", []))),
                f"{r['accuracy_mean']:.2%} ({r['accuracy_min']:.2%}-{r['accuracy_max']:.2%})",
                f"{r['train_s']:.3g}",
                # paired by seed where the file has it (older files: ratio of the medians)
                f"{r.get('train_ratio_to_explicit', r['train_s'] / payload['rows'][0]['train_s']):.2f}",
                f"{r['step_ms']:.3g} ({r['step_ratio_to_explicit']:.2f}x)",
                ""
                if r["model_config"].get("model") == "explicit"
                else f"{r['train_solver_steps']:.1f} / {r['test_solver_steps']:.1f}",
                ""
                if r["model_config"].get("model") == "explicit"
                else f"{r['test_converged']:.1%}",
                "" if r["step_temp_mb"] is None else f"{r['step_temp_mb']:.1f}",
            ]
            for r in payload["rows"]
        ],
    )


def ring(payload) -> str:
    rows = payload["rows"]
    memory = [r for r in rows if r["part"] == "memory"]
    dtype = payload.get("dtype", "float32")
    text = f"On {payload.get('devices', 'several devices')}, d = {payload.get('dim')}, {dtype}"
    text += ", compiled, not run.\n\n" if payload.get("compiled") else ".\n\n"
    share, key = (
        ("of the causal ring on CPU", "of_cpu")
        if payload.get("compiled")
        else ("of one device", "of_one_device")
    )
    text += _table(
        [
            f"forward+backward, n = m = {memory[0]['n']}",
            "devices",
            "temp MB per device",
            share,
            "collective permutes",
            "all-gathers",
        ],
        [
            [
                r["case"],
                r["devices"],
                f"{r['temp_mb']:.1f}",
                f"{r[key]:.3f}" if key in r else "",
                r["collective_permutes"],
                r["all_gathers"],
            ]
            for r in memory
        ],
    )
    times = [r for r in rows if r["part"] == "time"]
    text += (
        ""
        if not times
        else "\n\n"
        + _table(
            ["case", "n = m", "fwd+bwd ms", "us per token", "x one device", "causal / plain ring"],
            [
                [
                    r["case"],
                    r["n"],
                    f"{r['ms']:.3g}",
                    f"{r['us_per_token']:.3g}",
                    f"{r['x_one_device']:.2f}",
                    f"{r['of_plain_ring']:.2f}" if "of_plain_ring" in r else "",
                ]
                for r in times
            ],
        )
    )
    skipped = next((r["skipped_pairs"] for r in times if "skipped_pairs" in r), None)
    if skipped is not None:
        text += f"\n\nCausal: the zig-zag schedule skips {skipped:.1%} of the chunk pairs."
    return text


def closure(payload) -> str:
    rows = payload["rows"]
    tilts = sorted({r["tilt"] for r in rows})
    sizes = sorted({r["m"] for r in rows})
    by = {(r["tilt"], r["m"]): r for r in rows}
    slopes = payload.get("slopes_last", {})
    return _table(
        ["t = eta' Sigma eta", *(f"m = {m}" for m in sizes), "slope (last two m)"],
        [
            [
                f"{t:g}",
                *(f"{by[t, m]['error_mean']:.3g} ({by[t, m]['predicted']:.3g})" for m in sizes),
                f"{slopes[str(t)]:.2f}" if str(t) in slopes else "",
            ]
            for t in tilts
        ],
    )


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


def compile_table(payload) -> str:
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
    text = _table(header, out)
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
        text += "\n\n" + _table(
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


def causal(payload) -> str:
    """One row per size and case: forward+backward time, its ratio to XLA's dense causal mask,
    and the gradients' relative error against it."""
    return _table(
        ["n = m", "dtype", "case", "fwd+bwd ms", "x xla", "rel. error vs xla"],
        [
            [r["n"], r["dtype"], r["case"], "", "", f"failed: {r['error'].splitlines()[0][:80]}"]
            if r.get("error")
            else [
                r["n"],
                r["dtype"],
                r["case"],
                f"{r['ms']:.3g}",
                f"{r['x_xla']:.2f}",
                "" if r["rel_error"] is None else f"{r['rel_error']:.1e}",
            ]
            for r in payload["rows"]
        ],
    )


def _text_paired(payload) -> str:
    """The text suite's paired runs (the defaults, then the candidates) and the target."""
    rows = [r for r in payload["rows"] if r["part"] == "paired"]
    if not rows:  # `--short`: no training runs
        return ""
    target = payload["target"]
    paired = _table(
        [
            "model",
            "case",
            "seeds",
            "test bits per byte (per seed)",
            "- explicit (median)",
            "train s",
            "x explicit",
            "solver steps (test)",
            "converged",
            "params",
            "step MB",
        ],
        [
            [
                r["model"],
                r.get("case", "defaults"),
                _seeds(r["seeds"]),
                f"{r['bpb_mean']:.3f} ({', '.join(f'{b:.3f}' for b in r['test_bits_per_byte'])})",
                f"{r['bpb_minus_explicit']:+.3f}",
                f"{r['train_s']:.0f}",
                f"{r['train_ratio_to_explicit']:.2f}",
                "" if r["model"] == "explicit" else f"{r['test_solver_steps']:.1f}",
                "" if r["model"] == "explicit" else f"{r['test_converged']:.0%}",
                f"{r['params']:,}",
                f"{r['step_temp_mb']:.1f}",
            ]
            for r in rows
        ],
    )
    verdict = "met" if payload["meets_target"] else "not met"
    paired += (
        f"\n\nTarget (DEQ <= explicit + {target['bits_per_byte']} bits per byte at <= "
        f"{target['time_ratio']}x its training time), at the defaults: **{verdict}**."
    )
    if rows[2:]:
        met = [f"`{r['case']}`" for r in rows[2:] if r["meets_target"]]
        paired += f" Candidates that meet it: {', '.join(met) or 'none'}."
    return paired + _text_curves(rows)


def _text_curves(rows) -> str:
    """The paired runs' learning curves (results files from before they were recorded: none)."""
    rows = [r for r in rows if "validation_bpb_by_epoch" in r]
    if not rows:
        return ""

    def cells(r):
        bpb = [f"{b:.3f}" for b in r["validation_bpb_by_epoch"]]
        conv = r.get("train_converged_by_epoch")
        return bpb if conv is None else [f"{b} ({c:.0%})" for b, c in zip(bpb, conv)]

    epochs = len(rows[0]["validation_bpb_by_epoch"])
    table = _table(
        ["model", "case", *(f"epoch {e}" for e in range(1, epochs + 1))],
        [[r["model"], r.get("case", "defaults"), *cells(r)] for r in rows],
    )
    return (
        "\n\nValidation bits per byte after each epoch, the mean over the seeds (in brackets, "
        "the DEQ's training solves of that epoch that converged):\n\n" + table
    )


def text(payload) -> str:
    """The paired runs (with the target), the training step against context and solver budget,
    generation speed, and the long-context step's memory."""
    part = lambda name: [r for r in payload["rows"] if r["part"] == name]  # noqa: E731
    paired = _text_paired(payload)
    context = _table(
        ["context", "model", "batch", "step memory MB", "step ms", "x explicit", "solver steps"],
        [
            [
                r["context"],
                r["model"],
                r["batch"],
                f"{r['temp_mb']:.1f}",
                f"{r['step_ms']:.3g}",
                f"{r['ratio_to_explicit']:.2f}",
                "" if r["model"] == "explicit" else f"{r['solver_steps']:.1f}",
            ]
            for r in part("context")
        ],
    )
    solver = _table(
        ["solver step budget", "step memory MB", "step ms"],
        [[r["steps"], f"{r['temp_mb']:.1f}", f"{r['step_ms']:.3g}"] for r in part("solver")],
    )
    generation = _table(
        ["prompt", "model", "mode", "ms per token", "tokens/s", "x DEQ cached", "solver steps"],
        [
            [
                r["prompt"],
                r["model"],
                r["mode"],
                f"{r['ms_per_token']:.3g}",
                f"{r['tokens_per_s']:.0f}",
                f"{r['of_deq_cached']:.2f}",
                "" if r["model"] == "explicit" or r["solver_steps"] is None else r["solver_steps"],
            ]
            for r in part("generation")
        ],
    )
    out = "\n\n".join(t for t in [paired, context, solver, generation] if t)
    for r in part("long-context"):
        device = r.get("device_peak_mb")
        out += (
            f"\n\n`--context {r['context']}`, batch {r['batch']}: one DEQ training step, peak "
            f"resident memory {r['peak_rss_mb']:.0f} MB ({r['temp_mb']:.0f} MB temporary, "
            f"compiled"
            + ("" if device is None else f"; the device's peak allocation {device:.0f} MB")
            + f"), {r['step_s']:.1f} s."
        )
    return out


SECTIONS = {
    "core": core,
    "causal": causal,
    "kernel": kernel,
    "training": training,
    "memory": memory,
    "deq": deq,
    "layers": layers,
    "scaling": scaling,
    "ring": ring,
    "closure": closure,
    "text": text,
    "compile": compile_table,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument(
        "--quick", action="store_true", help="report the --quick runs' results (tiny sizes) only"
    )
    parser.add_argument("suites", nargs="*", metavar="SUITE", help=f"of {', '.join(SECTIONS)}")
    args = parser.parse_args(argv)
    unknown = set(args.suites) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown suite(s) {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    printed = skipped = 0
    for suite in args.suites or SECTIONS:
        for payload in _load(args.results, suite):
            quick = payload["suite"].endswith("-quick")
            if quick != args.quick:
                skipped += 1
                continue
            mark = " (--quick: tiny sizes, not for comparison)" if quick else ""
            if payload["suite"].endswith("-short"):
                mark = " (--short: fewer cases and seeds)"
            print(f"### {suite}: {_source(payload)}{mark}\n")
            print(SECTIONS[suite](payload) + "\n")
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
