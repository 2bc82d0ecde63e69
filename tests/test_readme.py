"""The README's Python examples run as written, and its tables are the committed results."""

import re
from pathlib import Path

import jax
import pytest

README = Path(__file__).parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples():
    assert BLOCKS


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index):
    # as a reader runs them: JAX's default float32 (the suite switches float64 on elsewhere)
    with jax.enable_x64(False):
        exec(compile(BLOCKS[index], f"README.md[python block {index}]", "exec"), {})


def test_readme_tables_are_the_committed_results(capsys):
    """The Performance tables are `python -m benchmarks.report`'s output on the committed
    results files, figure for figure."""
    from benchmarks.report import main as report

    report([])
    tables = capsys.readouterr().out.strip()
    assert tables.count("### ") >= 7
    assert tables in README.read_text()
