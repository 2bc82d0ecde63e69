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
    packages = ("eqattn", "jax", "jaxlib", "equinox", "optax", "jaxopt", "optimistix", "numpy")
    extras = ("scikit-learn", "tqdm", "matplotlib")
    return {
        "python": platform.python_version(),
        "versions": {p: _version(p) for p in packages + extras},
        "backend": jax.default_backend(),
        "devices": [f"{d.platform}:{d.id} {d.device_kind}" for d in jax.devices()],
        "solver_backends": {
            # eqattn's fixed-point solvers are its own; jaxopt supplies the Krylov adjoint solvers.
            "eqattn (Picard, Anderson, Broyden)": True,
            "jaxopt (GMRES, BiCGStab, NormalCG)": importlib.util.find_spec("jaxopt") is not None,
            "optimistix (not wired in yet)": importlib.util.find_spec("optimistix") is not None,
        },
    }


def format_info(d: dict[str, Any]) -> str:
    rows = [("python", d["python"])]
    rows += [(k, v or "not installed") for k, v in d["versions"].items()]
    rows += [("backend", d["backend"])] + [("device", x) for x in d["devices"]]
    rows += [("solvers", f"{k}: {'yes' if v else 'no'}") for k, v in d["solver_backends"].items()]
    return "\n".join(f"{k:<14}{v}" for k, v in rows)
