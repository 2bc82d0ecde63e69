"""`graphs_engine`: attention over edge lists, and soft shortest paths, against their baselines.

1. `eqattn.graph_attention` forward and forward+backward (a weighted sum of the output and its
   gradient in the queries, keys and values) against the same maths written with jraph
   (`jraph.segment_softmax` then `jraph.segment_sum`, when jraph is installed) and against
   dense masked `eqattn.attention` (while an n x n mask fits: n <= 4096), on Delaunay
   triangulations of random points (mean degree 6) and on graphs where every node hears 16
   random senders; n = 1024, 4096, 16384 and 100,000, d = 64, float32. Every node's query,
   key and value are `[n, d]`; the edges gather the senders' keys and values. Per case, over
   three runs of five rounds each (the cases round-robin, in alternating order): the median
   time, the median of the runs' ratios to eqattn's with their range, and the compiled
   program's temporaries; and `graph_attention`'s own
   forward+backward compiled with its inputs per edge (as its callers give them): its
   temporaries against those inputs' size.
2. `eqattn.soft_shortest_paths` on Delaunay graphs of 10,000 and 100,000 nodes with
   Euclidean weights, at the smallest beta (doubling from 30 sqrt(n)) whose distances are
   within 1e-3 relative of scipy's Dijkstra, solved within 4x the edges of the longest
   shortest path: the forward's and the gradient's time (the sum of
   the distances in the weights), scipy's `dijkstra` from the same source (the exact
   algorithm's floor), and the solver's steps with Picard and with Anderson (none: not
   converged within 10x the longest shortest path's edges).

`--quick`: n = 256 and 1024, shortest paths on 500 nodes, one run of 2 rounds.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra
from scipy.spatial import Delaunay

import eqattn

from ._harness import External, markdown_table, print_table, time_interleaved

D = 64
DENSE_UP_TO = 4096
MB = 2**20


def delaunay(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The Delaunay triangulation of `n` uniform points in the unit square: its edges both ways
    `(senders, receivers)` and the points."""
    points = np.random.default_rng(seed).random((n, 2))
    triangles = Delaunay(points).simplices
    pairs = np.concatenate([triangles[:, [0, 1]], triangles[:, [1, 2]], triangles[:, [0, 2]]])
    pairs = np.unique(np.sort(pairs, axis=1), axis=0)
    senders = np.concatenate([pairs[:, 0], pairs[:, 1]]).astype(np.int32)
    receivers = np.concatenate([pairs[:, 1], pairs[:, 0]]).astype(np.int32)
    return senders, receivers, points


def in_degree(n: int, degree: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Every node hears `degree` senders drawn at random."""
    rng = np.random.default_rng(seed)
    receivers = np.repeat(np.arange(n, dtype=np.int32), degree)
    return rng.integers(0, n, n * degree).astype(np.int32), receivers


def _ours(q, k, v, senders, receivers):
    return eqattn.graph_attention(q, k[senders], v[senders], receivers)


def _jraph(q, k, v, senders, receivers):
    import jraph

    n = q.shape[0]
    logits = jnp.sum(q[receivers] * k[senders], axis=-1)
    weights = jraph.segment_softmax(logits, receivers, n)
    return jraph.segment_sum(weights[:, None] * v[senders], receivers, n)


def _dense(q, k, v, mask):
    return eqattn.attention(q, k, v, mask=mask)


def _with_grad(fn):
    """`fn`'s forward+backward: a fixed weighted sum of its output and its gradient, as a
    training step computes them. (The gradient alone of a sum linear in the output lets
    autodiff skip computing the output, which no caller does: jraph's program then left out its
    segment sum of the values, and eqattn's backward reads the output.)"""

    def run(q, k, v, *rest):
        weights = jnp.cos(jnp.arange(q.shape[0] * v.shape[1], dtype=q.dtype)).reshape(
            -1, v.shape[1]
        )
        loss = lambda q, k, v: jnp.sum(fn(q, k, v, *rest) * weights)  # noqa: E731
        return jax.value_and_grad(loss, (0, 1, 2))(q, k, v)

    return run


def _attention_rows(graph: str, n: int, senders, receivers, repeats: int, runs: int) -> list[dict]:
    """Each case's median time over `runs` runs of `repeats` rounds (round-robin, see
    `time_interleaved`), and its ratio to eqattn's: the median over the runs of each run's
    ratio, with every run's kept (`ms_runs`, `of_eqattn_runs`)."""
    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.standard_normal((n, D)), jnp.float32) for _ in range(3))
    edges = (jnp.asarray(senders), jnp.asarray(receivers))
    cases = {("eqattn", "forward"): (_ours, q, k, v, *edges)}
    try:
        import jraph  # noqa: F401

        cases[("jraph", "forward")] = (_jraph, q, k, v, *edges)
    except ImportError:
        pass
    if n <= DENSE_UP_TO:
        mask = jnp.zeros((n, n), bool).at[edges[1], edges[0]].set(True)
        cases[("dense", "forward")] = (_dense, q, k, v, mask)
    for (impl, _), (fn, *args) in list(cases.items()):
        cases[(impl, "forward+backward")] = (_with_grad(fn), *args)
    named = {f"{i} {m}": c for (i, m), c in cases.items()}
    runs = [time_interleaved(named, repeats=repeats) for _ in range(runs)]
    inputs = 3 * n * D * 4 + 2 * len(senders) * 4
    rows = [_memory_row(graph, n, len(senders))]
    for impl, mode in cases:
        ms = [1e3 * t[f"{impl} {mode}"]["median_s"] for t in runs]
        ratios = [t[f"{impl} {mode}"]["median_s"] / t[f"eqattn {mode}"]["median_s"] for t in runs]
        temp = runs[0][f"{impl} {mode}"]["temp_bytes"]
        rows.append(
            dict(
                part="attention",
                graph=graph,
                n=n,
                edges=len(senders),
                impl=impl,
                mode=mode,
                ms=statistics.median(ms),
                ms_runs=ms,
                of_eqattn=statistics.median(ratios),
                of_eqattn_runs=ratios,
                temp_mb=None if temp is None else temp / MB,
                inputs_mb=inputs / MB,
            )
        )
    jax.clear_caches()
    return rows


def _memory_row(graph: str, n: int, edges: int) -> dict:
    """The compiled forward+backward of `graph_attention` itself (its inputs per edge, as its
    callers give them): temporaries against the inputs' size."""
    shapes = (
        jax.ShapeDtypeStruct((n, D), jnp.float32),
        jax.ShapeDtypeStruct((edges, D), jnp.float32),
        jax.ShapeDtypeStruct((edges, D), jnp.float32),
        jax.ShapeDtypeStruct((edges,), jnp.int32),
    )
    loss = lambda q, k, v, r: jnp.sum(eqattn.graph_attention(q, k, v, r))  # noqa: E731
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*shapes).compile()
    inputs = sum(int(np.prod(s.shape)) * s.dtype.itemsize for s in shapes)
    temp = compiled.memory_analysis().temp_size_in_bytes
    return dict(
        part="memory", graph=graph, n=n, edges=edges, temp_mb=temp / MB, inputs_mb=inputs / MB,
        of_inputs=temp / inputs,
    )  # fmt: skip


def _solve(senders, receivers, weights, n, beta, solver=None):
    graph = eqattn.Graph(senders, receivers, num_nodes=n)
    return eqattn.soft_shortest_paths(graph, weights, 0, beta=beta, solver=solver)


def _hops(predecessors: np.ndarray, exact: np.ndarray) -> int:
    """The most edges on a shortest path of Dijkstra's tree."""
    hops = np.zeros(len(exact), np.int64)
    for i in np.argsort(exact)[1:]:
        if predecessors[i] >= 0:
            hops[i] = hops[predecessors[i]] + 1
    return int(hops.max())


def _beta_within(senders, receivers, weights, n, exact, hops, tol=1e-3) -> tuple[float, float]:
    """The smallest beta, doubling from 30 sqrt(n), whose distances are within `tol` relative
    of `exact` (away from the source), and that error. A beta whose solve takes over 4x the
    shortest paths' edges is passed over (a near-zero weight's cycle makes the walk sum
    converge slowly while it is not small against 1/beta, and longer walks then count)."""
    beta = 30.0 * np.sqrt(n)
    far = np.isfinite(exact) & (exact > 0)
    solver = eqattn.Picard(rtol=1e-6, atol=1e-6, max_steps=4 * hops + 16)
    while True:
        eq = _solve(senders, receivers, weights, n, beta, solver)
        d = np.asarray(eq.value)
        error = float(np.max(np.abs(d[far] - exact[far]) / exact[far]))
        if (bool(eq.converged) and error <= tol) or beta > 1e9:
            return beta, error
        beta *= 2


def _shortest_rows(n: int, repeats: int) -> list[dict]:
    senders, receivers, points = delaunay(n)
    weights = np.linalg.norm(points[senders] - points[receivers], axis=-1).astype(np.float32)
    graph = csr_matrix((weights.astype(np.float64), (senders, receivers)), shape=(n, n))
    exact, predecessors = dijkstra(graph, indices=0, return_predecessors=True)
    hops = _hops(predecessors, exact)
    beta, error = _beta_within(senders, receivers, weights, n, exact, hops)
    s, r, w = (jnp.asarray(a) for a in (senders, receivers, weights))
    forward = lambda w: _solve(s, r, w, n, beta).value  # noqa: E731
    gradient = jax.grad(lambda w: jnp.sum(forward(w)))
    cases = {
        "forward": (forward, w),
        "gradient": (gradient, w),
        "scipy dijkstra": (External(lambda: dijkstra(graph, indices=0)),),
    }
    timings = time_interleaved(cases, repeats=repeats)
    steps = {}
    for name, solver in (
        ("picard", eqattn.Picard(rtol=1e-6, atol=1e-6, max_steps=10 * hops + 16)),
        ("anderson", eqattn.Anderson(rtol=1e-6, atol=1e-6, max_steps=10 * hops + 16)),
    ):
        eq = _solve(s, r, w, n, beta, solver)
        steps[name] = int(eq.steps) if bool(eq.converged) else None
    floor = timings["scipy dijkstra"]["median_s"]
    return [
        dict(
            part="shortest",
            n=n,
            edges=len(senders),
            beta=beta,
            hops=hops,
            relative_error=error,
            case=name,
            ms=1e3 * t["median_s"],
            of_dijkstra=t["median_s"] / floor,
            picard_steps=steps["picard"],
            anderson_steps=steps["anderson"],
        )
        for name, t in timings.items()
    ]


RUNS = 3
"""Timing runs per graph (the verdicts quote the median and the range)."""


def run(quick: bool = False) -> tuple[list[dict], dict]:
    repeats, runs = (2, 1) if quick else (5, RUNS)
    rows = []
    for n in (256, 1024) if quick else (1024, 4096, 16384, 100_000):
        rows += _attention_rows("delaunay", n, *delaunay(n)[:2], repeats, runs)
        rows += _attention_rows("degree 16", n, *in_degree(n, 16), repeats, runs)
    for n in (500,) if quick else (10_000, 100_000):
        t0 = time.perf_counter()
        rows += _shortest_rows(n, repeats)
        print(f"shortest paths at {n} nodes: {time.perf_counter() - t0:.0f} s")
    _print(rows)
    return rows, {"d": D, "dtype": "float32", "dense_up_to": DENSE_UP_TO}


def _print(rows) -> None:
    print_table(
        [r for r in rows if r["part"] == "memory"],
        [
            ("graph", "graph", "s"),
            ("n", "n", "d"),
            ("edges", "edges", "d"),
            ("temp_mb", "fwd+bwd temp MB", ".1f"),
            ("inputs_mb", "inputs MB", ".1f"),
            ("of_inputs", "x inputs", ".2f"),
        ],
    )
    print()
    print_table(
        [dict(r, range=_ratio_cell(r)) for r in rows if r["part"] == "attention"],
        [
            ("graph", "graph", "s"),
            ("n", "n", "d"),
            ("impl", "impl", "s"),
            ("mode", "mode", "s"),
            ("ms", "ms", ".3g"),
            ("range", "x eqattn (runs' range)", "s"),
            ("temp_mb", "temp MB", ".1f"),
            ("inputs_mb", "inputs MB", ".1f"),
        ],
    )
    print()
    print_table(
        [r for r in rows if r["part"] == "shortest"],
        [
            ("n", "n", "d"),
            ("beta", "beta", ".4g"),
            ("hops", "hops", "d"),
            ("relative_error", "rel. error", ".1e"),
            ("case", "case", "s"),
            ("ms", "ms", ".4g"),
            ("of_dijkstra", "x dijkstra", ".1f"),
            ("picard_steps", "Picard steps", "d"),
            ("anderson_steps", "Anderson steps", "d"),
        ],
    )


def _ratio_cell(row) -> str:
    """The median ratio to eqattn's, with the range over the runs where there were several
    (results before the runs were kept have one)."""
    runs = row.get("of_eqattn_runs", [row["of_eqattn"]])
    if len(runs) == 1 or row["impl"] == "eqattn":
        return f"{row['of_eqattn']:.2f}"
    return f"{row['of_eqattn']:.2f} ({min(runs):.2f}-{max(runs):.2f})"


def table(payload) -> str:
    """The graphs_engine results file as Markdown: each case's time and its ratio to eqattn's
    (attention), to scipy's Dijkstra (shortest paths)."""
    attention = [r for r in payload["rows"] if r["part"] == "attention"]
    shortest = [r for r in payload["rows"] if r["part"] == "shortest"]
    first = markdown_table(
        ["graph", "n", "edges", "implementation", "mode", "ms", "x eqattn (runs' range)",
         "temp MB", "inputs MB"],
        [
            [
                r["graph"], r["n"], r["edges"], r["impl"], r["mode"], f"{r['ms']:.3g}",
                _ratio_cell(r), "" if r["temp_mb"] is None else f"{r['temp_mb']:.1f}",
                f"{r['inputs_mb']:.1f}",
            ]
            for r in attention
        ],
    )  # fmt: skip
    second = markdown_table(
        ["n", "edges", "beta", "hops", "rel. error", "case", "ms", "x dijkstra", "steps (Picard, Anderson)"],
        [
            [
                r["n"], r["edges"], f"{r['beta']:.4g}", r["hops"], f"{r['relative_error']:.1e}", r["case"],
                f"{r['ms']:.4g}", f"{r['of_dijkstra']:.1f}",
                f"{r['picard_steps']}, {r['anderson_steps']}",
            ]
            for r in shortest
        ],
    )  # fmt: skip
    memory = markdown_table(
        ["graph", "n", "edges", "graph_attention fwd+bwd temp MB", "inputs MB", "x inputs"],
        [
            [r["graph"], r["n"], r["edges"], f"{r['temp_mb']:.1f}", f"{r['inputs_mb']:.1f}",
             f"{r['of_inputs']:.2f}"]
            for r in payload["rows"] if r["part"] == "memory"
        ],
    )  # fmt: skip
    return memory + "\n\n" + first + "\n\n" + second
