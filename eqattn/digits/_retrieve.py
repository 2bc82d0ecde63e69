r"""Digits stored as modern Hopfield patterns, retrieved from corrupted queries.

Each stored pattern $x_i$ is an image, centred (the mean image subtracted) and scaled to unit
norm; a query is a stored pattern with pixels masked (set to the mean) or noised. Retrieval runs the update
$\xi \leftarrow X\,\mathrm{softmax}(\beta X^\top \xi)$ ([`eqattn.hopfield_update`][]) and counts
a success when the stored pattern nearest to the result is the query's own. Small $\beta$ gives a
global average, intermediate $\beta$ metastable mixtures of similar digits, large $\beta$ single
patterns (H. Ramsauer et al., "Hopfield Networks is All You Need", 2020).
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from .. import hopfield_update
from ..train import ConfigError, RunError, atomic_write, writable_dir
from ._data import load_digits

BETAS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)


def corrupt(
    images: np.ndarray, how: Literal["mask", "noise"], amount: float, rng: np.random.Generator
) -> np.ndarray:
    """`mask`: a random `amount` fraction of each centred image's pixels set to 0 (the mean
    image: "unknown"); `noise`: Gaussian noise of standard deviation `amount` (pixels in [0, 1])."""
    if how == "mask":
        return np.where(rng.random(images.shape) < amount, 0.0, images).astype(np.float32)
    if how == "noise":
        return (images + amount * rng.standard_normal(images.shape)).astype(np.float32)
    raise ConfigError(f"`corruption` must be 'mask' or 'noise'; got {how!r}")


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-6)


@jax.jit
def _retrieve(queries, patterns, beta, steps):
    return jax.lax.fori_loop(
        0, steps, lambda _, s: hopfield_update(s, patterns, beta=beta), queries
    )


def retrieve(
    out_dir: str | Path,
    *,
    patterns: int = 200,
    corruption: Literal["mask", "noise"] = "mask",
    amount: float = 0.5,
    betas: tuple[float, ...] = BETAS,
    steps: int = 1,
    seed: int = 0,
    plot: bool = True,
) -> dict[str, Any]:
    """Store `patterns` training images, corrupt each, retrieve, and return accuracy per beta;
    writes `retrieval.png` (query / retrieved / stored, at the best beta) and `retrieval.json`
    to `out_dir` (nothing with `plot=False`).

    **Example:**

    ```python
    from eqattn import digits

    report = digits.retrieve("runs/retrieval", patterns=50, betas=(1.0, 64.0), plot=False)
    small, large = (row["pattern_accuracy"] for row in report["rows"])
    assert large > small  # single patterns at large beta, averages at small
    ```
    """
    data = load_digits()
    images, labels = data.train_images, data.train_labels
    if not 1 <= patterns <= len(images):
        raise ConfigError(f"`patterns` must be in [1, {len(images)}]; got {patterns}")
    if steps < 1:
        raise ConfigError(f"`steps` must be >= 1; got {steps}")
    if not betas or not all(math.isfinite(b) and b > 0 for b in betas):
        raise ConfigError(f"every `betas` value must be finite and > 0; got {list(betas)}")
    if corruption == "mask" and not 0 <= amount < 1:
        raise ConfigError(f"`amount` for 'mask' is a fraction in [0, 1); got {amount}")
    if not (amount >= 0 and math.isfinite(amount)):
        raise ConfigError(f"`amount` must be finite and >= 0; got {amount}")
    out = writable_dir(out_dir) if plot else None
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(images), patterns, replace=False)
    stored_images = images[chosen]
    flat = stored_images.reshape(patterns, -1)
    mean = flat.mean(0)
    centred = flat - mean
    stored = _unit(centred)
    queries = _unit(corrupt(centred, corruption, amount, rng))
    rows = []
    results = {}
    for beta in betas:
        xi = np.asarray(_retrieve(jnp.asarray(queries), jnp.asarray(stored), beta, steps))
        nearest = np.argmin(((xi[:, None, :] - stored[None]) ** 2).sum(-1), axis=1)
        results[beta] = xi
        rows.append(
            {
                "beta": beta,
                "pattern_accuracy": float(np.mean(nearest == np.arange(patterns))),
                "class_accuracy": float(np.mean(labels[chosen][nearest] == labels[chosen])),
                "mean_error": float(np.mean(np.linalg.norm(xi - stored, axis=-1))),
            }
        )
    query_nearest = np.argmin(((queries[:, None, :] - stored[None]) ** 2).sum(-1), axis=1)
    best = max(rows, key=lambda r: (r["pattern_accuracy"], -r["beta"]))
    report: dict[str, Any] = {
        "patterns": patterns,
        "corruption": corruption,
        "amount": amount,
        "steps": steps,
        "nearest_neighbour_of_query": float(np.mean(query_nearest == np.arange(patterns))),
        "rows": rows,
        "best_beta": best["beta"],
    }
    if out is not None:
        # back to pixels for the figure: the mean image plus the pattern at a typical norm
        scale = float(np.median(np.linalg.norm(centred, axis=-1)))
        shown, retrieved, kept = (
            mean + scale * v for v in (queries, results[best["beta"]], stored)
        )
        report["figure"] = str(_plot(out / "retrieval.png", shown, retrieved, kept, best["beta"]))
        atomic_write(out / "retrieval.json", (json.dumps(report, indent=2) + "\n").encode())
    return report


def _plot(path: Path, queries, retrieved, stored, beta, columns: int = 8) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RunError("the retrieval figure needs matplotlib: pip install matplotlib") from None
    fig, axes = plt.subplots(3, columns, figsize=(columns * 1.1, 3.6))
    for row, (name, x) in enumerate(
        (("query", queries), (f"retrieved, beta={beta:g}", retrieved), ("stored", stored))
    ):
        for col in range(columns):
            ax = axes[row, col]
            ax.imshow(x[col].reshape(8, 8), cmap="gray_r", vmin=0.0, vmax=1.0)
            ax.set_xticks([])
            ax.set_yticks([])
        axes[row, 0].set_ylabel(name.split(",")[0], fontsize=9)
    fig.suptitle(f"Hopfield retrieval of digits (beta = {beta:g})", fontsize=10)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=80, format="png")
    atomic_write(path, buffer.getvalue())
    plt.close(fig)
    return path
