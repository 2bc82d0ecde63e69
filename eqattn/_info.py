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
        "solver_backends": {
            "eqattn (Picard, Anderson, Broyden)": True,
            "jaxopt (eqattn.JaxoptSolver)": found("jaxopt"),
            "optimistix (fixed-point solvers, root finders)": found("optimistix"),
            "lineax (GMRES, BiCGStab, NormalCG backward solves)": found("lineax"),
        },
    }
