"""`closure`: where attention's Gaussian closure holds (an accuracy study, not a timing).

Keys drawn i.i.d. from $N(\\mu, \\Sigma)$ make attention of a query $\\eta$ over them (values =
keys, beta = 1) an estimate of the Gaussian carrier's tilted mean $\\mu + \\Sigma\\eta$
(`eqattn.Discrete` against `eqattn.Gaussian`). It is self-normalized importance sampling with
weights $e^{\\eta\\cdot x}$, whose relative variance is $e^t - 1$ for the tilt
$t = \\eta^\\top\\Sigma\\eta$; its squared error is about
$e^t(\\mathrm{tr}\\,\\Sigma + \\lVert\\Sigma\\eta\\rVert^2)/m$ once the effective number of keys
$m e^{-t}$ is large. Below that the error falls more slowly than $m^{-1/2}$.

For $\\Sigma = I$, $d = 4$, tilts $t$ = 0.25, 1, 4, 9 and 16, and $m = 16, 64, \\dots, 65536$: the
mean error $\\lVert \\mathrm{attention} - (\\mu + \\Sigma\\eta)\\rVert$ over 20 draws (float64),
the prediction $\\sqrt{e^t (d + t)/m}$, the effective number of keys, and per tilt the log-log
slope of the error over the last two m. `--quick`: two tilts, m up to 1024, 4 draws.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

import eqattn

from ._harness import markdown_table, print_table

D = 4


def run(quick: bool = False) -> tuple[list[dict], dict]:
    tilts = (1.0, 9.0) if quick else (0.25, 1.0, 4.0, 9.0, 16.0)
    sizes = [16 * 4**i for i in range(4 if quick else 7)]
    draws = 4 if quick else 20
    rng = np.random.default_rng(0)
    rows = []
    with jax.enable_x64(True):
        mu = rng.normal(size=D)
        target = eqattn.Gaussian(mu, np.eye(D))
        for t in tilts:
            direction = rng.normal(size=D)
            eta = math.sqrt(t) * direction / np.linalg.norm(direction)
            exact = np.asarray(target.mean(jnp.asarray(eta)))
            for m in sizes:
                errors = [
                    float(
                        np.linalg.norm(
                            eqattn.Discrete(mu + rng.normal(size=(m, D))).mean(jnp.asarray(eta))
                            - exact
                        )
                    )
                    for _ in range(draws)
                ]
                rows.append(
                    {
                        "tilt": t,
                        "m": m,
                        "error_mean": float(np.mean(errors)),
                        "predicted": math.sqrt(math.exp(t) * (D + t) / m),
                        "effective_keys": m * math.exp(-t),
                    }
                )
    slopes = {}
    for t in tilts:
        e = [r for r in rows if r["tilt"] == t]
        slopes[str(t)] = math.log(e[-1]["error_mean"] / e[-2]["error_mean"]) / math.log(
            e[-1]["m"] / e[-2]["m"]
        )
    print_table(
        rows,
        [
            ("tilt", "t", ".2f"),
            ("m", "m", "d"),
            ("error_mean", "error", ".3g"),
            ("predicted", "predicted", ".3g"),
            ("effective_keys", "m e^-t", ".3g"),
        ],
    )
    print("slope over the last two m per tilt:", {k: round(v, 2) for k, v in slopes.items()})
    return rows, {"d": D, "draws": draws, "sigma": "identity", "slopes_last": slopes}


def table(payload) -> str:
    """The closure results file as Markdown (the Benchmarks page's table)."""
    rows = payload["rows"]
    tilts = sorted({r["tilt"] for r in rows})
    sizes = sorted({r["m"] for r in rows})
    by = {(r["tilt"], r["m"]): r for r in rows}
    slopes = payload.get("slopes_last", {})
    return markdown_table(
        ["t = eta' Sigma eta", *(f"m = {m}" for m in sizes), "slope (last two m)"],
        [
            [
                f"{t:g}",
                *(f"{by[t, m]['error_mean']:.3g} ({by[t, m]['predicted']:.3g})" for m in sizes),
                f"{slopes[str(t)]:.2f}" if str(t) in slopes else "",
            ]
            for t in tilts
        ],
    )
