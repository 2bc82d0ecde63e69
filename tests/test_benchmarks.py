"""The benchmark runner works end to end at small sizes, every suite (timings are not checked
here)."""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.__main__ import SUITES, main
from benchmarks.gpu import STEPS

from .conftest import FAST_COMPILE
from .quick_results import CHECKS

ROOT = Path(__file__).parent.parent


def test_generation_runs_combine_into_medians_with_their_range():
    """The text suite's generation rows of several runs: per case the median time, every run's,
    and the figures that follow from the median; the table shows the range."""
    from benchmarks._text_speed import combined_runs
    from benchmarks.text import table

    def row(model, mode, ms, batch=None):
        extra = {} if batch is None else {"batch": batch}
        fields = dict(prompt=8, model=model, mode=mode, ms_per_token=ms, solver_steps=None)
        return dict(part="generation", **fields, **extra)

    runs = [
        [row("deq", "cached", c), row("explicit", "generate() batch 64", g, 64)]
        for c, g in ((2.0, 30.0), (1.0, 10.0), (4.0, 20.0))
    ]
    cached, batch = combined_runs(runs)
    assert (cached["ms_per_token"], cached["ms_runs"]) == (2.0, [2.0, 1.0, 4.0])
    assert (cached["of_deq_cached"], cached["tokens_per_s"]) == (1.0, 500.0)
    assert (batch["ms_per_token"], batch["of_deq_cached"], batch["tokens_per_s"]) == (20, 10, 3200)
    assert "| 2 (1-4 (3 runs)) |" in table({"rows": [cached, batch]})


def test_the_large_real_graphs_load_as_published():
    """PyGSP's Minnesota road network and airfoil mesh, as the graphs suite reads them: their
    published node and edge counts, both directions of each edge, lengths in the unit square."""
    pytest.importorskip("pygsp")
    from benchmarks import _generators

    for name, nodes, edges in (("Minnesota roads", 2642, 3303), ("airfoil mesh", 4253, 12289)):
        g = _generators.large(name, 2, seed=0)
        real = g.graph.receivers < nodes
        assert g.graph.num_nodes == nodes and (real.sum(1) == 2 * edges).all(), name
        w = g.weights[real]  # a few Minnesota crossings share their coordinates: length 0
        assert (w >= 0).all() and (w > 0).mean() > 0.99 and w.max() < np.sqrt(2), name
        assert g.source[0] != g.source[1] or (g.graph.senders[0] != g.graph.senders[1]).any()


_THROUGH_GPU_COMMAND = "kernel"
"""The suite run through `benchmarks gpu --dry-run` (one of its steps, and quick)."""
assert _THROUGH_GPU_COMMAND in {s.name for s in STEPS}
_TOGETHER = ("causal", "closure")
"""The two quickest suites, run side by side in `test_quick_suites_run_side_by_side`."""
_GROUPS = (
    ("text",),
    ("text_frontier", "reasoning", "reasoning_mazes"),
    ("training", "deq", "layers"),
    ("scaling", "core", "ring", "memory"),
    (_THROUGH_GPU_COMMAND,),
    ("graphs", "graphs_engine", "spanning"),
)
"""The other suites, a few to a process (`--jobs 1`: one after the other): a process of its own
and a report for each suite cost more than most suites' quick run. The slowest groups first, so
that they start first on the test workers, but the graphs suite's last: it reads the shared
`graph_runs`, and a worker that asks for them while another makes them waits, idle (the group
second: 102 s in one CI run; its three suites apart took 61 s in a run that found them made)."""
assert sorted(sum(_GROUPS, _TOGETHER)) == sorted(SUITES)


def _quick_environment() -> dict[str, str]:
    return {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count=2 {FAST_COMPILE}"}


def _benchmarks(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env or _quick_environment(),
    )


def test_quick_suites_run_side_by_side(tmp_path):
    """`--quick` with several suites runs them in a process per core (here `--jobs 2`): each
    suite's output whole, its results file, its time and the run's wall time at the end; a
    results folder that cannot be made is refused before any suite runs."""
    result = _benchmarks(*_TOGETHER, "--quick", "--jobs", "2", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    for suite in _TOGETHER:
        assert out.count(f"\n== {suite} ==\n") == 1
        (path,) = tmp_path.glob(f"{suite}-quick-*.json")
        CHECKS.get(suite, lambda _: None)(json.loads(path.read_text()))
    times = re.search(r"\nsuite times:\n(?:\w+ +[\d.]+ s\n){2}total +([\d.]+) s \(2 processes", out)
    assert times, out[-500:]
    # a table is printed whole, with its suite (not interleaved with the other's lines)
    block = out.split("\n== causal ==\n")[1].split("\n== ")[0]
    assert "eqattn causal" in block and "wrote " in block
    # a results folder that cannot be made: refused before any suite runs
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    refused = _benchmarks(*_TOGETHER, "--quick", "--out", str(blocked / "results"))
    assert refused.returncode == 2 and f"--out {blocked / 'results'}: cannot make" in refused.stderr
    assert "== causal ==" not in refused.stdout
    assert _benchmarks("core", "--jobs", "2").returncode == 2  # timed suites run alone


def test_a_suite_that_fails_is_named_after_the_others_end(tmp_path, capsys):
    """Side by side, a suite that raises (here: one that does not exist) is reported with its
    traceback and named; the others' results are kept."""
    from benchmarks import _side_by_side

    options = dict(quick=True, short=False, out=tmp_path, allow_dirty=True, started=("x", "y"))
    took, failed = _side_by_side.side_by_side(["no_such_suite", "closure"], 2, **options)
    assert failed == ["no_such_suite"] and set(took) == {"closure"}
    assert "No module named 'benchmarks.no_such_suite'" in capsys.readouterr().out
    assert (tmp_path / "closure-quick-cpu-cpu.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("group", _GROUPS, ids="+".join)
def test_quick_benchmark_runs(group, tmp_path, capsys, request):
    # On 2 CPU devices so the multi-device rows run too (timings are not checked here, so the
    # suite's fast-compile flag applies too).
    # One suite of the GPU command runs through its dry run (so the command cannot rot while no
    # GPU is lent: its steps start the suites' `--quick` alike); the others directly. The graphs
    # suite reads the suite's shared BFS runs.
    env = _quick_environment()
    if "graphs" in group:
        from benchmarks.graphs import REUSE

        env[REUSE] = str(request.getfixturevalue("graph_runs") / "runs" / "graphs")
    if group == (_THROUGH_GPU_COMMAND,):
        command = ["gpu", "--dry-run", "--step", *group]
    else:
        command = [*group, "--quick", "--jobs", "1"]
    result = _benchmarks(*command, "--out", str(tmp_path), env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    if command[0] != "gpu":  # each suite's time, at the end
        times = result.stdout.split("\nsuite times:\n")[-1]
        assert all(re.search(rf"^{suite} +[\d.]+ s$", times, re.M) for suite in group), times
    for suite in group:
        (path,) = tmp_path.glob(f"{suite}-*.json")
        assert path.name.startswith(f"{suite}-quick"), path.name
        payload = json.loads(path.read_text())
        assert payload["rows"] and payload["device"]["platform"] and payload["versions"]["jax"]
        CHECKS.get(suite, lambda _: None)(payload)

    # the report prints quick results with --quick (marked), and says why it prints nothing
    from benchmarks.report import main as report

    report(["--results", str(tmp_path), "--quick"])
    out = capsys.readouterr().out
    assert out.count("(--quick: tiny sizes") == len(group)
    report(["--results", str(tmp_path)])
    printed = capsys.readouterr()
    assert printed.out == "" and "pass --quick to print those" in printed.err

    pytest.importorskip("matplotlib")
    from benchmarks.plot import main as plot

    plot(["--results", str(tmp_path), "--out", str(tmp_path / "plots")])
    assert len(list((tmp_path / "plots").glob("*.png"))) == len(group)


def test_gpu_command_steps_resume_and_list(tmp_path, capsys):
    """The first call runs the first step not done (the accelerator-only tests, all skipped on a
    CPU), the next call would run the second; --list says which files each step left. (In this
    process: the command's own entry runs in `test_quick_benchmark_runs[kernel]`.)"""
    from benchmarks.gpu import main as gpu

    assert gpu(["--out", str(tmp_path), "--dry-run"]) == 0, capsys.readouterr().err[-3000:]
    first = capsys.readouterr().out
    assert "step 1/10: tests" in first and "steps left: kernel," in first
    report = (tmp_path / "accelerator-tests.txt").read_text()
    assert "skipped" in report and "deselected" in report  # selected by marker, none failed
    assert gpu(["--out", str(tmp_path), "--list"]) == 0
    listing = capsys.readouterr().out
    assert "1. tests:" in listing and "[accelerator-tests.txt]" in listing
    assert "2. kernel:" in listing and "[not done]" in listing
    with pytest.raises(SystemExit, match="no step 'nine'"):
        gpu(["--out", str(tmp_path), "--step", "nine"])
    # the step collects one folder: every accelerator-only test is in it
    from benchmarks.gpu import ACCELERATOR_TESTS

    tests = set((ROOT / "tests").rglob("test_*.py")) - {Path(__file__)}
    marked = {p for p in tests if "mark.accelerator" in p.read_text()}
    assert marked and all(p.is_relative_to(ROOT / ACCELERATOR_TESTS) for p in marked), marked


def test_results_name_the_tree_that_made_them(monkeypatch, tmp_path):
    """Into the committed results folder, a tree with uncommitted changes to eqattn/ or
    benchmarks/ is refused unless allowed, and the file then says so; elsewhere it is
    recorded."""
    from benchmarks import _harness

    monkeypatch.delenv("EQATTN_COMMIT", raising=False)
    monkeypatch.setattr(_harness, "uncommitted", lambda: ["eqattn/train/_trainer.py"])
    with pytest.raises(SystemExit, match="uncommitted changes .*eqattn/train/_trainer.py"):
        _harness.tree_state(_harness.RESULTS, allow_dirty=False)
    assert _harness.tree_state(_harness.RESULTS, allow_dirty=True).startswith("uncommitted")
    path = _harness.write_results(tmp_path, "x", [{"a": 1}])
    assert json.loads(path.read_text())["tree"] == "uncommitted changes: eqattn/train/_trainer.py"
    with pytest.raises(SystemExit):
        main(["core", "--quick"])  # the default --out is the committed folder: refused at once
    monkeypatch.setattr(_harness, "uncommitted", lambda: [])
    assert _harness.tree_state(_harness.RESULTS, allow_dirty=False) == "clean"
    # a run records the tree it started from: an edit while it ran neither refuses its results
    # nor is attributed to them
    started = ("abc1234", "clean")
    monkeypatch.setattr(_harness, "uncommitted", lambda: ["eqattn/edited_meanwhile.py"])
    path = _harness.write_results(_harness.RESULTS, "x-test", [{"a": 1}], started=started)
    try:
        payload = json.loads(path.read_text())
        assert (payload["git_commit"], payload["tree"]) == started
    finally:
        path.unlink()


def test_the_operations_profile_names_where_time_goes(capsys):
    """`python -m benchmarks.thunks`: graph attention's time by kind of compiled operation (the
    gathers and scatters of both implementations), and generation's operations a byte (the
    DEQ's more than the explicit model's, its solver steps from both starts)."""
    from benchmarks import thunks

    assert thunks.main(["graph_attention", "--nodes", "256", "--calls", "1"]) == 0
    rows = thunks.graph_attention(256, "degree16", calls=1)
    impls = ["eqattn"] + (["jraph"] if importlib.util.find_spec("jraph") else [])  # (`bench`)
    assert [(r["impl"], r["mode"]) for r in rows] == [
        (i, m) for m in ("forward", "forward+backward") for i in impls
    ]
    for r in rows:
        assert r["gather"] > 0  # (the scatters are named so under XLA's default settings)
        assert r["ms"] == pytest.approx(
            sum(v for k, v in r.items() if k in ("gather", "scatter", "dot", "other"))
        )
    deq, explicit = thunks.generate(context=24, prompt=8, dim=8, heads=2)
    assert deq["ops_per_byte"] > explicit["ops_per_byte"] > 0
    assert deq["steps_warm"] >= 1 and deq["steps_zeros"] >= 1
    assert "graph_attention on cpu (nodes 256, graph delaunay, calls 1):" in capsys.readouterr().out


def test_the_workers_lower_into_one_mlir_context_until_released(monkeypatch):
    """`benchmarks/_one_context.py` (on in the test workers): one MLIR context for every
    lowering, a new one after `release`, and the same program text as JAX's own contexts."""
    import jax
    import jax.numpy as jnp
    from jax._src.interpreters import mlir

    from benchmarks import _one_context

    assert _one_context.use_one() and mlir.make_ir_context is not _one_context._made
    first = mlir.make_ir_context()
    assert mlir.make_ir_context() is first
    _one_context.release()
    assert mlir.make_ir_context() is not first
    x = jnp.ones((3, 4))
    shared = jax.jit(lambda x: jnp.tanh(x) @ x.T).lower(x).as_text()
    monkeypatch.setattr(mlir, "make_ir_context", _one_context._made)  # JAX's own
    assert jax.jit(lambda x: jnp.tanh(x) @ x.T).lower(x).as_text() == shared
