"""`deq`: the reference DEQ attention problem P1, every solver x adjoint, against plain jaxopt.

    f(z; x) = LN(z + softmax(z Wq (z Wk)^T / sqrt(D)) z Wv + x)   (layer norm over D, no affine)
    B, N, D = 16, 64, 64, float32; W ~ N(0, (0.6/sqrt(D))^2) drawn from numpy's default_rng(0) in
    the order Wq, Wk, Wv, then x; z0 = 0; stop at |f(z) - z| / |f(z)| <= 1e-4 (whole batch, 2-norm)
    or 60 steps; loss = sum(z* * C), C from default_rng(1).

The baselines are written by hand with jaxopt (AndersonAcceleration and FixedPointIteration,
implicit_diff=True, their default backward solve). jaxopt's stop test is absolute,
|f(z) - z| <= tol, so tol = 1e-4 * |z| with |z| = sqrt(B N D), the norm of a layer-normalized z.
With torch and torchdeq installed, torchdeq's Anderson and fixed-point solvers (ift=True) run
the same problem too (see `benchmarks/_torchdeq.py`). The floor is 15 evaluations of f in a jitted, unrolled loop: the least an Anderson forward pass
does here. All cases are timed round-robin (one call of each per round) so that ratios compare
calls made at the same moments. Gradient norm: the sum of the norms of dloss/dWq, dWk, dWv.
"""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np

import eqattn

from . import _torchdeq
from ._harness import print_table, time_interleaved

B, N, D = 16, 64, 64
RTOL, MAX_STEPS, FLOOR_STEPS = 1e-4, 60, 15


def problem(batch: int = B):
    rng = np.random.default_rng(0)
    s = 0.6 / math.sqrt(D)
    weights = tuple((rng.normal(size=(D, D)) * s).astype(np.float32) for _ in range(3))
    x = rng.normal(size=(B, N, D)).astype(np.float32)[:batch]
    c = np.random.default_rng(1).normal(size=(B, N, D)).astype(np.float32)[:batch]
    return weights, x, c


def f(z, weights, x):
    wq, wk, wv = weights
    attn = eqattn.attention(z @ wq, z @ wk, z @ wv, beta=1 / math.sqrt(D))
    return eqattn.renormalize(z + attn + x)


def _ours(solver, adjoint):
    def solve(weights, x):
        return eqattn.fixed_point(
            lambda z, a: f(z, *a), jnp.zeros_like(x), (weights, x), solver=solver, adjoint=adjoint
        )

    def forward(weights, x):
        eq = solve(weights, x)
        return eq.value, eq.steps, eq.relative_residual

    def loss(weights, x, c):
        return jnp.sum(solve(weights, x).value * c)

    return forward, loss


def _jaxopt(kind):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import jaxopt

    def make(x):
        tol = RTOL * math.sqrt(x.size)  # |z| of a layer-normalized z
        fun = lambda z, weights, x: f(z, weights, x)  # noqa: E731
        if kind == "anderson":
            return jaxopt.AndersonAcceleration(
                fun, history_size=5, maxiter=MAX_STEPS, tol=tol, implicit_diff=True
            )
        return jaxopt.FixedPointIteration(fun, maxiter=MAX_STEPS, tol=tol, implicit_diff=True)

    def forward(weights, x):
        z, state = make(x).run(jnp.zeros_like(x), weights, x)
        fz = f(z, weights, x)
        return z, state.iter_num, jnp.linalg.norm(fz - z) / jnp.linalg.norm(fz)

    def loss(weights, x, c):
        return jnp.sum(make(x).run(jnp.zeros_like(x), weights, x).params * c)

    return forward, loss


def _floor(weights, x):
    z = jnp.zeros_like(x)
    for _ in range(FLOOR_STEPS):
        z = f(z, weights, x)
    return z


def _configs():
    implicit = eqattn.ImplicitAdjoint()
    out = [("jaxopt Anderson m=5 (baseline)", *_jaxopt("anderson"))]
    out.append(("jaxopt FixedPointIteration", *_jaxopt("picard")))
    for sname, solver in [
        ("Anderson m=5", eqattn.Anderson(rtol=RTOL, atol=0.0, max_steps=MAX_STEPS)),
        ("Picard", eqattn.Picard(rtol=RTOL, atol=0.0, max_steps=MAX_STEPS)),
        ("Broyden", eqattn.Broyden(rtol=RTOL, atol=0.0, max_steps=MAX_STEPS)),
    ]:
        for aname, adjoint in [("implicit", implicit), ("JacobianFree", eqattn.JacobianFree())]:
            out.append((f"eqattn {sname} + {aname}", *_ours(solver, adjoint)))
    return out


def _grad_norm(grads):
    return float(sum(jnp.linalg.norm(g) for g in grads))


def run(quick: bool = False) -> tuple[list[dict], dict]:
    repeats = 3 if quick else 20
    weights, x, c = problem(batch=2 if quick else B)
    configs = _configs()
    cases = {"floor": (_floor, weights, x)}
    for name, forward, loss in configs:
        cases[name + " | forward"] = (forward, weights, x)
        cases[name + " | forward+backward"] = (jax.grad(loss), weights, x, c)
    timings = time_interleaved(cases, repeats=repeats)
    floor = timings["floor"]
    rows = []
    base_name = configs[0][0]
    base_norm = _grad_norm(timings[base_name + " | forward+backward"]["output"])
    base_fwd = timings[base_name + " | forward"]["median_s"]
    base_total = timings[base_name + " | forward+backward"]["median_s"]
    for name, forward, loss in configs:
        t_fwd = timings[name + " | forward"]
        t_total = timings[name + " | forward+backward"]
        _, steps, rel = t_fwd["output"]
        norm = _grad_norm(t_total["output"])
        rows.append(
            {
                "method": name,
                "steps": int(steps),
                "relative_residual": float(rel),
                "forward_ms": 1e3 * t_fwd["median_s"],
                "forward_backward_ms": 1e3 * t_total["median_s"],
                "forward_ratio": t_fwd["median_s"] / base_fwd,
                "forward_backward_ratio": t_total["median_s"] / base_total,
                "forward_over_floor": t_fwd["median_s"] / floor["median_s"],
                "grad_norm": norm,
                "grad_norm_rel_diff": abs(norm - base_norm) / base_norm,
                "compile_s": t_fwd["compile_s"] + t_total["compile_s"],
                "forward_times_s": t_fwd["times_s"],
                "forward_backward_times_s": t_total["times_s"],
            }
        )
    if _torchdeq.available():
        for r in _torchdeq.run(weights, x, c, rtol=RTOL, max_steps=MAX_STEPS, repeats=repeats):
            rows.append(
                {
                    **r,
                    "forward_ms": 1e3 * r["forward_s"],
                    "forward_backward_ms": 1e3 * r["forward_backward_s"],
                    "forward_ratio": r["forward_s"] / base_fwd,
                    "forward_backward_ratio": r["forward_backward_s"] / base_total,
                    "forward_over_floor": r["forward_s"] / floor["median_s"],
                    "grad_norm_rel_diff": abs(r["grad_norm"] - base_norm) / base_norm,
                }
            )
    else:
        print("(torch/torchdeq not installed: no torchdeq rows; `pip install torch torchdeq`)")
    print(f"floor ({FLOOR_STEPS} evaluations of f): {1e3 * floor['median_s']:.2f} ms")
    print_table(
        rows,
        [
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
    extra = {
        "problem": {"B": x.shape[0], "N": N, "D": D, "rtol": RTOL, "max_steps": MAX_STEPS},
        "floor_ms": 1e3 * floor["median_s"],
        "floor_steps": FLOOR_STEPS,
    }
    return rows, extra
