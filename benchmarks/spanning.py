"""`spanning`: how much a node must carry for a local fixed point to name its spanning-tree
parent (no model is trained), on every weighted family at 64, 1024 and 4096 nodes.

In the minimum spanning tree rooted at the source, a node's path from the source is the least of
its paths in two orders, each path read as a list of its edges' weights:

- `sorted`: the weights sorted in decreasing order, compared lexicographically;
- `records`: the path's records from its end: each weight heavier than every weight after it
  (the heaviest first), compared lexicographically. Extending a path by an edge of weight w
  drops the records lighter than w and appends w; each record names a level of the nested
  problem: inside the component of the edges lighter than it, the tree from the node where it
  enters.

A fixed point that carries a node's first k entries (each node's best from its neighbours' and
the edge between them) names the parent wherever one neighbour's entries are least. Per order,
family and size: the share of nodes (reachable, not the source) whose best neighbours tie in
their first k entries, the entries' count (mean, max), and the nodes whose full lists do not
name Prim's parent (scipy's tree), which must be none.

Then the library's records layer, the spanning-tree DEQ of the graph task untrained
(`graphs.GraphDEQ` of `graphs.SpanningTree(records=k)`: `nn.GraphRecordsStep` solved by
`nn.ImplicitGraphAttention`, each edge's rank under the tie rule as its weight, float32): per
family (paths and cycles, whose lists are the longest, Erdős–Rényi, grid, random geometric,
Delaunay), size and k, the share of its parents that are right (`graphs.score_parents`), the share it leaves unresolved (a list cut at k ties with a
child's), its steps, and the time of one step against one record's.

`--quick`: 2 graphs of 64 nodes per family, the layer with 1 and 32 records (`QUICK_LAYER_KS`).
"""

from __future__ import annotations

import heapq

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from eqattn import graphs, nn

from ._harness import markdown_table, time_interleaved

KS = (1, 2, 4, 8, 12)
SIZES = {64: 16, 1024: 4, 4096: 2}
LAYER_FAMILIES = ("path", "cycle", "erdos-renyi", "grid", "geometric", "delaunay")
LAYER_KS = (1, 4, 8, 16, 32)
"""The records the layer carries."""
QUICK_LAYER_KS = (1, 32)
"""`--quick`'s: one record (ties left unresolved) and enough for every parent."""


def _records(path: tuple, w: float) -> tuple:
    return (*(x for x in path if x > w), w)


def _sorted(path: tuple, w: float) -> tuple:
    return tuple(sorted((*path, w), reverse=True))


def _ties(g: graphs.WeightedGraphs, b: int, extend) -> tuple[np.ndarray, int, list[int]]:
    """Graph `b` by Dijkstra in the order `extend` makes: per k in `KS`, the nodes whose best
    neighbours tie in their first k entries; the nodes whose best neighbour is not a parent in
    scipy's tree (`graphs.score_parents`; 0 if the order is right); each node's entries."""
    s, r = np.asarray(g.graph.senders[b]), np.asarray(g.graph.receivers[b])
    n = g.graph.num_nodes
    real = r < n
    s, r, w = s[real], r[real], g.weights[b][real].astype(np.float64)
    source = int(g.source[b])
    order = np.argsort(s, kind="stable")
    starts = np.searchsorted(s[order], np.arange(n + 1))
    best: list[tuple | None] = [None] * n
    heap: list[tuple] = [((), source)]
    while heap:
        key, u = heapq.heappop(heap)
        if best[u] is None:
            best[u] = key
            for e in order[starts[u] : starts[u + 1]]:
                if best[r[e]] is None:
                    heapq.heappush(heap, (extend(key, w[e]), int(r[e])))
    ties, lengths, chosen = np.zeros(len(KS), int), [], np.arange(n)
    for i in range(n):
        path = best[i]
        if i == source or path is None:
            continue
        lengths.append(len(path))
        into = r == i
        cand = [(extend(best[j], x), int(j)) for j, x in zip(s[into], w[into])]
        chosen[i] = min(cand)[1]
        for k, key in enumerate(KS):
            first = [c[:key] for c, _ in cand]
            ties[k] += first.count(min(first)) > 1
    g1 = graphs.WeightedGraphs(jax.tree.map(lambda x: x[b : b + 1], g.graph), g.source[b : b + 1])
    wrong = int((~graphs.score_parents(g1, chosen[None], "mst")).sum())
    return ties, wrong, lengths


def run(quick: bool = False) -> tuple[list[dict], dict]:
    sizes = {64: 2} if quick else SIZES
    rows = []
    for n, count in sizes.items():
        for f, family in enumerate(graphs.WEIGHTED_FAMILIES):
            # a seed per family: geometric and Delaunay graphs of the same points share a tree
            g = graphs.sample_weighted(family, n, count, seed=1000 + 10 * n + f)
            for order, extend in (("records", _records), ("sorted", _sorted)):
                ties, wrong, lengths = np.zeros(len(KS), int), 0, []
                for b in range(count):
                    t, w, ln = _ties(g, b, extend)
                    ties, wrong, lengths = ties + t, wrong + w, lengths + ln
                rows.append(
                    dict(
                        part="levels",
                        order=order,
                        family=family,
                        n=n,
                        graphs=count,
                        nodes=len(lengths),
                        tied={str(k): int(t) / len(lengths) for k, t in zip(KS, ties)},
                        wrong_full=int(wrong),
                        entries_mean=float(np.mean(lengths)),
                        entries_max=int(max(lengths)),
                    )
                )
    for r in rows:
        print(
            f"{r['order']:8s} {r['family']:12s} {r['n']:5d}: tied at k = "
            + ", ".join(f"{k}: {100 * r['tied'][str(k)]:.2f}%" for k in KS)
            + f"; entries {r['entries_mean']:.1f} (max {r['entries_max']}); "
            f"full lists miss {r['wrong_full']}"
        )
    layer_ks = QUICK_LAYER_KS if quick else LAYER_KS
    rows += _layer(sizes, layer_ks)
    return rows, {"sizes": sizes, "ks": list(KS), "layer_ks": list(layer_ks)}


def _model(k: int) -> graphs.GraphDEQ:
    """The graph task's spanning-tree DEQ with `k` records, untrained (one weight-map unit)."""
    return graphs.GraphDEQ(1, graphs.SpanningTree(records=k), key=jax.random.key(0))


def _layer(sizes: dict[int, int], ks: tuple[int, ...]) -> list[dict]:
    """The library's records layer (`_model`): per family, size and k, the share of right
    parents and of unresolved ones, the steps (max) and whether every solve converged; per k,
    the time of one step on the largest Delaunay graph, against one record's, round-robin."""
    rows = []
    models = {k: _model(k) for k in ks}
    for n, count in sizes.items():
        for f, family in enumerate(LAYER_FAMILIES):
            g = graphs.sample_weighted(family, n, count, seed=2000 + 10 * n + f)
            for k, model in models.items():
                out = graphs.predict(model, g.graph, g.source, refine=False)  # k records
                right = graphs.score_parents(g, out.parent, "mst")
                rows.append(
                    dict(part="layer", family=family, n=n, k=k, right=float(right.mean()),
                         unresolved=float((out.parent < 0).mean()), steps=int(out.steps.max()),
                         converged=bool(out.converged.all()))
                )  # fmt: skip
                print(f"layer {family:12s} {n:5d} k={k:2d}: {rows[-1]}")
    n = max(sizes)
    g = graphs.sample_weighted("delaunay", n, 1, seed=3000 + n)
    one = jax.tree.map(lambda x: x[0], g.graph)
    graph = eqx.tree_at(lambda x: x.edge_features, one, graphs.ALGORITHMS["mst"].edge_features(one))

    def step(model, state):
        return model.layer.step(state, graph).values

    cases = {
        # every node reached, its list empty
        f"k={k}": (eqx.filter_jit(step), model, nn.GraphState(jnp.zeros((n, k)), jnp.ones(n)))
        for k, model in models.items()
    }
    timed = time_interleaved(cases)
    base = timed["k=1"]["median_s"]
    for case, t in timed.items():
        rows.append(
            dict(part="step", n=n, k=int(case[2:]), ms=1e3 * t["median_s"],
                 ratio=t["median_s"] / base)
        )  # fmt: skip
        print(
            f"step {case} at {n} nodes: {1e3 * t['median_s']:.3f} ms, {t['median_s'] / base:.2f}x"
        )
    return rows


def table(payload) -> str:
    """The spanning results file as Markdown: ties per k, entries (mean, max) and the full
    lists' misses; the records layer's right and unresolved parents per k, its steps, and the
    time of a step."""
    rows = [r for r in payload["rows"] if r["part"] == "levels"]
    body = [
        [r["order"], f"{r['family']} @ {r['n']}", *[f"{100 * r['tied'][str(k)]:.2f}%" for k in KS],
         f"{r['entries_mean']:.1f}, {r['entries_max']}", f"{r['wrong_full']}"]
        for r in rows
    ]  # fmt: skip
    header = ["order", "family @ nodes", *[f"tied at k = {k}" for k in KS]]
    out = markdown_table([*header, "entries (mean, max)", "full lists miss"], body)
    layer = [r for r in payload["rows"] if r["part"] == "layer"]
    keys = list(dict.fromkeys((r["family"], r["n"]) for r in layer))
    ks = list(dict.fromkeys(r["k"] for r in layer))

    def cell(family, n, k):
        r = next(r for r in layer if (r["family"], r["n"], r["k"]) == (family, n, k))
        stopped = "" if r["converged"] else " (not converged)"
        return f"{100 * r['right']:.2f}%, {100 * r['unresolved']:.2f}%{stopped}"

    body = [
        [f"{family} @ {n}", *[cell(family, n, k) for k in ks],
         f"{max(r['steps'] for r in layer if (r['family'], r['n']) == (family, n))}"]
        for family, n in keys
    ]  # fmt: skip
    header = ["records layer (right, unresolved)", *[f"k = {k}" for k in ks], "steps (max)"]
    out += "\n\n" + markdown_table(header, body)
    steps = [r for r in payload["rows"] if r["part"] == "step"]
    body = [[f"k = {r['k']}", f"{r['ms']:.3f}", f"{r['ratio']:.2f}x"] for r in steps]
    n = steps[0]["n"] if steps else 0
    return out + "\n\n" + markdown_table([f"one step at {n} nodes", "ms", "of k = 1"], body)
