"""MkDocs hooks.

- The Benchmarks page gets its tables and plots from `benchmarks/results` when the site is built
  (the tables of `python -m benchmarks.report`, the plots of `python -m benchmarks.plot`).
- Maths is rendered when the site is built, to MathML (`latex2mathml`), which browsers draw
  natively: the site needs no script, font or network to show it. Arithmatex's spans (pages and
  docstrings) and the `$...$` / `$$...$$` of the notebooks' Markdown cells are converted; a formula
  the converter refuses fails the build, naming the page.
- The notebooks are executed by the build (mkdocs-jupyter) in their small setting, so their pages
  show this tree's outputs and figures; `EQATTN_DOCS_EXECUTE=false mkdocs serve` skips that.
"""

from __future__ import annotations

import html
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARK = "<!-- results: tables and plots from benchmarks/results (docs/hooks.py) -->"


def _benchmarks():
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks import plot, report

    return plot, report


def _results(report):
    """`(suite, path, payload)` of every full (not --quick) results file, in report order."""
    for suite in report.SUITES:
        for path in report.result_paths(report.RESULTS, suite):
            payload = json.loads(path.read_text())
            if not payload["suite"].endswith("-quick"):
                yield suite, path, payload


_ARITHMATEX = re.compile(r'<(span|div) class="arithmatex">(.*?)</\1>', re.S)
# a notebook's rendered Markdown cell (nbconvert leaves its maths as written)
_NOTEBOOK_MARKDOWN = re.compile(
    r'(<div class="[^"]*jp-RenderedMarkdown[^"]*"[^>]*>)(.*?)(</div>)', re.S
)
_CODE = re.compile(r"(<code.*?</code>|<pre.*?</pre>)", re.S)
# display maths, then inline maths (which may wrap a line, but not span a paragraph)
_DOLLARS = re.compile(r"\$\$(.+?)\$\$|(?<![\\$])\$((?:[^$\n]|\n(?!\n))+?)\$", re.S)


def mathml(tex: str, display: bool, where: str = "") -> str:
    """MathML for the TeX `tex` (HTML entities allowed, as in rendered pages)."""
    from latex2mathml.converter import convert

    tex = html.unescape(tex).strip()
    try:
        out = convert(tex, display="block" if display else "inline")
    except Exception as error:  # the converter raises several types; the build must say where
        raise ValueError(f"{where}: cannot render the formula {tex!r} ({error})") from error
    unknown = re.findall(r">(\\[A-Za-z]+)<", out)  # a command it does not know stays as text
    if unknown:
        raise ValueError(f"{where}: the formula {tex!r} uses {unknown}, which MathML cannot show")
    return out


def _arithmatex(match: re.Match, where: str) -> str:
    body = html.unescape(match.group(2)).strip()
    display = body.startswith("\\[")
    if not (body[:2] in ("\\(", "\\[") and body[-2:] in ("\\)", "\\]")):
        raise ValueError(f"{where}: unexpected arithmatex markup {body[:60]!r}")
    return mathml(body[2:-2], display, where)


def _dollars(text: str, where: str) -> str:
    """Convert `$$...$$` and `$...$` in `text`, leaving code and preformatted blocks alone."""
    parts = _CODE.split(text)
    for i in range(0, len(parts), 2):  # the even parts lie outside code
        parts[i] = _DOLLARS.sub(
            lambda m: mathml(m.group(1) or m.group(2), m.group(1) is not None, where), parts[i]
        )
    return "".join(parts)


def render_maths(output: str, where: str = "", notebook: bool = False) -> str:
    """`output` (a page's HTML) with every formula as MathML."""
    output = _ARITHMATEX.sub(lambda m: _arithmatex(m, where), output)
    if notebook:
        output = _NOTEBOOK_MARKDOWN.sub(
            lambda m: m.group(1) + _dollars(m.group(2), where) + m.group(3), output
        )
    return output


def on_config(config, **kwargs):
    # the notebooks run in their small setting with the test suite's fast-compile flag
    os.environ.setdefault("EQATTN_NOTEBOOK_SMALL", "1")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the same pages wherever they are built
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")
    return config


def on_post_page(output, page, **kwargs):
    src = page.file.src_uri
    return render_maths(output, where=src, notebook=src.endswith(".ipynb"))


def on_page_markdown(markdown, page, **kwargs):
    if MARK not in markdown:
        return markdown
    plot, report = _benchmarks()
    parts = []
    for suite, path, payload in _results(report):
        parts.append(
            f"### {suite}: {report.source_line(payload)}\n\n{report.table(suite, payload)}\n"
        )
        if plot.drawable(payload):
            # raw HTML: the plots are drawn into the built site (on_post_build), not the sources
            parts.append(f'<img src="../plots/{path.stem}.png" alt="{path.stem}" width="800">\n')
    return markdown.replace(MARK, "\n".join(parts))


def on_post_build(config, **kwargs):
    plot, report = _benchmarks()
    for _, path, _ in _results(report):
        plot.plot_file(path, Path(config["site_dir"]) / "plots")
