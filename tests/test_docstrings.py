"""The examples in the public docstrings run as written (in JAX's default float32, as a reader
runs them)."""

import inspect
import re

import jax
import pytest

import eqattn
import eqattn.nn
import eqattn.parallel

MODULES = (eqattn, eqattn.nn, eqattn.parallel)
# Public callables that must carry an example (the list grows as examples are written).
MUST_HAVE = {
    "attention",
    "attention_with_lse",
    "log_normalizer",
    "attention_weights",
    "select_implementation",
    "fixed_point",
    "MultiHeadAttention",
}


def _public():
    for module in MODULES:
        for name in dir(module):
            obj = getattr(module, name)
            if not name.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj)):
                yield f"{module.__name__}.{name}", obj


def _examples(obj):
    doc = inspect.getdoc(obj) or ""
    part = doc.split("**Example:**", 1)
    return re.findall(r"```python\n(.*?)```", part[1], flags=re.S) if len(part) == 2 else []


EXAMPLES = [(name, i, code) for name, obj in _public() for i, code in enumerate(_examples(obj))]


def test_the_required_examples_exist():
    have = {name.rsplit(".", 1)[1] for name, _, _ in EXAMPLES}
    assert MUST_HAVE <= have, MUST_HAVE - have


@pytest.mark.float32
@pytest.mark.parametrize("name, index, code", EXAMPLES, ids=[f"{n}[{i}]" for n, i, _ in EXAMPLES])
def test_docstring_example_runs(name, index, code):
    with jax.enable_x64(False):
        exec(compile(code, f"{name} example {index}", "exec"), {})
