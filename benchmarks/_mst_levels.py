"""How much a node must carry for a local fixed point to name its spanning-tree parent (exact
arithmetic, numpy; no model).

In the minimum spanning tree rooted at the source, a node's path from the source is the least of
its paths in two orders, each path read as a list of its edges' weights:

- `sorted`: the weights sorted in decreasing order, compared lexicographically;
- `records`: the path's records from its end: each weight heavier than every weight after it
  (the heaviest first), compared lexicographically. Extending a path by an edge of weight w
  drops the records lighter than w and appends w; each record names a level of the nested
  problem: inside the component of the edges lighter than it, the tree from the node where it
  enters.

A fixed point that carries a node's first k entries (each node's best from its neighbours' and
the edge between them) names the parent wherever one neighbour's entries are least; this part
counts the nodes where two or more neighbours tie in their first k, and checks that the full
lists name Prim's parent (scipy's tree) everywhere."""

from __future__ import annotations

from collections import deque

import numpy as np

from eqattn import graphs
from eqattn.graphs._weighted import mst_parents

from ._harness import markdown_table

KS = (1, 2, 4, 8, 12)
SIZES = {64: 16, 1024: 4, 4096: 2}


def _records(path: tuple, w: float) -> tuple:
    return (*(x for x in path if x > w), w)


def _sorted(path: tuple, w: float) -> tuple:
    return tuple(sorted((*path, w), reverse=True))


def _ties(g: graphs.WeightedGraphs, b: int, extend) -> tuple[np.ndarray, int, list[int]]:
    """Per k in `KS`, the nodes whose best neighbours tie in their first k entries; the nodes
    whose full lists do not name Prim's parent (0 if the order is right); each node's entries."""
    s, r, n = g.edges
    real = r[b] < n
    s, r, w = s[b][real], r[b][real], g.weights[b][real].astype(np.float64)
    source, parent = int(g.source[b]), mst_parents(g)[b]
    weight = dict(zip(zip(s.tolist(), r.tolist()), w.tolist()))
    paths: list[tuple | None] = [None] * n
    paths[source] = ()
    queue = deque([source])
    children = [np.flatnonzero((parent == u) & (np.arange(n) != u)) for u in range(n)]
    while queue:
        u = queue.popleft()
        for c in children[u]:
            paths[c] = extend(paths[u], weight[(u, int(c))])
            queue.append(int(c))
    ties, wrong, lengths = np.zeros(len(KS), int), 0, []
    for i in range(n):
        path = paths[i]
        if i == source or path is None:
            continue
        lengths.append(len(path))
        cand = [
            (extend(paths[j], x), j) for j, x in zip(s[r == i], w[r == i]) if paths[j] is not None
        ]
        wrong += min(cand)[1] != parent[i]
        for k, key in enumerate(KS):
            first = [c[:key] for c, _ in cand]
            ties[k] += first.count(min(first)) > 1
    return ties, wrong, lengths


def levels(sizes: dict[int, int] | None = None) -> list[dict]:
    """Per order, family and size: the share of non-source reachable nodes whose best
    neighbours tie at each k in `KS`, and the entries' count (the records' depth)."""
    rows = []
    for n, count in (sizes or SIZES).items():
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
                        part="mst_levels",
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
    return rows


def levels_table(rows: list[dict]) -> str:
    """The `mst_levels` rows as Markdown: ties per k, entries (mean, max), full lists' misses."""
    rows = [r for r in rows if r["part"] == "mst_levels"]
    if not rows:
        return ""
    body = [
        [r["order"], f"{r['family']} @ {r['n']}", *[f"{100 * r['tied'][str(k)]:.2f}%" for k in KS],
         f"{r['entries_mean']:.1f}, {r['entries_max']}", f"{r['wrong_full']}"]
        for r in rows
        if r["family"] in ("erdos-renyi", "geometric", "delaunay", "grid")
    ]  # fmt: skip
    header = ["order", "family @ nodes", *[f"tied at k = {k}" for k in KS]]
    return markdown_table([*header, "entries (mean, max)", "full lists miss"], body)
