"""`python -m benchmarks.plot [--results DIR] [--out DIR]`: PNG plots from the suites' JSON files.

One figure per results file (`<file>.png`), drawn from its rows alone. Needs matplotlib
(`pip install -e ".[bench]"`).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import statistics
from collections import defaultdict
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def _series(rows, key, x, y):
    out = defaultdict(list)
    for r in rows:
        if r.get(y) is not None:
            out[key(r)].append((r[x], r[y]))
    return {k: sorted(v) for k, v in out.items()}


def _lines(ax, series, xlabel, ylabel, title, logx=True, logy=True):
    for label, points in series.items():
        xs, ys = zip(*points)
        ax.plot(xs, ys, marker="o", label=label)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def _core(fig, rows):
    modes = ["forward", "forward+backward"]
    axes = fig.subplots(1, 2)
    for ax, mode in zip(axes, modes):
        part = [r for r in rows if r["mode"] == mode]
        series = _series(part, lambda r: f"{r['impl']} ({r.get('dtype', 'float32')})", "n", "ms")
        _lines(ax, series, "n = m", "time (ms)", mode)


def _causal(fig, rows):
    ax = fig.subplots()
    series = _series(rows, lambda r: f"{r['case']} ({r['dtype']})", "n", "ms")
    _lines(ax, series, "n = m", "time (ms)", "causal attention, forward+backward")


def _memory(fig, rows):
    axes = fig.subplots(1, 2)
    core = [r for r in rows if r["part"] == "core"]
    _lines(
        axes[0],
        _series(core, lambda r: r["case"], "n", "temp_mb"),
        "n = m",
        "temporary memory (MB)",
        "core forward+backward",
    )
    solver = [r for r in rows if r["part"] == "solver"]
    _lines(
        axes[1],
        _series(solver, lambda r: r["case"], "steps", "temp_mb"),
        "solver steps",
        "temporary memory (MB)",
        "ImplicitAttention gradient",
        logy=False,
    )


def _layers(fig, rows):
    ax = fig.subplots()
    _lines(
        ax,
        _series(rows, lambda r: r["model"], "n", "tokens_per_s"),
        "tokens per example",
        "training tokens / s",
        "training step throughput",
    )


def _scaling(fig, rows):
    axes = fig.subplots(1, 3)
    for ax, (part, x, xlabel) in zip(
        axes, [("batch", "batch", "batch"), ("sequence", "n", "n = m")]
    ):
        sub = [r for r in rows if r["part"] == part]
        _lines(ax, _series(sub, lambda r: r["dtype"], x, "ms"), xlabel, "fwd+bwd (ms)", part)
    devices = [r for r in rows if r["part"] == "devices"]
    if devices:
        _lines(
            axes[2],
            _series(devices, lambda r: "DEQTransformer step", "devices", "examples_per_s"),
            "devices",
            "examples / s",
            "data parallel",
        )
    else:
        axes[2].set_axis_off()


def _ring(fig, rows):
    axes = fig.subplots(1, 2)
    memory = [r for r in rows if r["part"] == "memory"]
    axes[0].barh([r["case"] for r in memory], [r["temp_mb"] for r in memory])
    axes[0].set(
        xlabel="temporary memory per device (MB)",
        title=f"forward+backward, n = m = {memory[0]['n']}",
    )
    axes[0].set_xscale("log")
    _lines(
        axes[1],
        _series([r for r in rows if r["part"] == "time"], lambda r: r["case"], "n", "us_per_token"),
        "n = m",
        "fwd+bwd time per token (us)",
        "time per token",
    )


def _deq(fig, rows):
    ax = fig.subplots()
    rows = [r for r in rows if not r.get("error") and r.get("problem", "P1") == "P1"]
    names = [r["method"] for r in rows]
    ax.barh(names, [r["forward_backward_ms"] for r in rows], label="forward+backward")
    ax.barh(names, [r["forward_ms"] for r in rows], label="forward")
    ax.set(xlabel="time (ms)", title="P1: every solver x adjoint")
    ax.invert_yaxis()
    ax.legend(fontsize=7)
    ax.tick_params(axis="y", labelsize=7)


def _kernel(fig, rows):
    axes = fig.subplots(1, 2)
    for ax, mode in zip(axes, ["forward", "forward+backward"]):
        timed = [r for r in rows if r["mode"] == mode and r.get("ratio_to_default") is not None]
        cases = sorted({(r["dtype"], r["d"]) for r in timed})
        tilings = list(dict.fromkeys(r["tiling"] for r in timed))
        width = 0.8 / max(len(cases), 1)
        for c, (dtype, d) in enumerate(cases):
            by = {
                r["tiling"]: r["ratio_to_default"]
                for r in timed
                if (r["dtype"], r["d"]) == (dtype, d)
            }
            ys = [by.get(t, 0.0) for t in tilings]
            ax.barh([i + c * width for i in range(len(tilings))], ys, width, label=f"{dtype} d={d}")
        ax.set_yticks(range(len(tilings)), tilings, fontsize=6)
        ax.axvline(1.0, color="k", lw=0.5)
        ax.set(xlabel="time / default tiling", title=mode)
        ax.invert_yaxis()
        ax.legend(fontsize=7)


def _training(fig, rows):
    ax = fig.subplots()
    for r in rows:
        ax.errorbar(
            r["step_ratio_to_explicit"],
            100 * r["accuracy_mean"],
            yerr=[
                [100 * (r["accuracy_mean"] - r["accuracy_min"])],
                [100 * (r["accuracy_max"] - r["accuracy_mean"])],
            ],
            marker="o",
            capsize=3,
            label=r["case"].strip(),
        )
    ax.set(xlabel="training step time / explicit step", ylabel="test accuracy (%)")
    ax.set_title("DEQ training levers (mean, min-max over seeds)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6)


def _closure(fig, rows):
    ax = fig.subplots(1, 1)
    measured = _series(rows, lambda r: r["tilt"], "m", "error_mean")
    predicted = _series(rows, lambda r: r["tilt"], "m", "predicted")
    for i, t in enumerate(sorted(measured)):
        color = f"C{i}"
        ax.plot(*zip(*measured[t]), "-o", color=color, label=f"t = {t:g}")
        ax.plot(*zip(*predicted[t]), ":", color=color)
    ax.set(
        xlabel="m (keys)",
        ylabel="|attention - (mu + Sigma eta)|",
        title="Gaussian closure: measured (dots), sqrt(e^t (d + t) / m) (dotted)",
    )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def _text(fig, rows):
    axes = fig.subplots(1, 3)
    context = [r for r in rows if r["part"] == "context"]
    _lines(
        axes[0],
        _series(context, lambda r: r["model"], "context", "temp_mb"),
        "context",
        "step memory (MB)",
        "training step, same tokens per step",
    )
    solver = [r for r in rows if r["part"] == "solver"]
    _lines(
        axes[1],
        _series(solver, lambda r: "DEQ", "steps", "temp_mb"),
        "solver step budget",
        "step memory (MB)",
        "implicit backward",
    )
    generation = [r for r in rows if r["part"] == "generation"]
    _lines(
        axes[2],
        _series(generation, lambda r: f"{r['model']} {r['mode']}", "prompt", "ms_per_token"),
        "prompt length",
        "ms per token",
        "generation",
    )


def _graphs(fig, rows):
    axes = fig.subplots(1, 3)
    runs = [r for r in rows if r["part"] == "run" and r["seed"] == 0]
    by_size = defaultdict(list)
    for r in runs:
        for key, value in r["accuracy"].items():
            family, n = key.split("@")
            if family == "path":
                by_size[r["case"]].append((int(n), 100 * value))
    _lines(axes[0], by_size, "nodes (paths)", "valid parents (%)", "seed 0", logy=False)
    buckets = list(runs[0]["by_distance"]) if runs else []
    for r in runs:
        shares = [100 * right / max(total, 1) for right, total in r["by_distance"].values()]
        axes[1].plot(range(len(shares)), shares, marker="o", label=r["case"])
    axes[1].set_xticks(range(len(buckets)), buckets, fontsize=7)
    axes[1].set(xlabel="hops from the source", ylabel="valid parents (%)", title="by hops")
    axes[1].grid(True, alpha=0.3)
    axes[1].legend(fontsize=7)
    dynamics = [r for r in rows if r["part"] == "dynamics" and r["seed"] == 0]
    for family in sorted({r["family"] for r in dynamics}):
        points = [
            (d, s)
            for r in dynamics
            if r["family"] == family
            for d, s in zip(r["depth"], r["steps"])
        ]
        axes[2].scatter(*zip(*points), s=8, label=family)
    axes[2].set(xlabel="depth (source's eccentricity)", ylabel="DEQ solver steps", title="steps")
    axes[2].set(xscale="log", yscale="log")
    axes[2].grid(True, alpha=0.3)
    axes[2].legend(fontsize=7)


def _text_frontier(fig, rows):
    axes = fig.subplots(1, 2)
    gzip_bpb = next((r["bits_per_byte"] for r in rows if r.get("compressor") == "gzip -9"), None)
    for r in (r for r in rows if r["part"] in ("frontier", "kept")):
        label = "DEQ" if r["model"] == "deq" else f"explicit, depth {r['shape'].get('depth')}"
        label += " (kept run)" if r["part"] == "kept" else ""
        axes[0].scatter(r["step_temp_mb"], r["test_bits_per_byte"], label=label)
    if gzip_bpb is not None:
        axes[0].axhline(gzip_bpb, color="gray", linestyle="--", label="gzip -9")
    axes[0].set(xlabel="training step memory (MB)", ylabel="test bits per byte", title="frontier")
    axes[0].grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    sweep = [r for r in rows if r["part"] == "test-time"]
    series = {
        "through the cache": [(r["budget"], r["bits_per_byte"]) for r in sweep],
        "jointly": [(r["budget"], r["joint_bits_per_byte"]) for r in sweep],
    }
    _lines(
        axes[1], series, "solver budget", "test bits per byte", "DEQ: test-time compute", logy=False
    )


def _graphs_engine(fig, rows):
    axes = fig.subplots(1, 2)
    part = [r for r in rows if r["part"] == "attention" and r["mode"] == "forward+backward"]
    series = _series(part, lambda r: f"{r['impl']} ({r['graph']})", "n", "ms")
    _lines(axes[0], series, "nodes", "time (ms)", "attention over edges, forward+backward")
    shortest = [r for r in rows if r["part"] == "shortest"]
    _lines(
        axes[1],
        _series(shortest, lambda r: r["case"], "n", "ms"),
        "nodes (Delaunay)",
        "time (ms)",
        "soft shortest paths against Dijkstra",
    )


def _spanning(fig, rows):
    axes = fig.subplots(1, 2)
    rows = [r for r in rows if r["part"] == "levels"]
    n = max(r["n"] for r in rows)
    for ax, order in zip(axes, ("records", "sorted")):
        series = {
            r["family"]: [(int(k), 100 * v) for k, v in r["tied"].items()]
            for r in rows
            if r["order"] == order and r["n"] == n
        }
        title = f"spanning tree, {order} order, {n} nodes"
        _lines(ax, series, "entries carried (k)", "nodes tied (%)", title, logy=False)


def _reasoning_task(fig, rows, suite: str):
    """A reasoning suite's instances right against size and, at the largest, solver steps
    (medians over the seeds), every case a line."""
    parts = importlib.import_module(f"benchmarks.{suite}").PARTS
    axes = fig.subplots(1, 2)
    sizes = [r for r in rows if r["part"] == "size"]
    median = lambda rs, x: [  # noqa: E731
        (v, 100 * statistics.median([r[parts.unit] for r in rs if r[x] == v]))
        for v in sorted({r[x] for r in rs})
    ]
    cases = dict.fromkeys(r["case"] for r in sizes)
    series = {c: median([r for r in sizes if r["case"] == c], "n") for c in cases}
    right = f"{parts.unit} right (%)"
    _lines(axes[0], series, parts.size, right, f"{parts.name} against size", logy=False)
    budget = [r for r in rows if r["part"] == "budget"]
    if budget:
        title = f"the DEQ at {parts.label(budget[0]['n'])}"
        series = {"deq": median(budget, "budget")}
        _lines(axes[1], series, "solver steps", right, title, logy=False)


def _graph_recipes(fig, rows):
    from benchmarks.graph_recipes import CASES, shares  # the table's cases, the same medians

    algorithms = list(dict.fromkeys(r["algorithm"] for r in rows if "algorithm" in r))
    for ax, algorithm in zip(fig.subplots(1, len(algorithms)), algorithms):
        series = {}
        for case in CASES:
            by_n = shares(rows, algorithm, case)
            if by_n:
                series[case[0]] = [(n, 100 * statistics.median(v)) for n, v in sorted(by_n.items())]
        title = f"{algorithm}: the generic graph model"
        _lines(ax, series, "nodes", "parents right (%, median of seeds)", title, logy=False)


PLOTS = {
    "core": _core,
    "causal": _causal,
    "kernel": _kernel,
    "training": _training,
    "memory": _memory,
    "layers": _layers,
    "scaling": _scaling,
    "ring": _ring,
    "deq": _deq,
    "closure": _closure,
    "text": _text,
    "text_frontier": _text_frontier,
    "graphs": _graphs,
    "graphs_engine": _graphs_engine,
    "spanning": _spanning,
    "reasoning": functools.partial(_reasoning_task, suite="reasoning"),
    "reasoning_mazes": functools.partial(_reasoning_task, suite="reasoning_mazes"),
    "graph_recipes": _graph_recipes,
}


def drawable(payload: dict) -> bool:
    """Whether a results file has a plot: a suite with one, rows, and something run (the
    compiled-only memory and ring results have tables, no plots)."""
    suite = payload["suite"].removesuffix("-quick")
    return suite in PLOTS and bool(payload["rows"]) and not payload.get("compiled")


def plot_file(path: Path, out_dir: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    payload = json.loads(path.read_text())
    if not drawable(payload):
        return None
    draw = PLOTS[payload["suite"].removesuffix("-quick")]
    fig = plt.figure(figsize=(12, 4.5), layout="constrained")
    draw(fig, payload["rows"])
    dev = payload["device"]
    fig.suptitle(f"{path.stem}: {dev['device_kind']}, {payload['date'][:10]}", fontsize=9)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{path.stem}.png"
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plot", description=__doc__)
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of JSON results")
    parser.add_argument(
        "--out", type=Path, default=None, help="folder for PNGs (default: results/plots)"
    )
    args = parser.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit('benchmarks.plot needs matplotlib: pip install -e ".[bench]"') from None
    out_dir = args.out or args.results / "plots"
    for path in sorted(args.results.glob("*.json")):
        out = plot_file(path, out_dir)
        if out is not None:
            print(f"wrote {out}")


if __name__ == "__main__":
    main()
