"""MkDocs hook: the Benchmarks page gets its tables and plots from `benchmarks/results` when the
site is built (the tables `python -m benchmarks.report` prints into the README, the plots of
`python -m benchmarks.plot`)."""

from __future__ import annotations

import json
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
    for suite in report.SECTIONS:
        for path in report.result_paths(report.RESULTS, suite):
            payload = json.loads(path.read_text())
            if not payload["suite"].endswith("-quick"):
                yield suite, path, payload


def on_page_markdown(markdown, page, **kwargs):
    if MARK not in markdown:
        return markdown
    plot, report = _benchmarks()
    parts = []
    for suite, path, payload in _results(report):
        parts.append(
            f"### {suite}: {report._source(payload)}\n\n{report.SECTIONS[suite](payload)}\n"
        )
        if plot.drawable(payload):
            # raw HTML: the plots are drawn into the built site (on_post_build), not the sources
            parts.append(f'<img src="../plots/{path.stem}.png" alt="{path.stem}" width="800">\n')
    return markdown.replace(MARK, "\n".join(parts))


def on_post_build(config, **kwargs):
    plot, report = _benchmarks()
    for _, path, _ in _results(report):
        plot.plot_file(path, Path(config["site_dir"]) / "plots")
