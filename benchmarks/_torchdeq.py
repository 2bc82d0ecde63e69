"""P1 with torchdeq (PyTorch) for comparison; used by the `deq` suite when torch and torchdeq are
installed (`pip install torch torchdeq`). Same problem, weights and data as `benchmarks.deq`.

Timed with warm-up and the median of repeats (torch runs eagerly; `torch.no_grad()` for the
forward pass, implicit differentiation (ift=True) for forward+backward). It runs after the JAX
cases in the same process, so its ratios are not round-robin.
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


def run(weights, x, c, *, rtol: float, max_steps: int, repeats: int) -> list[dict]:
    import numpy as np
    import torch
    import torch.nn.functional as F
    import torchdeq

    wq, wk, wv = (torch.tensor(np.asarray(w), requires_grad=True) for w in weights)
    xt, ct = torch.tensor(np.asarray(x)), torch.tensor(np.asarray(c))
    d = xt.shape[-1]

    def f(z):
        attn = torch.softmax((z @ wq) @ (z @ wk).transpose(-1, -2) / math.sqrt(d), dim=-1) @ (
            z @ wv
        )
        return F.layer_norm(z + attn + xt, (d,), eps=1e-5)

    def timed(fn):
        fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times), times

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
            return torch.autograd.grad((z[-1] * ct).sum(), (wq, wk, wv))

        _, info = forward()
        grads = forward_backward()
        t_fwd, fwd_times = timed(forward)
        t_total, total_times = timed(forward_backward)
        rows.append(
            {
                "method": f"torchdeq {version('torchdeq')} {solver} (torch {torch.__version__})",
                "steps": int(info["nstep"].max()),
                "relative_residual": float(info["rel_lowest"].max()),
                "forward_s": t_fwd,
                "forward_backward_s": t_total,
                "grad_norm": float(sum(g.norm() for g in grads)),
                "forward_times_s": fwd_times,
                "forward_backward_times_s": total_times,
            }
        )
    return rows
