"""`python -m benchmarks SUITE --seeds S ...`: a seeded suite run a few seeds at a time adds
their rows to the suite's results file; a seed run again replaces only its own; a file of other
settings, an unseeded suite and bad seeds are refused before anything runs."""

import json
import sys
import types

import pytest

from benchmarks import _seeds, _side_by_side
from benchmarks.__main__ import main

SUITE = "seeded_for_a_test"


@pytest.fixture
def seeded(monkeypatch):
    """A seeded suite whose rows say which seed and which call made them (no JAX)."""
    calls = []
    module = types.ModuleType(f"benchmarks.{SUITE}")
    module.settings = lambda quick=False: {"size": 3, "quick": quick}  # type: ignore[attr-defined]

    def run(quick=False, seeds=None):
        calls.append(seeds)
        rows = [dict(part="size", seed=s, call=len(calls), n=n) for s in seeds for n in (1, 2)]
        return rows, {"settings": module.settings(quick), "seeds": list(seeds)}

    module.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return calls


def _run(tmp_path, seeds, started=("abc1234", "clean")):
    options = dict(quick=False, short=False, out=tmp_path, allow_dirty=True, started=started)
    _side_by_side.run_suite(SUITE, seeds=seeds, **options)
    (path,) = tmp_path.glob(f"{SUITE}-*.json")
    return json.loads(path.read_text())


def test_seeds_run_apart_add_up_and_a_seed_run_again_replaces_only_its_rows(
    seeded, tmp_path, capsys
):
    first = _run(tmp_path, (2,))
    assert first["seeds"] == [2] and [r["seed"] for r in first["rows"]] == [2, 2]
    assert first["seed_runs"] == {"2": {"git_commit": "abc1234", "tree": "clean",
                                        "date": first["date"]}}  # fmt: skip
    both = _run(tmp_path, (0, 1), started=("def5678", "clean"))
    assert both["seeds"] == [0, 1, 2] and [r["seed"] for r in both["rows"]] == [0, 0, 1, 1, 2, 2]
    assert both["rows"][-1]["call"] == 1  # seed 2's rows are the first run's, kept
    runs = both["seed_runs"]
    assert runs["2"]["git_commit"] == "abc1234" and runs["0"]["git_commit"] == "def5678"
    assert "added to 2 earlier seeds: the file holds seeds 0-2" in capsys.readouterr().out
    again = _run(tmp_path, (1,))
    assert [(r["seed"], r["call"]) for r in again["rows"]] == [
        (0, 2), (0, 2), (1, 3), (1, 3), (2, 1), (2, 1)
    ]  # fmt: skip
    assert (
        "added to 0, 2 earlier seeds; seeds 1 run again: the file holds seeds 0-2"
        in capsys.readouterr().out
    )
    day = {s: r["date"][:10] for s, r in again["seed_runs"].items()}
    assert _seeds.runs_line(again) == (
        f"seeds 0 (commit def5678, {day['0']}); 1, 2 (commit abc1234, {day['1']})"
    )
    assert _seeds.runs_line(first) is None  # one run: the file's own commit says it


def test_a_file_of_other_settings_is_refused_before_the_run(seeded, tmp_path):
    _run(tmp_path, (0,))
    (path,) = tmp_path.glob(f"{SUITE}-*.json")
    payload = json.loads(path.read_text())
    path.write_text(json.dumps({**payload, "settings": {"size": 4, "quick": False}}))
    with pytest.raises(SystemExit, match="holds a run of other settings"):
        _run(tmp_path, (1,))
    assert seeded == [(0,)]  # refused before the suite ran
    path.write_text("{not json")
    with pytest.raises(SystemExit, match="cannot read"):
        _run(tmp_path, (1,))


def test_seeds_are_refused_for_unseeded_suites_and_bad_seeds(tmp_path, capsys):
    for argv, message in [
        (["closure", "--seeds", "0"], "--seeds: closure cannot run seed by seed"),
        (["reasoning", "--seeds", "1", "1"], "--seeds must be distinct seeds >= 0; got 1 1"),
        (["reasoning", "--seeds", "-1"], "--seeds must be distinct seeds >= 0"),
    ]:
        with pytest.raises(SystemExit) as stopped:
            main([*argv, "--out", str(tmp_path)])
        assert stopped.value.code == 2 and message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
