"""Every notebook runs top to bottom with its small setting (EQATTN_NOTEBOOK_SMALL=1)."""

import json
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_notebooks_exist():
    names = {p.stem[:2] for p in NOTEBOOKS}
    assert names >= {"01", "02", "03", "04", "05"}, names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_clean_and_small(path):
    nb = json.loads(path.read_text())
    first = "".join(nb["cells"][0]["source"])
    assert "colab.research.google.com/github/" in first and path.name in first  # the badge
    assert path.stat().st_size < 100_000
    params = [c for c in nb["cells"] if "# @param" in "".join(c["source"])]
    assert params and "EQATTN_NOTEBOOK_SMALL" in "".join(params[0]["source"])


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, monkeypatch):
    monkeypatch.setenv("EQATTN_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # one CPU device, as in a fresh runtime (and the suite's fast-compile flag)
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()  # raises CellExecutionError, with the cell and traceback, on any error
