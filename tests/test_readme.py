"""The Python examples of the README and of the documentation's pages run as written, the
Benchmarks page's tables are the committed results, and the figures of its summary come from
them."""

import json
import re
from pathlib import Path

import jax
import pytest

from .checks import DOCS_BLOCKS_RUN_BY_TESTS, python_blocks

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
BENCHMARKS_PAGE = ROOT / "docs" / "benchmarks.md"
PAGES = [README, *sorted((ROOT / "docs").glob("**/*.md"))]
BLOCKS = [
    (f"{page.relative_to(ROOT)}[python block {i}]", block)
    for page in PAGES
    for i, block in enumerate(python_blocks(page.read_text()))
]
"""Every Python block of the README and the docs pages, by name."""


def test_readme_has_examples():
    assert BLOCKS


def test_blocks_run_by_other_tests_are_run_there():
    """A block left to another test (it trains what that test goes on to check) is a block
    that exists, and that test runs it by name."""
    names = {name for name, _ in BLOCKS}
    for name, test_file in DOCS_BLOCKS_RUN_BY_TESTS.items():
        assert name in names and f'docs_block("{name}")' in (ROOT / test_file).read_text()


def test_the_docs_cite_test_files_that_exist():
    """A test file the README or a page names (`tests/...py`) is where it says: files move."""
    cited = {
        name for page in PAGES for name in re.findall(r"`(tests/[\w/]+\.py)`", page.read_text())
    }
    assert "tests/conftest.py" in cited
    assert sorted(name for name in cited if not (ROOT / name).is_file()) == []


RUN_HERE = [(name, block) for name, block in BLOCKS if name not in DOCS_BLOCKS_RUN_BY_TESTS]


@pytest.mark.parametrize("name, block", RUN_HERE, ids=[name for name, _ in RUN_HERE])
def test_readme_example_runs(name, block, request, monkeypatch):
    # as a reader runs them: JAX's default float32 (the suite switches float64 on elsewhere);
    # a block that reads `eqattn train`'s graph runs runs where the suite trained them once
    if "runs/graphs/" in block:
        monkeypatch.chdir(request.getfixturevalue("graph_runs"))
    with jax.enable_x64(False):
        exec(compile(block, name, "exec"), {})


def _hooks():
    import importlib.util

    spec = importlib.util.spec_from_file_location("hooks", ROOT / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks


def test_docs_render_maths_offline():
    """The site loads no script, style or font from the network, and its maths is MathML made
    when it is built: arithmatex's markup and a notebook's `$...$` become MathML's own elements,
    code is left alone, and a formula the converter cannot show fails the build."""
    pytest.importorskip("latex2mathml")
    config = (ROOT / "mkdocs.yml").read_text()
    assert "extra_javascript" not in config and "extra_css" not in config
    assert "font: false" in config
    hooks = _hooks()
    page = (
        '<p>A <span class="arithmatex">\\(\\tfrac{1}{2} x^\\top x &lt; b\\)</span> and</p>'
        '<div class="arithmatex">\\[\\sum_j p_j = 1\\]</div>'
    )
    out = hooks.render_maths(page, "page.md")
    assert "arithmatex" not in out and "\\" not in out
    assert '<math xmlns="http://www.w3.org/1998/Math/MathML" display="block">' in out
    assert "<mfrac>" in out and "<munder>" in out and "&#x0003C;" in out  # <, unescaped then re-set
    cell = (
        '<div class="jp-RenderedHTMLCommon jp-RenderedMarkdown" data-mime-type="text/markdown">'
        "<p>With $\\rho = 1/s$, $J = \\frac1d\n\\mathbf 1$ costs <code>$x$</code></p>"
        "<p>$$z^* = G x$$</p></div>"
    )
    out = hooks.render_maths(cell, "nb.ipynb", notebook=True)
    assert out.count("<math") == 3 and "<code>$x$</code>" in out
    assert "$" not in out.replace("<code>$x$</code>", "")
    assert hooks.render_maths(cell, "nb.ipynb") == cell  # not a notebook page: `$` is text
    for bad in ("x^", "\\foo x"):
        with pytest.raises(ValueError, match="nb.ipynb"):
            hooks.render_maths(cell.replace("1/s", bad), "nb.ipynb", notebook=True)


def test_benchmarks_page_tables_are_the_committed_results(capsys):
    """The documentation's Benchmarks page gets `python -m benchmarks.report`'s tables of the
    committed results files, figure for figure, with each one's source (the docs hook fills the
    page when the site is built; the README links to it)."""
    from benchmarks.report import main as report

    page = _hooks().on_page_markdown((ROOT / "docs" / "benchmarks.md").read_text(), page=None)
    report([])
    sections = capsys.readouterr().out.strip().split("### ")[1:]
    assert len(sections) >= 7
    for section in sections:
        header, table = section.split("\n", 1)
        assert header.split(" (--short")[0] in page, header
        assert table.strip() in page, header
    assert "Benchmarks page" in README.read_text()


def _results(name):
    return json.loads((ROOT / "benchmarks" / "results" / f"{name}.json").read_text())


def _derived_figures():
    """The Benchmarks page's figures that are arithmetic on the committed results rather than printed by
    `benchmarks.report`, computed from the files, as the page rounds them."""
    core, gpu = _results("core-cpu-cpu"), _results("core-gpu-nvidia-h100-80gb-hbm3")
    yield f"{core['bandwidth_gbps']:.1f}"  # GB/s of an elementwise pass
    for r in gpu["rows"]:  # "auto" (cuDNN) share of the bf16 matmul rate
        if r["n"] == 16384 and r["dtype"] == "bfloat16" and "auto" in r["impl"]:
            yield f"{100 * r['frac_matmul']:.0f}"
    for gpu_memory in ("memory-gpu-nvidia-h100-80gb-hbm3", "memory-gpu-nvidia-h200"):
        ms = {r["case"]: r["ms"] for r in _results(gpu_memory)["rows"] if r["part"] == "core-time"}
        yield f"{ms['eqattn-chunked'] / ms['xla-dense']:.1f}"  # chunked vs dense time, GPUs
    ms = {
        r["case"]: r["ms"] for r in _results("memory-cpu-cpu")["rows"] if r["part"] == "core-time"
    }
    yield f"{ms['eqattn-chunked'] / ms['xla-dense']:.2f}"  # chunked vs dense time, CPU
    for r in _results("memory-cpu-cpu")["rows"]:
        if r["part"] == "long-sequence":
            yield f"{r['step_s']:.0f}"  # the 16k-token step, seconds
    for r in _results("ring-cpu-cpu")["rows"]:
        if r.get("of_one_device") is not None:
            yield f"{100 * r['of_one_device']:.1f}"  # % of one device's memory
    yield f"{_results('deq-gpu-nvidia-h100-80gb-hbm3')['floor_ms']['P1 float32']:.2f}"  # H100
    for device in ("h100-80gb-hbm3", "h200"):  # the fused kernel's share of cuDNN's throughput
        ms = {  # bf16, n = m = 16384
            (r["mode"], r["impl"]): r["ms"]
            for r in _results(f"core-gpu-nvidia-{device}")["rows"]
            if r["n"] == 16384 and r["dtype"] == "bfloat16"
        }
        for mode in ("forward", "forward+backward"):
            yield f"{100 * ms[mode, 'cudnn'] / ms[mode, 'eqattn-pallas']:.0f}"
    yield from _table_tiling_ratios()
    text = _results("text-cpu-cpu")["rows"]
    memory = {(r["model"], r["context"]): r["temp_mb"] for r in text if r["part"] == "context"}
    for context in (256, 1024, 4096):  # the DEQ's step memory over the explicit model's
        yield f"{memory['deq', context] / memory['explicit', context]:.1f}"
    ms = {(r["prompt"], r["model"], r["mode"]): r["ms_per_token"] for r in text if "prompt" in r}
    for prompt in (256, 1024):  # cached generation, DEQ over explicit
        yield f"{ms[prompt, 'deq', 'cached'] / ms[prompt, 'explicit', 'cached']:.2f}"
    rows = {r["case"]: r["accuracy_mean"] for r in _results("training-cpu-cpu")["rows"]}
    defaults = next(v for k, v in rows.items() if k.startswith("eqattn train defaults"))
    for v in rows.values():  # points lost against the defaults
        yield f"{100 * (defaults - v):.1f}"
        yield f"{100 * (defaults - v):.0f}"
    short = _results("text-short-cpu-cpu")["rows"]
    ms = {(r["model"], r.get("batch")): r["ms_per_token"] for r in short if r.get("prompt") == 1024}
    for model in ("deq", "explicit"):  # generate(): a batch-64 step over one row's
        yield f"{ms[model, 64] / ms[model, 1]:.0f}"
    for r in _results("text_frontier-cpu-cpu")["rows"]:  # mean solver steps per test byte
        if r["part"] == "test-time":
            yield f"{r['mean_steps']:.1f}"


def _table_tiling_ratios():
    """The kernel sweeps' times of the tilings the H100 tile table now holds, against the
    defaults those sweeps ran with (each GPU's file)."""
    from eqattn._attention._pallas import _triton

    for path in sorted((ROOT / "benchmarks" / "results").glob("kernel-gpu-*.json")):
        for r in json.loads(path.read_text())["rows"]:
            table = _triton._H100[r["dtype"], r["d"]]
            kernels = ("forward",) if r["mode"] == "forward" else ("dkdv", "dq")
            held = all(_triton.Tile(**r[k]) == getattr(table, k) for k in kernels)
            if held and r["tiling"] != "default":
                yield f"{r['ratio_to_default']:.2f}"


# Figures in the summary that are not measurements: targets and problem sizes.
_NOT_MEASURED = set(
    "0.25 0.4 0.5 0.6 0.8 1.5 2 5 8 10 30 60 64 97.5 123 128 256 512 4096 16384 65,536".split()
)
# Each summary bullet (by its bold title's first word) and the suites its figures come from.
_SOURCES = {
    "Core": ("core",),
    "The": ("compile", "memory", "core", "kernel"),  # the fused kernel
    "Causal": ("causal",),
    "Chunked": ("memory",),
    "Implicit": ("memory",),
    "16k": ("memory",),
    "Ring": ("ring",),
    "P1": ("deq",),
    "DEQ": ("training",),
    "Text": ("text",),
    "Where": ("text_frontier",),
    "Graph": ("graphs_engine",),
    "Spanning": ("spanning",),
    "Prefix": ("reasoning",),
}


def _numbers(text):
    """The figures in `text` (a number glued to a unit other than "x", as in "16k", is a name)."""
    tokens = re.findall(r"(?<![\w.])(\d(?:[\d,.]*\d)?)([A-Za-z]*)", text)
    return [number for number, unit in tokens if unit in ("", "x")]


def _report_figures(capsys) -> dict[str, set[str]]:
    """Suite -> the figures `benchmarks.report` prints from its committed results."""
    from benchmarks.report import main as report

    report([])
    tables: dict[str, set[str]] = {}
    for part in capsys.readouterr().out.split("### ")[1:]:
        tables.setdefault(part.split(":")[0], set()).update(_numbers(part))
    return tables


def test_benchmarks_verdicts_come_from_the_results_they_name(capsys):
    """The Benchmarks page opens with one verdict table; each row's measured figures are ones
    that `benchmarks.report` prints from the results files the row names (or computed from
    them here), and each file it names is committed."""
    tables = _report_figures(capsys)
    derived = set(_derived_figures())
    text = BENCHMARKS_PAGE.read_text()
    verdicts = text[text.index("## Verdicts") : text.index("## Results")]
    rows = [line for line in verdicts.splitlines() if line.startswith("| ")][1:]
    assert len(rows) >= 15
    stale = {}
    for row in rows:
        target, device, measured, verdict, files = (c.strip() for c in row.strip("|").split("|"))
        names = [f.strip() for f in files.split(",")]
        for name in names:
            assert (ROOT / "benchmarks" / "results" / f"{name}.json").is_file(), name
        known = derived.union(*(tables.get(n.split("-")[0], set()) for n in names))
        stale.update({f: target for f in _numbers(measured) if f not in known})
        assert verdict.split()[0] in ("met", "missed"), row
    assert stale == {}, stale


def test_benchmarks_summary_figures_come_from_the_results(capsys):
    """Every figure of the Benchmarks page's notes ("What the targets come to") is one that
    `benchmarks.report` prints from that bullet's suites' committed results, one computed from
    those files here, or a target or problem size: a stale figure fails."""
    from benchmarks.report import main as report

    report([])
    tables = {}  # suite -> the figures its tables print
    for part in capsys.readouterr().out.split("### ")[1:]:
        tables.setdefault(part.split(":")[0], set()).update(_numbers(part))
    derived = set(_derived_figures()) | _NOT_MEASURED
    text = BENCHMARKS_PAGE.read_text()
    summary = text[text.index("What the targets come to:") :]
    bullets = summary.split("\n- **")[1:]
    assert [b.split()[0].rstrip("*") for b in bullets] == list(_SOURCES)
    stale = {}
    for bullet, suites in zip(bullets, _SOURCES.values()):
        known = derived.union(*(tables[s] for s in suites))
        stale.update({f: bullet.split("**")[0] for f in _numbers(bullet) if f not in known})
    assert stale == {}, stale
