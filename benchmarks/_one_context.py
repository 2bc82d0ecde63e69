"""One MLIR context for all of a process's lowerings, for what is compiled to run rather than to
be timed (the tests' workers, `python -m benchmarks --quick`).

JAX makes a fresh MLIR context for every program it lowers and loads every dialect into it: most
of the time a small program takes to lower, and a test run lowers thousands (the docstring
examples, run alone on a 2-core CPU: 2,756 programs; lowering 56 s of 198 s with a context each,
14 s of 136 s with one). The programs are the same either way. A context keeps what it has made
(types, attributes, constants) until it goes, so `release` lets the current one go (the tests
do after each module). This reaches into JAX's private `jax._src.interpreters.mlir`: where that
is not as expected, nothing is changed and lowering is JAX's own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_made: Callable[[], Any] | None = None
"""JAX's own `make_ir_context`, once replaced."""
_current: list[Any] = []


def use_one() -> bool:
    """Lower every program of this process into one MLIR context (until `release`). Whether it
    applies: False where JAX's lowering is not as expected."""
    global _made
    if _made is not None:
        return True
    try:
        from jax._src.interpreters import mlir
    except ImportError:
        return False
    own = getattr(mlir, "make_ir_context", None)
    if own is None or "context or make_ir_context()" not in _source(mlir.ModuleContext.__init__):
        return False

    def one():
        if not _current:
            _current.append(own())
        return _current[0]

    _made = own
    mlir.make_ir_context = one
    return True


def release() -> None:
    """Let the current context go (the next lowering makes a new one)."""
    _current.clear()


def _source(function) -> str:
    import inspect

    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""
