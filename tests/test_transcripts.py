"""The transcripts of the README and the guides are what the commands print: the quick ones are
re-run here (`python docs/transcripts.py`; `--full` runs every one, before docs are committed),
and the checker catches a changed figure."""

from pathlib import Path

import pytest

from .checks import transcripts as _checker
from .conftest import README_RUN

ROOT = Path(__file__).parent.parent


def test_the_checker_sees_a_changed_figure_and_not_a_duration():
    t = _checker()
    printed = ["epoch 1/2: loss 0.52 (1.3 s training)", "noise", "deq: test accuracy 96.94%", "end"]
    same = t.match(
        ["epoch 1/2: loss 0.52 (2.0 s training)", "...", "deq: test accuracy 96.94%"], printed
    )
    assert all(t.timeless(want) == t.timeless(got) for want, got in same)  # durations may differ
    changed = t.match(["...", "deq: test accuracy 97.21%", "end"], printed)
    assert changed[0] == ("deq: test accuracy 97.21%", "deq: test accuracy 96.94%")
    assert t.timeless(changed[0][0]) != t.timeless(changed[0][1])  # a figure: reported
    # a line that is not printed any more, and one printed in its place (its words changed)
    assert t.match(["epoch 1/2: loss 0.52 (1.3 s training)", "gone"], printed)[1] == ("gone", None)
    assert t.match(["x", "noise"], ["y", "noise"]) == [("x", "y"), ("noise", "noise")]


@pytest.mark.slow
def test_the_quick_transcripts_are_what_the_commands_print(capsys, graph_runs):
    t = _checker()
    quick = [p for p in t.PAGES for tr in t.transcripts(p) if not tr.full]
    assert quick and ROOT / "README.md" in quick  # the README's first run is checked here
    # the suite's shared run of it is the README's first transcript's command: its output
    # stands in for a second run
    first = t.transcripts(ROOT / "README.md")[0]
    assert [c.line for c in first.commands] == [README_RUN]
    printed = (graph_runs / "printed.txt").read_text().splitlines()
    code = t.main([], printed_by={README_RUN: printed})
    assert code == 0, capsys.readouterr().err
