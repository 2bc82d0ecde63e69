"""The examples in the public docstrings run as written (in JAX's default float32, as a reader
runs them)."""

import inspect
import re

import jax
import pytest

import eqattn
import eqattn.digits
import eqattn.graphs
import eqattn.mazes
import eqattn.nn
import eqattn.parallel
import eqattn.prefix_sums
import eqattn.text
import eqattn.train

MODULES = (
    eqattn,
    eqattn.nn,
    eqattn.parallel,
    eqattn.train,
    eqattn.digits,
    eqattn.text,
    eqattn.graphs,
    eqattn.prefix_sums,
    eqattn.mazes,
)


def _public():
    for module in MODULES:
        for name in getattr(module, "__all__", dir(module)):
            obj = getattr(module, name)
            if not name.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj)):
                yield f"{module.__name__}.{name}", obj


def _examples(obj):
    doc = inspect.getdoc(obj) or ""
    part = doc.split("**Example:**", 1)
    return re.findall(r"```python\n(.*?)```", part[1], flags=re.S) if len(part) == 2 else []


EXAMPLES = [(name, i, code) for name, obj in _public() for i, code in enumerate(_examples(obj))]


def test_every_public_function_and_class_has_an_example():
    """Abstract bases excepted: their subclasses' examples show them."""
    have = {name for name, _, _ in EXAMPLES}
    need = {name for name, _ in _public() if not name.rsplit(".", 1)[1].startswith("Abstract")}
    assert need <= have, sorted(need - have)


@pytest.mark.float32
@pytest.mark.parametrize("name, index, code", EXAMPLES, ids=[f"{n}[{i}]" for n, i, _ in EXAMPLES])
def test_docstring_example_runs(name, index, code):
    with jax.enable_x64(False):
        exec(compile(code, f"{name} example {index}", "exec"), {})
