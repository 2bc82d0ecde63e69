"""The tree's shape: one direction of imports (no cycle; nothing outside `eqattn.cli` imports the
command), and the sizes a reader can hold (modules, functions, test files)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "eqattn"

# Import edges allowed although they close a cycle, each a deprecated alias that goes with its
# release: `eqattn.text.load_model` (the model of a text checkpoint) reaches `eqattn.train`.
DEPRECATED = {("eqattn.text", "eqattn.train")}


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
    allowed = {a: {b for b in bs if (a, b) not in DEPRECATED} for a, bs in graph.items()}
    assert _cycles(allowed) == []
    upward = [
        (a, b)
        for a, bs in graph.items()
        for b in bs
        if b.startswith("eqattn.cli") and not a.startswith(("eqattn.cli", "eqattn.__main__"))
    ]
    assert upward == []


def test_the_checker_sees_a_cycle_and_an_upward_import():
    """The checks above can fail: a cycle of three modules is found, and so is one through a
    deprecated alias when it is not allowed."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = import_graph()
    assert any("eqattn.text" in c for c in _cycles(graph)), "the deprecated alias's cycle"


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
