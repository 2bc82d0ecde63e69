"""`deq`: DEQ attention problems, every solver x adjoint, against plain jaxopt.

P1, the reference problem (`shared/problems/P1.md`):

    f(z; x) = LN(z + softmax(z Wq (z Wk)^T / sqrt(D)) z Wv + x)   (layer norm over D, no affine)
    B, N, D = 16, 64, 64, float32; W ~ N(0, (0.6/sqrt(D))^2) drawn from numpy's default_rng(0) in
    the order Wq, Wk, Wv, then x; z0 = 0; stop at |f(z) - z| / |f(z)| <= 1e-4 (whole batch, 2-norm)
    or 60 steps; loss = sum(z* * C), C from default_rng(1).

P2, GPU-sized (run on accelerators; `--quick` runs a tiny version everywhere, with the baseline
and eqattn's Anderson + implicit only: P1 runs every method):

    f(z; x) = LN(z + MHA(z) Wo + x), MHA with 8 heads of D/8 features (beta = (D/8)^-1/2)
    B, N, D = 64, 512, 256; float32 (stop at 1e-4) and bfloat16 (stop at 1e-2, about what bf16
    can resolve); Wq, Wk, Wv, Wo, x and C drawn as in P1.

The baselines are written by hand with jaxopt (AndersonAcceleration and FixedPointIteration,
implicit_diff=True, their default backward solve). jaxopt's stop test is absolute,
|f(z) - z| <= tol, so tol = rtol * |z| with |z| = sqrt(B N D), the norm of a layer-normalized z.
The same two jaxopt solvers also run through eqattn (`eqattn.JaxoptSolver`, differentiated by
jaxopt; eqattn measures the residual at the answer, one more evaluation of f), and Optimistix's
`FixedPointIteration` (RMS norm of the changes relative to atol + rtol |z|, both P1's rtol) through `eqattn.fixed_point` with eqattn's implicit
adjoint. eqattn's default adjoint solves the backward to the forward's tolerance. With torch and
torchdeq installed, torchdeq's Anderson and fixed-point solvers (ift=True) run
the same problems too (`benchmarks/_torchdeq.py`; on the GPU when torch has CUDA). The floor
is 15 evaluations of f in a jitted, unrolled loop: the least an Anderson forward pass does on
P1. eqattn's solvers also run with `check_every=4` (four guarded steps per trip of the loop:
fewer round trips to the host on accelerators). All cases of a problem are timed round-robin
(one call of each per round) so that ratios compare calls made at the same moments. Gradient
norm: the sum of the norms of dloss/dW. A case that fails (e.g. jaxopt's Anderson, whose small
solve has no bfloat16 kernel) is reported with its error.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np

import eqattn

from . import _torchdeq
from ._harness import markdown_table, print_table, time_interleaved

MAX_STEPS, FLOOR_STEPS = 60, 15


@dataclasses.dataclass(frozen=True)
class Problem:
    name: str
    B: int
    N: int
    D: int
    heads: int  # 0: P1's single attention without an output projection
    dtype: str
    rtol: float

    def arrays(self):
        rng = np.random.default_rng(0)
        s = 0.6 / math.sqrt(self.D)
        count = 3 if self.heads == 0 else 4
        dtype = jnp.dtype(self.dtype)
        weights = tuple(
            jnp.asarray((rng.normal(size=(self.D, self.D)) * s).astype(np.float32), dtype)
            for _ in range(count)
        )
        x = rng.normal(size=(self.B, self.N, self.D)).astype(np.float32)
        c = np.random.default_rng(1).normal(size=(self.B, self.N, self.D)).astype(np.float32)
        return weights, jnp.asarray(x, dtype), jnp.asarray(c, dtype)

    def f(self, z, weights, x):
        if self.heads == 0:
            wq, wk, wv = weights
            attn = eqattn.attention(z @ wq, z @ wk, z @ wv, beta=1 / math.sqrt(self.D))
            return eqattn.renormalize(z + attn + x)
        wq, wk, wv, wo = weights
        q, k, v = (eqattn.split_heads(z @ w, self.heads) for w in (wq, wk, wv))
        attn = eqattn.attention(q, k, v, beta=1 / math.sqrt(self.D // self.heads))
        return eqattn.renormalize(z + eqattn.merge_heads(attn) @ wo + x)


P1 = Problem("P1", 16, 64, 64, 0, "float32", 1e-4)


def problems(quick: bool) -> list[Problem]:
    if quick:
        return [dataclasses.replace(P1, B=2), Problem("P2", 2, 16, 32, 4, "float32", 1e-4)]
    out = [P1]
    if jax.default_backend() != "cpu":
        out += [
            Problem("P2", 64, 512, 256, 8, "float32", 1e-4),
            Problem("P2", 64, 512, 256, 8, "bfloat16", 1e-2),
        ]
    return out


def _ours(p: Problem, solver, adjoint):
    def solve(weights, x):
        return eqattn.fixed_point(
            lambda z, a: p.f(z, *a),
            jnp.zeros_like(x),
            (weights, x),
            solver=solver,
            adjoint=adjoint,
            budget=MAX_STEPS,
        )

    def forward(weights, x):
        eq = solve(weights, x)
        return eq.value, eq.steps, eq.relative_residual

    def loss(weights, x, c):
        return jnp.sum(solve(weights, x).value.astype(jnp.float32) * c.astype(jnp.float32))

    return forward, loss


def _jaxopt(p: Problem, kind):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import jaxopt

    def make(x):
        tol = p.rtol * math.sqrt(x.size)  # |z| of a layer-normalized z
        fun = lambda z, weights, x: p.f(z, weights, x)  # noqa: E731
        if kind == "anderson":
            return jaxopt.AndersonAcceleration(
                fun, history_size=5, maxiter=MAX_STEPS, tol=tol, implicit_diff=True
            )
        return jaxopt.FixedPointIteration(fun, maxiter=MAX_STEPS, tol=tol, implicit_diff=True)

    def forward(weights, x):
        z, state = make(x).run(jnp.zeros_like(x), weights, x)
        fz = p.f(z, weights, x)
        rel = jnp.linalg.norm((fz - z).astype(jnp.float32)) / jnp.linalg.norm(
            fz.astype(jnp.float32)
        )
        return z, state.iter_num, rel

    def loss(weights, x, c):
        z = make(x).run(jnp.zeros_like(x), weights, x).params
        return jnp.sum(z.astype(jnp.float32) * c.astype(jnp.float32))

    return forward, loss


def _floor(p: Problem):
    def floor(weights, x):
        z = jnp.zeros_like(x)
        for _ in range(FLOOR_STEPS):
            z = p.f(z, weights, x)
        return z

    return floor


def _backends(p: Problem):
    """jaxopt through eqattn.JaxoptSolver (differentiated by jaxopt) and Optimistix's fixed-point
    iteration through eqattn.fixed_point (differentiated by eqattn's implicit adjoint)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import jaxopt
    import optimistix as optx

    tol = p.rtol * math.sqrt(p.B * p.N * p.D)  # as the hand-written baseline's
    anderson = eqattn.JaxoptSolver(
        jaxopt.AndersonAcceleration, history_size=5, maxiter=MAX_STEPS, tol=tol
    )
    picard = eqattn.JaxoptSolver(jaxopt.FixedPointIteration, maxiter=MAX_STEPS, tol=tol)
    # Optimistix scales each element's change by atol + rtol |z_i| and takes a norm of those
    # ratios: with the RMS norm and atol = rtol this is close to P1's relative 2-norm test.
    optx_picard = optx.FixedPointIteration(rtol=p.rtol, atol=p.rtol, norm=optx.rms_norm)
    return [
        ("eqattn JaxoptSolver(AndersonAcceleration)", *_ours(p, anderson, None)),
        ("eqattn JaxoptSolver(FixedPointIteration)", *_ours(p, picard, None)),
        ("eqattn optx.FixedPointIteration + implicit", *_ours(p, optx_picard, None)),
    ]


def _configs(p: Problem, quick: bool = False):
    implicit = eqattn.ImplicitAdjoint()
    out = [("jaxopt Anderson m=5 (baseline)", *_jaxopt(p, "anderson"))]
    out.append(("jaxopt FixedPointIteration", *_jaxopt(p, "picard")))
    out += _backends(p)
    common = dict(rtol=p.rtol, atol=0.0, max_steps=MAX_STEPS)
    for sname, kind in [("Anderson m=5", eqattn.Anderson), ("Picard", eqattn.Picard)]:
        for check in (1, 4):
            solver = kind(**common, check_every=check)
            label = sname if check == 1 else f"{sname} (check_every=4)"
            adjoints = [("implicit", implicit), ("JacobianFree", eqattn.JacobianFree())]
            for aname, adjoint in adjoints if check == 1 else adjoints[:1]:
                out.append((f"eqattn {label} + {aname}", *_ours(p, solver, adjoint)))
    broyden = eqattn.Broyden(**common)
    for aname, adjoint in [("implicit", implicit), ("JacobianFree", eqattn.JacobianFree())]:
        out.append((f"eqattn Broyden + {aname}", *_ours(p, broyden, adjoint)))
    if quick:  # one case of each code path (P2: the multi-head f, the baseline and the default)
        keep = _QUICK_P2 if p.name == "P2" else _QUICK_P1
        out = [c for c in out if c[0] in keep]
    return out


_QUICK_P2 = ("jaxopt Anderson m=5 (baseline)", "eqattn Anderson m=5 + implicit")
_QUICK_P1 = (
    *_QUICK_P2,
    "eqattn JaxoptSolver(AndersonAcceleration)",
    "eqattn optx.FixedPointIteration + implicit",
    "eqattn Picard (check_every=4) + implicit",
    "eqattn Broyden + JacobianFree",
)


def _grad_norm(grads):
    return float(sum(jnp.linalg.norm(g.astype(jnp.float32)) for g in grads))


def _run_problem(p: Problem, repeats: int, quick: bool) -> tuple[list[dict], float]:
    weights, x, c = p.arrays()
    configs = _configs(p, quick)
    cases = {"floor": (_floor(p), weights, x)}
    for name, forward, loss in configs:
        cases[name + " | forward"] = (forward, weights, x)
        cases[name + " | forward+backward"] = (jax.grad(loss), weights, x, c)
    errors: dict[str, str] = {}
    timings = time_interleaved(cases, repeats=repeats, errors=errors)
    floor = timings["floor"]["median_s"]
    base_name = configs[0][0]
    base = {mode: timings.get(f"{base_name} | {mode}") for mode in ("forward", "forward+backward")}
    base_norm = _grad_norm(base["forward+backward"]["output"]) if base["forward+backward"] else None
    head = {"problem": p.name, "dtype": p.dtype, "B": p.B, "N": p.N, "D": p.D, "heads": p.heads}
    rows = []
    for name, _, _ in configs:
        t_fwd = timings.get(name + " | forward")
        t_total = timings.get(name + " | forward+backward")
        if t_fwd is None or t_total is None:
            error = errors.get(name + " | forward") or errors.get(name + " | forward+backward")
            rows.append({**head, "method": name, "error": error})
            continue
        _, steps, rel = t_fwd["output"]
        norm = _grad_norm(t_total["output"])
        rows.append(
            {
                **head,
                "method": name,
                "steps": int(steps),
                "relative_residual": float(rel),
                "forward_ms": 1e3 * t_fwd["median_s"],
                "forward_backward_ms": 1e3 * t_total["median_s"],
                "forward_ratio": _ratio(t_fwd, base["forward"]),
                "forward_backward_ratio": _ratio(t_total, base["forward+backward"]),
                "forward_over_floor": t_fwd["median_s"] / floor,
                "grad_norm": norm,
                "grad_norm_rel_diff": None
                if base_norm is None
                else abs(norm - base_norm) / base_norm,
                "compile_s": t_fwd["compile_s"] + t_total["compile_s"],
                "forward_times_s": t_fwd["times_s"],
                "forward_backward_times_s": t_total["times_s"],
            }
        )
    if _torchdeq.available():
        for r in _torchdeq.run(p, rtol=p.rtol, max_steps=MAX_STEPS, repeats=repeats):
            if "error" in r:
                rows.append({**head, **r})
                continue
            rows.append(
                {
                    **head,
                    **r,
                    "forward_ms": 1e3 * r["forward_s"],
                    "forward_backward_ms": 1e3 * r["forward_backward_s"],
                    "forward_ratio": _ratio({"median_s": r["forward_s"]}, base["forward"]),
                    "forward_backward_ratio": _ratio(
                        {"median_s": r["forward_backward_s"]}, base["forward+backward"]
                    ),
                    "forward_over_floor": r["forward_s"] / floor,
                    "grad_norm_rel_diff": None
                    if base_norm is None
                    else abs(r["grad_norm"] - base_norm) / base_norm,
                }
            )
    return rows, floor


def _ratio(t, base) -> float | None:
    return None if base is None else t["median_s"] / base["median_s"]


def run(quick: bool = False) -> tuple[list[dict], dict]:
    repeats = 3 if quick else 20
    rows, floors = [], {}
    if not _torchdeq.available():
        print("(torch/torchdeq not installed: no torchdeq rows; `pip install torch torchdeq`)")
    for p in problems(quick):
        if p.name == "P2" and not quick:
            repeats = 10
        problem_rows, floor = _run_problem(p, repeats, quick)
        rows += problem_rows
        key = f"{p.name} {p.dtype}"
        floors[key] = 1e3 * floor
        print(f"{key}: floor ({FLOOR_STEPS} evaluations of f) {1e3 * floor:.2f} ms")
    if jax.default_backend() == "cpu" and not quick:
        print("(P2, GPU-sized, runs on accelerators only)")
    print_table(
        rows,
        [
            ("problem", "problem", "s"),
            ("dtype", "dtype", "s"),
            ("method", "method", "s"),
            ("steps", "steps", "d"),
            ("relative_residual", "rel. residual", ".1e"),
            ("forward_ms", "fwd ms", ".1f"),
            ("forward_ratio", "x base", ".2f"),
            ("forward_over_floor", "x floor", ".2f"),
            ("forward_backward_ms", "fwd+bwd ms", ".1f"),
            ("forward_backward_ratio", "x base", ".2f"),
            ("grad_norm", "grad norm", ".2f"),
            ("grad_norm_rel_diff", "vs base", ".1e"),
        ],
    )
    for r in rows:
        if r.get("error"):
            print(f"{r['problem']} {r['dtype']} {r['method']}: {r['error'][:160]}")
    extra = {
        "problems": [dataclasses.asdict(p) for p in problems(quick)],
        "max_steps": MAX_STEPS,
        "floor_ms": floors,
        "floor_steps": FLOOR_STEPS,
    }
    return rows, extra


def _maybe(x, spec) -> str:
    return "" if x is None else format(x, spec)


def table(payload) -> str:
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
        table = markdown_table(
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
