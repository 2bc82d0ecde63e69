"""The notebooks are clean, small and Colab-ready, and the docs build runs every one of them top
to bottom in its small setting (EQATTN_NOTEBOOK_SMALL=1)."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_notebooks_exist():
    names = {p.stem[:2] for p in NOTEBOOKS}
    assert names >= {"01", "02", "03", "04", "05", "06"}, names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_clean_and_small(path):
    nb = json.loads(path.read_text())
    first = "".join(nb["cells"][0]["source"])
    assert "colab.research.google.com/github/" in first and path.name in first  # the badge
    assert path.stat().st_size < 100_000
    params = [c for c in nb["cells"] if "# @param" in "".join(c["source"])]
    assert params and "EQATTN_NOTEBOOK_SMALL" in "".join(params[0]["source"])


def test_the_docs_build_runs_every_notebook():
    """The notebooks run top to bottom in the README's test command's `mkdocs build --strict`:
    mkdocs-jupyter executes each one (no cache, a cell's error fails the build) in the small
    setting the docs hook sets, so the site shows this tree's outputs and figures. (They ran in
    this file before; the build runs them once instead of twice.)"""
    config = (ROOT / "mkdocs.yml").read_text()
    plugin = config[config.index("- mkdocs-jupyter:") :].split("\n  - ")[0]
    for setting in ("execute: !ENV [EQATTN_DOCS_EXECUTE, true]", "allow_errors: false"):
        assert setting in plugin, setting
    assert "cache: false" in plugin and 'include: ["notebooks/*.ipynb"]' in plugin
    assert (ROOT / "docs" / "notebooks").resolve() == (ROOT / "notebooks").resolve()
    hooks = (ROOT / "docs" / "hooks.py").read_text()
    assert 'os.environ.setdefault("EQATTN_NOTEBOOK_SMALL", "1")' in hooks
    readme = (ROOT / "README.md").read_text()
    assert "mkdocs build --strict && python -m pytest" in readme
