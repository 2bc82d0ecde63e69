"""The tree's shape: one direction of imports (no cycle; nothing outside `eqattn.cli` imports the
command), and the sizes a reader can hold (modules, functions, test files)."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "eqattn"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name: str, level: int, current: str, is_package: bool) -> str:
    if level == 0:
        return name
    base = current.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def import_graph() -> dict[str, set[str]]:
    """Each eqattn module's imports of eqattn modules (at any depth of the file: function-level
    imports too), `from package import submodule` resolved to the submodule."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = path.name == "__init__.py"
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node.module or "", node.level, name, package)
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                    for a in node.names
                ]
            else:
                continue
            edges |= {t for t in targets if t in modules and t != name}
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_imports_have_one_direction():
    graph = import_graph()
    assert len(graph) > 50 and "eqattn.train._trainer" in graph["eqattn.train._api"]
    assert _cycles(graph) == []
    upward = [
        (a, b)
        for a, bs in graph.items()
        for b in bs
        if b.startswith("eqattn.cli") and not a.startswith(("eqattn.cli", "eqattn.__main__"))
    ]
    assert upward == []


FLOORS = (
    ("eqattn._errors",),
    ("eqattn._attention",),
    ("eqattn._solve", "eqattn._measures", "eqattn._renorm", "eqattn._hopfield"),
    ("eqattn._graph",),
    ("eqattn.parallel",),
    ("eqattn.nn",),
    ("eqattn._info",),
    ("eqattn",),
    ("eqattn.train",),
    ("eqattn.digits", "eqattn.text", "eqattn.graphs", "eqattn.prefix_sums", "eqattn.mazes"),
    ("eqattn.cli",),
    ("eqattn.__main__",),
)
"""The floors, from the ground up (ARCHITECTURE.md): operators and the engine, solving, the
graph floor (beside the engine, on what it and solving give), the layers, the public API, the
training runtime, the tasks beside each other, the command."""


def _floor(module: str) -> tuple[int, str]:
    """The floor of `module` and the part of it that holds the module (its longest prefix)."""
    found = [
        (i, part)
        for i, parts in enumerate(FLOORS)
        for part in parts
        if module == part or module.startswith(part + ".")
    ]
    return max(found, key=lambda f: len(f[1]))


def arrows_up(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports of a higher floor, or of another part of the same floor (a task of another)."""
    return [
        (a, b)
        for a, bs in sorted(graph.items())
        for b in sorted(bs)
        if (_floor(b)[0], _floor(b)[1] != _floor(a)[1]) > (_floor(a)[0], False)
    ]


def test_every_import_goes_down_a_floor():
    """The training runtime imports no task, a task no other task, the library no command."""
    graph = import_graph()
    assert {m for m in graph if _floor(m)[1] == "eqattn"} == {"eqattn"}, "a module on no floor"
    assert arrows_up(graph) == []
    # the check can fail: the runtime reaching a task, a task reaching another, the graph
    # floor reaching the layers
    up = {
        "eqattn.train._trainer": {"eqattn.graphs"},
        "eqattn.text._task": {"eqattn.digits._data"},
        "eqattn._graph._shortest": {"eqattn.nn"},
    }
    assert arrows_up({**graph, **up}) == [
        ("eqattn._graph._shortest", "eqattn.nn"),
        ("eqattn.text._task", "eqattn.digits._data"),
        ("eqattn.train._trainer", "eqattn.graphs"),
    ]


def test_library_errors_name_parameters_not_options():
    """An error raised outside the command names a Python parameter (`dim`), never an option
    (`--dim`): the command maps the one to the other."""
    flagged = []
    for path in PACKAGE.rglob("*.py"):
        if "cli" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                text = ast.unparse(node.exc)
                if re.search(r"[\s'\"(`]--[a-z]", text):
                    flagged.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert flagged == []


def test_the_checker_sees_a_cycle():
    """The check above can fail: a cycle of three modules is found."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _owner(target: str) -> str | None:
    """The package whose private module `target` is (`eqattn._solve` for
    `eqattn._solve._named`), or None where `target` is a package's interface or a private module
    of eqattn's root, which every floor shares (`eqattn._errors`)."""
    parts = target.split(".")
    for i in range(2, len(parts)):
        if parts[i].startswith("_"):
            return ".".join(parts[:i])
    return None


def private_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports of another package's private module."""
    return [
        (a, b)
        for a, bs in sorted(graph.items())
        for b in sorted(bs)
        if (owner := _owner(b)) and not (a == owner or a.startswith(owner + "."))
    ]


def test_packages_meet_through_their_interfaces():
    """Nothing outside a package imports its private modules: `_solve`, `_attention`, `nn`,
    `train` and the tasks each declare their interface in their `__init__`."""
    assert private_imports(import_graph()) == []
    # the check can fail: a private module of another package is seen, one's own is not
    graph = {"eqattn.nn._layer": {"eqattn._solve._named", "eqattn._solve", "eqattn.nn._io"}}
    assert private_imports(graph) == [("eqattn.nn._layer", "eqattn._solve._named")]


def _engine_names(module: str) -> set[str]:
    """The names an eqattn module takes from the attention engine (`eqattn._attention`)."""
    path, names = _modules()[module], set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = _resolve(node.module or "", node.level, module, path.name == "__init__.py")
            if base.startswith("eqattn._attention"):
                names |= {f"{base}.{a.name}" for a in node.names}
    return names


def test_parallel_enters_the_engine_through_one_door():
    """Sequence parallelism composes the engine's pieces through `blockwise` only (and the
    public call, for its per-device share; `Tiling` for its signatures)."""
    door = {f"eqattn._attention.{n}" for n in ("blockwise", "Tiling", "attention_with_lse")}
    parallel = [m for m in _modules() if m.startswith("eqattn.parallel")]
    taken = set().union(*(_engine_names(m) for m in parallel))
    assert "eqattn._attention.blockwise" in taken and taken <= door, taken - door


def _python(root: str):
    return sorted((ROOT / root).rglob("*.py"))


@pytest.mark.parametrize(
    "root, limit", [("eqattn", 450), ("benchmarks", 450), ("tests", 500)], ids=str
)
def test_modules_and_functions_fit_a_reader(root, limit):
    too_long = []
    for path in _python(root):
        source = path.read_text()
        if len(source.splitlines()) > limit:
            too_long.append(f"{path.relative_to(ROOT)}: {len(source.splitlines())} lines")
        if root == "tests":
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > 80:
                    too_long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {length}")
    assert too_long == []
