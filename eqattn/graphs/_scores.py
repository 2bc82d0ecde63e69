"""Evaluating a graphs run: every family at sizes up to 64 times the training sizes,
accuracy against the solver's budget, and by distance from the source."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..train import solve_cells

BUCKETS = ((0, 4), (5, 16), (17, 64), (65, 256), (257, 1024), (1025, 4096))
"""Hops from the source, for the accuracy by distance (and the unreachable nodes)."""


def _by_distance(distance: np.ndarray, both: np.ndarray) -> dict[str, list[int]]:
    """`{bucket: [nodes right, nodes]}` over the buckets of `BUCKETS` and "unreachable"."""
    out = {"unreachable": [int(both[distance < 0].sum()), int((distance < 0).sum())]}
    for low, high in BUCKETS:
        inside = (distance >= low) & (distance <= high)
        if inside.any():
            out[f"{low}-{high}"] = [int(both[inside].sum()), int(inside.sum())]
    return out


FAR = {256: 2, 1024: 1}
"""The larger graphs a finished run is scored on by distance (every family at 256 and 1024
nodes): 16 to 64 times the training graphs' size."""


def distance_table(rows: list[dict[str, Any]]) -> dict[str, list[int]]:
    """The by-distance counts summed over every family and size."""
    total: dict[str, list[int]] = {}
    for row in rows:
        for bucket, (right, nodes) in row["by_distance"].items():
            kept = total.setdefault(bucket, [0, 0])
            kept[0] += right
            kept[1] += nodes
    return total


def distance_lines(by_model: dict[str, dict[str, list[int]]]) -> list[str]:
    """Each model's accuracy (a valid parent) by hops from the source, side by side:
    `by_model` maps a model to its `distance_table`."""
    first = next(iter(by_model.values()))
    lines = ["distance      nodes" + "".join(f"{model:>10}" for model in by_model)]
    for bucket, (_, nodes) in first.items():
        cells = "".join(
            f"{table[bucket][0] / max(table[bucket][1], 1):>10.2%}" for table in by_model.values()
        )
        lines.append(f"{bucket:<11} {nodes:>7}{cells}")
    return lines


def summary_lines(result: dict[str, Any]) -> list[str]:
    """The lines of a graphs run's evaluation (what `eqattn evaluate` prints): per family and
    size the shares right, and of nodes the model gave no answer (not resolved: -1)."""
    deq = result["model"] == "deq"
    lines = [
        f"graphs ({result['model']} model, {result['algorithm']}): reachability and a valid "
        "parent, per family and size"
        + (f", at the solver budget rule {result['budget_rule']}" if deq else ""),
        "family        nodes  graphs  max hops  budget  steps  converged  reachable   parent"
        "  no answer",
    ]
    for r in result["sizes"]:
        a = r["at_rule"]
        solve = (
            solve_cells(r["budget_rule"], a["mean_steps"], a["converged"])
            if deq
            else solve_cells(None, None, None)
        )
        lines.append(
            f"{r['family']:<12} {r['n']:>6} {r['graphs']:>7} {r['max_distance']:>9} {solve} "
            f"{a['reach_accuracy']:>10.2%} {a['parent_accuracy']:>8.2%} {a['unresolved']:>10.2%}"
        )
        if "sweep" in r and len(r["sweep"]) > 1:
            cells = [f"{s['max_steps']}: {s['accuracy']:.1%}" for s in r["sweep"]]
            last = r["sweep"][-1]
            done = f" (all converged at {last['max_steps']})" if last["converged"] >= 1.0 else ""
            lines.append("    against the budget: " + ", ".join(cells) + done)
    lines.append("by hops from the source (every family and size): a valid parent")
    return lines + distance_lines({result["model"]: result["by_distance"]})
