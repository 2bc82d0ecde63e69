"""What each benchmark suite's `--quick` results must hold (`tests/test_benchmarks.py` runs the
suites): rows every case has, and checks of the figures that do not depend on timing."""

import importlib

import numpy as np


def _check_core(core):
    assert core["bandwidth_gbps"] > 0
    by = {(r["n"], r["mode"], r["impl"]): r for r in core["rows"]}
    for (n, mode, impl), r in by.items():
        assert r["gbps"] > 0 and r["frac_bandwidth"] > 0, r
        # the n x m weights' traffic: a fused (chunked) pass moves less than the dense ones
        for fused in ("eqattn-chunked", "eqattn-pallas"):
            assert by[(n, mode, fused)]["bytes"] < by[(n, mode, "xla")]["bytes"]


def _check_kernel(kernel):
    assert all(r["rel_error"] < 1e-5 for r in kernel["rows"])  # interpreted, float32, vs XLA


def _check_deq(deq):
    # every exact method agrees with the baseline's gradient: forward and backward are solved to
    # rtol 1e-4 (the baseline's backward to 1e-5), so to about rtol / (1 - contraction)
    assert {r["problem"] for r in deq["rows"]} == {"P1", "P2"}
    for row in deq["rows"]:
        assert not row.get("error"), row
        if "JacobianFree" not in row["method"]:
            assert row["grad_norm_rel_diff"] < 5e-3, row


def _check_training(training):
    assert [r["case"] for r in training["rows"]][0] == "explicit (baseline)"
    assert all(0 <= r["accuracy_mean"] <= 1 and r["step_ms"] > 0 for r in training["rows"])


def _check_memory(memory):
    implicit = [r["temp_mb"] for r in memory["rows"] if r.get("case") == "implicit"]
    unrolled = [r["temp_mb"] for r in memory["rows"] if r.get("case") == "unrolled"]
    assert implicit[0] == implicit[-1] and unrolled[-1] > unrolled[0]  # flat vs growing


def _check_scaling(scaling):
    assert [r["devices"] for r in scaling["rows"] if r["part"] == "devices"] == [1, 2]


def _check_causal(payload):
    # every case computes the baseline's gradients (float32 on a CPU)
    errors = {r["case"]: r["rel_error"] for r in payload["rows"] if r.get("rel_error") is not None}
    assert errors and max(errors.values()) < 1e-4, errors


def _check_text(payload):
    part = lambda name: [r for r in payload["rows"] if r["part"] == name]  # noqa: E731
    explicit, deq = part("paired")
    assert (explicit["model"], deq["model"]) == ("explicit", "deq")
    assert abs(deq["params"] / explicit["params"] - 1) <= 0.05  # equal size, within 5%
    assert all(0 < bpb < 9 for r in (explicit, deq) for bpb in r["test_bits_per_byte"])
    # learning curves: one validation figure per epoch (1 in --quick), the DEQ's convergence
    assert all(len(r["validation_bpb_by_epoch"]) == 1 for r in (explicit, deq))
    assert all(0 < r["validation_bpb_by_epoch"][0] < 9 for r in (explicit, deq))
    assert "train_converged_by_epoch" not in explicit
    assert 0 <= deq["train_converged_by_epoch"][0] <= 1
    temps = [r["temp_mb"] for r in part("solver")]
    assert temps[0] == temps[-1]  # the implicit backward's memory does not grow with the steps
    modes = {(r["model"], r["mode"]) for r in part("generation")}
    assert modes == {
        ("deq", "cached"),
        ("deq", "re-solve cold"),
        ("deq", "re-solve warm"),
        ("explicit", "cached"),
        ("explicit", "re-run"),
        ("deq", "generate()"),
        ("explicit", "generate()"),
        ("deq", "generate() batch 64"),
        ("explicit", "generate() batch 64"),
    }
    # text.generate end to end: a marginal time per byte (sign not checked: --quick generates
    # 2 and 7 bytes twice each, within the noise)
    assert all(np.isfinite(r["ms_per_token"]) for r in part("generation"))
    # each row names the model it is of: its context and parameters (the paired runs' counts)
    size = {r["model"]: r["params"] for r in (explicit, deq)}
    assert all(r["context"] == 16 and r["params"] == size[r["model"]] for r in part("generation"))
    assert all(r["ms_runs"] == [r["ms_per_token"]] for r in part("generation"))  # one run
    # the GPU command's `--short` run has no training runs: its report starts at the step table
    from benchmarks.text import table

    short = table({**payload, "rows": [r for r in payload["rows"] if r["part"] != "paired"]})
    assert short.startswith("| context | model |") and "Target" not in short


def _check_text_frontier(payload):
    rows = payload["rows"]
    anchors = {r["compressor"]: r["bits_per_byte"] for r in rows if r["part"] == "anchor"}
    assert set(anchors) == {"gzip -9", "bz2 -9", "xz -9e"} and all(
        0 < b < 8 for b in anchors.values()
    )
    frontier = [r for r in rows if r["part"] == "frontier"]
    assert [r.get("depth") for r in frontier] == [None, 1]
    assert [r["shape"]["depth"] for r in frontier[1:]] == [1]
    # the explicit models are sized to the DEQ's parameters
    assert all(
        abs(r["params"] - frontier[0]["params"]) <= 0.05 * frontier[0]["params"] for r in frontier
    )
    sweep = [r for r in rows if r["part"] == "test-time"]
    assert [r["budget"] for r in sweep] == [2, 4]
    kept = [r for r in rows if r["part"] == "kept"]
    assert [r["model"] for r in kept] == ["deq", "explicit"] and all(
        r["sample"].startswith("def ") for r in kept
    )


def _check_graphs(payload):
    """BFS's DEQ answers right on every graph of the quick run's sizes; the explicit model does
    not beyond its depth; the shortest paths' DEQ, after its 40 steps (seed 2), gets at least 90% of
    the parents on each of the quick families at 64 nodes, and on the graphs of networkx's
    generators and its real graph; every DEQ has its controls (untrained, exact parameters, tied), the
    weighted one its table by weight distribution; the dynamics rows are there."""
    runs = {r["case"]: r for r in payload["rows"] if r["part"] == "run"}
    assert set(runs) == {"deq bfs", "explicit bfs", "deq shortest-paths"}
    paths = runs["deq shortest-paths"]["accuracy"]
    assert set(paths) >= {"geometric@64", "delaunay@64"} and min(paths.values()) >= 0.9
    deq, explicit = runs["deq bfs"], runs["explicit bfs"]
    assert min(deq["accuracy"].values()) == 1.0
    assert abs(explicit["params"] - deq["params"]) <= 0.05 * deq["params"]
    far = explicit["by_distance"]["17-64"]
    assert far[0] < far[1]
    controls = {r["case"] for r in payload["rows"] if r["part"] == "control"}
    assert controls == {
        f"{c} {a}" for c in ("untrained", "exact parameters", "tied x16")
        for a in ("bfs", "shortest-paths")
    }  # fmt: skip
    exact = [r for r in payload["rows"] if r["case"].startswith("exact parameters")]
    assert all(min(r["accuracy"].values()) == 1.0 for r in exact)  # the algorithm, hand-set
    weights = [r for r in payload["rows"] if r["part"] == "weights"]
    assert {r["case"] for r in weights} == {"deq shortest-paths"} and len(weights) == 4
    dynamics = [r for r in payload["rows"] if r["part"] == "dynamics"]
    assert {(r["family"], r["n"]) for r in dynamics} == {("path", 64)}
    assert all(s >= d for r in dynamics for s, d in zip(r["steps"], r["depth"]))
    generated = [r for r in payload["rows"] if r["part"] == "generators"]
    assert {r["case"] for r in generated} == set(runs)
    assert {r["family"] for r in generated} >= {"Barabasi-Albert", "karate club (own weights)"}
    assert all(r["accuracy"] >= 0.9 for r in generated if r["case"].startswith("deq"))
    from benchmarks.graphs import table

    assert table(payload).startswith("| family @ nodes |")
    assert "| not generated by eqattn @ nodes | deq shortest-paths |" in table(payload)
    assert "| DEQ (seed 2) | weights | nodes |" in table(payload)  # `QUICK_RUNS`' seed


def _check_spanning(payload):
    """Both orders on every family; the full lists name scipy's parents everywhere; a longer
    prefix never ties more nodes; the library's records layer names every parent with enough
    records, leaves the rest unresolved (never a wrong parent), and converges."""
    levels = [r for r in payload["rows"] if r["part"] == "levels"]
    assert {r["order"] for r in levels} == {"records", "sorted"}
    assert len({r["family"] for r in levels}) == 8
    assert all(r["wrong_full"] == 0 for r in levels)
    assert all(list(r["tied"].values()) == sorted(r["tied"].values(), reverse=True) for r in levels)
    layer = [r for r in payload["rows"] if r["part"] == "layer"]
    assert all(r["converged"] for r in layer)
    assert all(r["right"] == 1.0 for r in layer if r["k"] == 32)  # against scipy's parents
    assert min(r["right"] for r in layer if r["k"] == 1) < 0.9
    assert all(abs(r["right"] + r["unresolved"] - 1) < 1e-9 for r in layer)  # never wrong
    steps = [r for r in payload["rows"] if r["part"] == "step"]
    assert {r["k"] for r in steps} == {1, 32}  # `--quick`'s (`QUICK_LAYER_KS`)
    from benchmarks.spanning import table

    assert table(payload).startswith("| order | family @ nodes | tied at k = 1 |")
    assert "| records layer (right, unresolved) | k = 1 |" in table(payload)


def _check_graphs_engine(payload):
    """graph_attention's compiled forward+backward holds at most 1.5x its inputs; the dense
    baseline and eqattn's rows are there; the soft distances are within 1e-3 of Dijkstra's."""
    rows = payload["rows"]
    memory = [r for r in rows if r["part"] == "memory"]
    assert memory and all(r["of_inputs"] <= 1.5 for r in memory)
    attention = [r for r in rows if r["part"] == "attention"]
    impls = {(r["impl"], r["mode"]) for r in attention}
    assert {("eqattn", "forward"), ("dense", "forward+backward")} <= impls
    # each ratio is the median of its runs' (one run in --quick)
    assert all(r["of_eqattn"] == np.median(r["of_eqattn_runs"]) for r in attention)
    shortest = [r for r in rows if r["part"] == "shortest"]
    assert {r["case"] for r in shortest} == {"forward", "gradient", "scipy dijkstra"}
    assert all(r["relative_error"] <= 1e-3 and r["picard_steps"] for r in shortest)
    from benchmarks.graphs_engine import table

    assert table(payload).startswith("| graph | n | edges | graph_attention fwd+bwd")


def _check_reasoning_rows(payload, suite: str, part: str, tied: str, sizes: list[int]):
    """Every control at every size; the twin has the DEQ's parameters; the DEQ's overthinking
    control ran its 4x budget; path independence and the budget sweep are there."""
    parts = importlib.import_module(f"benchmarks.{suite}").PARTS
    rows, unit = payload["rows"], parts.unit
    runs = {r["case"]: r for r in rows if r["part"] == "run"}
    assert set(runs) == {"deq", "explicit twin"}
    assert (
        abs(runs["explicit twin"]["params"] - runs["deq"]["params"]) <= 0.05 * runs["deq"]["params"]
    )
    scored = [r for r in rows if r["part"] == "size"]
    assert {r["case"] for r in scored} == {
        "deq", "untrained", tied, "4x budget, no stop", "explicit twin"
    }  # fmt: skip
    assert sorted({r["n"] for r in scored}) == sizes
    assert all(0 <= r[unit] <= r[part] <= 1 for r in scored)
    unstopped = next(r for r in scored if r["case"] == "4x budget, no stop")
    assert unstopped["steps"] == 4 * parts.task.budget_for(unstopped["n"])
    paths = [r for r in rows if r["part"] == "paths"]
    settings = payload["settings"]
    assert paths and all(0 <= r["agree"] <= 1 for r in paths)
    assert all(r["count"] == settings.get("paths_count", settings["count"]) for r in paths)
    assert [r["budget"] for r in rows if r["part"] == "budget"] == [4, 16]
    # what `--seeds` compares before it adds a run to this file (benchmarks._seeds)
    assert payload["settings"] == importlib.import_module(f"benchmarks.{suite}").settings(True)


def _check_reasoning(payload):
    _check_reasoning_rows(payload, "reasoning", "bits", "tied x8", [12])
    from benchmarks.reasoning import table

    assert table(payload).startswith("| prefix sums: strings right | 12 bits |")


def _check_reasoning_mazes(payload):
    _check_reasoning_rows(payload, "reasoning_mazes", "cells", "tied x6", [4])
    from benchmarks.reasoning_mazes import table

    assert table(payload).startswith("| mazes: mazes right | 4 x 4 |")


CHECKS = {
    "reasoning": _check_reasoning,
    "reasoning_mazes": _check_reasoning_mazes,
    "graphs": _check_graphs,
    "graphs_engine": _check_graphs_engine,
    "spanning": _check_spanning,
    "core": _check_core,
    "causal": _check_causal,
    "kernel": _check_kernel,
    "deq": _check_deq,
    "training": _check_training,
    "memory": _check_memory,
    "scaling": _check_scaling,
    "text": _check_text,
    "text_frontier": _check_text_frontier,
}
