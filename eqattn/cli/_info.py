"""`eqattn info`: versions, devices and the optional backends this installation has."""

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
    """What `eqattn info` prints, as a dict."""
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


def format_info(d: dict[str, Any]) -> str:
    rows = [("python", d["python"])]
    rows += [(k, v or "not installed") for k, v in d["versions"].items()]
    rows += [("backend", d["backend"])] + [("device", x) for x in d["devices"]]
    rows += [("solvers", f"{k}: {'yes' if v else 'no'}") for k, v in d["solver_backends"].items()]
    return "\n".join(f"{k:<14}{v}" for k, v in rows)
