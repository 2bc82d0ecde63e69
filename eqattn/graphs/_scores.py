"""Evaluating a graphs run: every family at sizes up to 64 times the training sizes,
accuracy against the solver's budget, and by distance from the source."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._bfs import bfs, valid_parents
from ._data import examples
from ._edges import bucket as edge_bucket
from ._families import FAMILIES, sample
from ._predict import budget_for, solve_batch

SIZES = {16: 32, 64: 16, 256: 8, 1024: 2}
"""Nodes per graph, and how many graphs of each family are scored at that size."""
LARGEST = ("path", "grid")
"""The families scored at 1024 nodes too (a path's far end is 1023 edges from its source)."""
SWEEP = (0.25, 0.5, 1.0, 4.0)
"""The budgets a DEQ is scored at, as multiples of the rule (`graphs.budget_for`), up to 256
nodes (at 1024, the rule alone)."""
BUCKETS = ((0, 4), (5, 16), (17, 64), (65, 256), (257, 1024))
"""Distances from the source, for the accuracy by distance (and the unreachable nodes)."""


def _score(model, adjacency, source, budget) -> tuple[dict[str, Any], np.ndarray]:
    """The shares of nodes with each answer right at `budget`, and per node whether both are
    (graphs above `DENSE_UP_TO` nodes read as edge lists, padded to a power of two of edges)."""
    real = np.ones(adjacency.shape[:2], bool)
    edges = edge_bucket(int(adjacency.sum((1, 2)).max()))
    inputs, (reach, *_) = examples(adjacency, source, real, np.random.default_rng(7), edges)
    solved = solve_batch(model, inputs[0], tuple(inputs[1:]), jnp.asarray(budget))
    got, parent, steps, converged = jax.device_get(solved)
    parents = valid_parents(adjacency, bfs(adjacency, source)[1])
    right_reach = got == reach
    right_parent = np.take_along_axis(parents, parent[..., None], -1)[..., 0]
    both = right_reach & right_parent
    row = dict(
        max_steps=int(budget),
        accuracy=float(both.mean()),
        reach_accuracy=float(right_reach.mean()),
        parent_accuracy=float(right_parent.mean()),
        mean_steps=float(steps.mean()),
        converged=float(converged.mean()),
    )
    return row, both


def _by_distance(distance: np.ndarray, both: np.ndarray) -> dict[str, list[int]]:
    """`{bucket: [nodes right, nodes]}` over the buckets of `BUCKETS` and "unreachable"."""
    out = {"unreachable": [int(both[distance < 0].sum()), int((distance < 0).sum())]}
    for low, high in BUCKETS:
        inside = (distance >= low) & (distance <= high)
        if inside.any():
            out[f"{low}-{high}"] = [int(both[inside].sum()), int(inside.sum())]
    return out


FAR = {256: 2, 1024: 1}
"""The larger graphs a finished run is scored on by distance (every family at 256 nodes, paths
and grids at 1024): 16 to 64 times the training graphs' size."""


def evaluate_bfs(
    model, config, budgets: list[int] | None, tick=None, sizes=SIZES, sweep: bool = True
) -> list[dict[str, Any]]:
    """One row per family and size (`sizes`: nodes and graphs per family): the graphs' largest
    distance, the scores at the budget rule and (a DEQ, up to 256 nodes, with `sweep`) against
    the budget (`budgets`, else `SWEEP` times the rule), stopping at the first budget within
    which every solve converged, and the rule's scores by distance from the source."""
    rows = []
    for n, count in sizes.items():
        for family in FAMILIES:
            if n > 256 and family not in LARGEST:
                continue
            g = sample(family, n, count, seed=1000 + n)
            _, distance = bfs(*g)
            rule = budget_for(n)
            at_rule, both = _score(model, g.adjacency, g.source, rule)
            row = dict(family=family, n=n, graphs=count, max_distance=int(distance.max()))
            row.update(budget_rule=rule, at_rule=at_rule, by_distance=_by_distance(distance, both))
            if sweep and config.model == "deq" and n <= 256:
                row["sweep"] = _sweep(model, g, budgets or [int(f * rule) for f in SWEEP])
            rows.append(row)
            if tick is not None:
                tick()
    return rows


def _sweep(model, g, budgets: list[int]) -> list[dict[str, Any]]:
    rows = []
    for budget in sorted(set(budgets)):
        rows.append(_score(model, g.adjacency, g.source, budget)[0])
        if rows[-1]["converged"] >= 1.0:
            break
    return rows


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
    """Each model's accuracy (both answers right) by distance from the source, side by side:
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
    """The lines of a graphs run's evaluation (what `eqattn evaluate` prints)."""
    deq = result["model"] == "deq"
    algorithm = result.get("algorithm", "bfs")
    what = "reachability, the parent and both right" if algorithm == "bfs" else "a valid parent"
    lines = [
        f"graphs ({result['model']} model, {algorithm}): {what}, per family and size"
        + (f", at the solver budget rule {result['budget_rule']}" if deq else ""),
        "family        nodes  graphs  max dist  budget  steps  converged  reachable  parent     both",
    ]
    deq = result["model"] == "deq"
    for r in result["sizes"]:
        a = r["at_rule"]
        solve = (
            f"{r['budget_rule']:>7} {a['mean_steps']:>6.0f} {a['converged']:>10.1%}"
            if deq
            else f"{'-':>7} {'-':>6} {'-':>10}"
        )
        lines.append(
            f"{r['family']:<12} {r['n']:>6} {r['graphs']:>7} {r['max_distance']:>9} {solve} "
            f"{a['reach_accuracy']:>10.2%} {a['parent_accuracy']:>7.2%} {a['accuracy']:>8.2%}"
        )
        if "sweep" in r and len(r["sweep"]) > 1:
            cells = [f"{s['max_steps']}: {s['accuracy']:.1%}" for s in r["sweep"]]
            last = r["sweep"][-1]
            done = f" (all converged at {last['max_steps']})" if last["converged"] >= 1.0 else ""
            lines.append("    against the budget: " + ", ".join(cells) + done)
    lines.append(
        "by distance from the source (every family and size): both answers right"
        if algorithm == "bfs"
        else "by hops from the source (every family and size): a valid parent"
    )
    return lines + distance_lines({result["model"]: result["by_distance"]})
