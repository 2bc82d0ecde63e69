"""The wheel a user installs: built from this checkout, it holds every module of the package
(the engine's subpackages too) and `py.typed`, and installed on its own it imports and computes."""

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent

SMOKE = """
import numpy as np, eqattn
print(eqattn.__file__, eqattn.__version__)
x = np.arange(12.0).reshape(4, 3) / 10
w = np.exp(x @ x.T)
assert np.allclose(eqattn.attention(x, x), (w / w.sum(1, keepdims=True)) @ x, atol=1e-5)
import jax.numpy as jnp
eq = eqattn.fixed_point(lambda z, _: jnp.cos(z), jnp.zeros(()))
assert eq.converged and abs(float(eq.value) - 0.7390851) < 1e-4
"""


@pytest.mark.skipif(
    importlib.util.find_spec("hatchling") is None, reason="needs hatchling (the test extra)"
)
def test_the_wheel_holds_the_package_and_runs(tmp_path):
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*build, "-w", str(tmp_path), str(ROOT)], check=True, timeout=300)
    (wheel,) = tmp_path.glob("eqattn-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "eqattn").rglob("*.py")}
    assert sources | {"eqattn/py.typed"} <= names, sorted(sources - names)
    site = tmp_path / "site"
    install = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q"]
    subprocess.run([*install, "--target", str(site), str(wheel)], check=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(site), "JAX_PLATFORMS": "cpu"}
    run = subprocess.run(
        [sys.executable, "-c", SMOKE], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-4000:]
    where, version = run.stdout.split()[-2:]
    assert where.startswith(str(site)), where  # the installed wheel ran, not this checkout
    assert version == importlib.metadata.version("eqattn")


def test_a_source_tree_that_was_never_installed_names_its_version(monkeypatch):
    """On `PYTHONPATH` without installed metadata (a tree copied to a machine with no network),
    `eqattn.__version__` is `pyproject.toml`'s, marked `+source`, instead of failing the import."""
    import re

    import eqattn

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    (declared,) = re.findall(r'(?m)^version = "(.+)"$', (ROOT / "pyproject.toml").read_text())
    assert eqattn._version() == f"{declared}+source"
