"""Runtime type checks in the tests: jaxtyping checks every annotated call in eqattn
(`--jaxtyping-packages` in pyproject.toml). Bad input given on purpose, to see eqattn's own
error (the `ValueError` naming the argument and the shapes that users get), runs `unchecked()`;
a test whose purpose is such errors is marked `bad_input` instead (conftest)."""

import contextlib

import jaxtyping


@contextlib.contextmanager
def unchecked():
    """jaxtyping's runtime checks stand aside within this block."""
    before = jaxtyping.config.jaxtyping_disable
    jaxtyping.config.update("jaxtyping_disable", True)
    try:
        yield
    finally:
        jaxtyping.config.update("jaxtyping_disable", before)


DIGITS = ["--task", "digits", "--model", "deq", "--train-size", "64", "--batch-size", "32"]
DIGITS += ["--dim", "8", "--heads", "2", "--no-progress"]
"""`eqattn train`'s tiny digits run (one DEQ, 64 images, width 8): a few seconds."""


def run(capsys, *argv):
    """`eqattn ARGV` in this process: `(exit status, stdout, stderr)`."""
    from eqattn.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def transcripts():
    """`docs/transcripts.py`, the transcripts' checker, as a module."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).parent.parent / "docs" / "transcripts.py"
    spec = importlib.util.spec_from_file_location("transcripts", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


DOCS_BLOCKS_RUN_BY_TESTS = {
    "docs/guide/reasoning.md[python block 0]": "tests/prefix_sums/test_prefix_sums.py",
}
"""Docs examples that a test runs itself and goes on from (the README-example test leaves them
to it): the reasoning guide's trains the prefix-sums recipe that test checks."""


def python_blocks(text: str) -> list[str]:
    """The ```python blocks of a Markdown page, in order (`PAGE[python block I]` names them)."""
    import re

    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def docs_block(name: str) -> str:
    """The Python block `PAGE[python block I]` of the README or a docs page, as written."""
    import re
    from pathlib import Path

    page, index = re.fullmatch(r"(.+)\[python block (\d+)\]", name).groups()
    return python_blocks((Path(__file__).parent.parent / page).read_text())[int(index)]
