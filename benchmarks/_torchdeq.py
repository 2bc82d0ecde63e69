"""The `deq` suite's problems with torchdeq (PyTorch) for comparison, when torch and torchdeq are
installed (`pip install torch torchdeq`). Same problems, weights and data as `benchmarks.deq`;
on the GPU when torch has CUDA.

Timed with warm-up and the median of repeats, each call ended by `torch.cuda.synchronize()` on a
GPU (torch runs eagerly; `torch.no_grad()` for the forward pass, implicit differentiation
(ift=True) for forward+backward). It runs after the JAX cases in the same process, so its ratios
are not round-robin.
"""

from __future__ import annotations

import math
import statistics
import time
from importlib.metadata import version


def available() -> bool:
    try:
        import torch  # noqa: F401
        import torchdeq  # noqa: F401
    except ImportError:
        return False
    return True


def _problem_map(problem, device):
    """The problem's map `f(z)` in torch, its weights (requiring grad) and the cotangent."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    dtype = getattr(torch, problem.dtype)
    weights, x, c = problem.arrays()

    def tensor(a, grad=False):
        t = torch.tensor(np.asarray(a, np.float32), device=device, dtype=dtype)
        return t.requires_grad_(grad)

    ws = [tensor(w, grad=True) for w in weights]
    xt, ct = tensor(x), tensor(c)
    D, heads = problem.D, problem.heads

    def f(z):
        if heads == 0:
            wq, wk, wv = ws
            attn = torch.softmax((z @ wq) @ (z @ wk).transpose(-1, -2) / math.sqrt(D), dim=-1)
            return F.layer_norm(z + attn @ (z @ wv) + xt, (D,), eps=1e-5)
        wq, wk, wv, wo = ws
        b, n, _ = z.shape

        def split(t):
            return t.view(b, n, heads, D // heads).transpose(1, 2)

        attn = F.scaled_dot_product_attention(split(z @ wq), split(z @ wk), split(z @ wv))
        merged = attn.transpose(1, 2).reshape(b, n, D)
        return F.layer_norm(z + merged @ wo + xt, (D,), eps=1e-5)

    return f, ws, xt, ct


def _timed(fn, sync, repeats):
    """(median, all times) of `repeats` calls of `fn` after one warm-up call."""
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def run(problem, *, rtol: float, max_steps: int, repeats: int) -> list[dict]:
    import torch
    import torchdeq

    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    f, ws, xt, ct = _problem_map(problem, device)
    rows = []
    for solver in ("anderson", "fixed_point_iter"):
        deq = torchdeq.get_deq(
            f_solver=solver,
            b_solver=solver,
            f_max_iter=max_steps,
            b_max_iter=max_steps,
            f_tol=rtol,
            b_tol=rtol / 10,
            f_stop_mode="rel",
            b_stop_mode="rel",
            ift=True,
        )

        def forward():
            with torch.no_grad():
                return deq(f, torch.zeros_like(xt))

        def forward_backward():
            z, _ = deq(f, torch.zeros_like(xt))
            return torch.autograd.grad((z[-1].float() * ct.float()).sum(), ws)

        try:
            _, info = forward()
            grads = forward_backward()
            t_fwd, fwd_times = _timed(forward, sync, repeats)
            t_total, total_times = _timed(forward_backward, sync, repeats)
        except Exception as e:  # reported, like the JAX cases that fail
            rows.append({"method": f"torchdeq {solver}", "error": f"{type(e).__name__}: {e}"})
            continue
        rows.append(
            {
                "method": f"torchdeq {version('torchdeq')} {solver} (torch {torch.__version__}, "
                f"{device})",
                "steps": int(info["nstep"].max()),
                "relative_residual": float(info["rel_lowest"].max()),
                "forward_s": t_fwd,
                "forward_backward_s": t_total,
                "grad_norm": float(sum(g.float().norm() for g in grads)),
                "forward_times_s": fwd_times,
                "forward_backward_times_s": total_times,
            }
        )
    return rows
