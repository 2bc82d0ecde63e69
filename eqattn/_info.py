"""What this installation has: versions, devices and the optional solver backends (what
`eqattn info` prints)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
from typing import Any

import jax


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _auto_table() -> str:
    """Which table `implementation="auto"` reads on this machine's GPU, if any."""
    from ._attention import TABLES, gpu_kind

    kind = gpu_kind()
    if kind in TABLES:
        return f"measured table for {kind} ({'; '.join(TABLES[kind]['source'])})"
    return "the rule" + (f" (no measured table for {kind})" if kind else " (no GPU)")


def info() -> dict[str, Any]:
    """This installation's Python and package versions, JAX's backend and devices, and the
    solver backends it can use (what `eqattn info` prints).

    **Example:**

    ```python
    import eqattn

    facts = eqattn.info()
    assert facts["versions"]["jax"] and facts["devices"]
    ```
    """
    packages = (
        "eqattn", "jax", "jaxlib", "equinox", "optax", "jaxopt", "optimistix", "lineax", "numpy"
    )  # fmt: skip
    extras = ("scikit-learn", "tqdm", "matplotlib")
    found = lambda name: importlib.util.find_spec(name) is not None  # noqa: E731
    return {
        "python": platform.python_version(),
        "versions": {p: _version(p) for p in packages + extras},
        "backend": jax.default_backend(),
        "devices": [f"{d.platform}:{d.id} {d.device_kind}" for d in jax.devices()],
        "attention_auto": _auto_table(),
        "solver_backends": {
            "eqattn (Picard, Anderson, Broyden)": True,
            "jaxopt (eqattn.JaxoptSolver)": found("jaxopt"),
            "optimistix (fixed-point solvers, root finders)": found("optimistix"),
            "lineax (Krylov backward solves: lx.GMRES, lx.BiCGStab, ...)": found("lineax"),
        },
    }
