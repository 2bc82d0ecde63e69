"""`spanning`: how much a node must carry for a local fixed point to name its spanning-tree
parent (exact arithmetic, numpy; no model), on every weighted family at 64, 1024 and 4096 nodes.

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

`--quick`: 2 graphs of 64 nodes per family.
"""

from __future__ import annotations

import heapq

import numpy as np

from eqattn import graphs

from ._harness import markdown_table

KS = (1, 2, 4, 8, 12)
SIZES = {64: 16, 1024: 4, 4096: 2}


def _records(path: tuple, w: float) -> tuple:
    return (*(x for x in path if x > w), w)


def _sorted(path: tuple, w: float) -> tuple:
    return tuple(sorted((*path, w), reverse=True))


def _ties(g: graphs.WeightedGraphs, b: int, extend) -> tuple[np.ndarray, int, list[int]]:
    """Graph `b` by Dijkstra in the order `extend` makes: per k in `KS`, the nodes whose best
    neighbours tie in their first k entries; the nodes whose best neighbour is not a parent in
    scipy's tree (`graphs.score_parents`; 0 if the order is right); each node's entries."""
    s, r, n = g.edges
    real = r[b] < n
    s, r, w = s[b][real], r[b][real], g.weights[b][real].astype(np.float64)
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
    g1 = graphs.WeightedGraphs(
        graphs.EdgeList(g.edges.senders[b : b + 1], g.edges.receivers[b : b + 1], n),
        g.weights[b : b + 1],
        g.source[b : b + 1],
    )
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
    return rows, {"sizes": sizes, "ks": list(KS)}


def table(payload) -> str:
    """The spanning results file as Markdown (four families): ties per k, entries (mean, max),
    the full lists' misses."""
    rows = [r for r in payload["rows"] if r["part"] == "levels"]
    body = [
        [r["order"], f"{r['family']} @ {r['n']}", *[f"{100 * r['tied'][str(k)]:.2f}%" for k in KS],
         f"{r['entries_mean']:.1f}, {r['entries_max']}", f"{r['wrong_full']}"]
        for r in rows
        if r["family"] in ("erdos-renyi", "geometric", "delaunay", "grid")
    ]  # fmt: skip
    header = ["order", "family @ nodes", *[f"tied at k = {k}" for k in KS]]
    return markdown_table([*header, "entries (mean, max)", "full lists miss"], body)
