"""`eqattn train --task mazes` and `eqattn evaluate` as users run them: the DEQ and its explicit
twin of equal parameters trained side by side, scored against answers checked here maze by maze
(each on its own graph; `test_data.py` checks the targets against networkx); the settings checked with errors
that name them."""

import json
import re

import jax
import numpy as np
import pytest

from eqattn import mazes, train

from ..checks import run

pytestmark = pytest.mark.float32

TINY = ["--dim", "8", "--heads", "2", "--sizes", "3", "4", "--epochs", "1", "--epoch-steps",
        "2", "--test-sizes", "5", "--compare-sizes", "4", "--test-mazes", "3",
        "--no-progress"]  # fmt: skip


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A DEQ and its twin trained by the command (2 steps: the code path, not the learning)."""
    from eqattn.cli import main

    out = tmp_path_factory.mktemp("mazes")
    with jax.enable_x64(False):
        assert main(["train", "--task", "mazes", *TINY, "--out", str(out)]) == 0
    return out


def test_the_command_trains_the_deq_and_its_twin_and_evaluate_scores_each_maze(
    pair, capsys, tmp_path
):
    """Both runs are recorded with their shapes (the twin as deep as `reach` of the largest
    training size, within 5% of the DEQ's parameters); `eqattn evaluate`'s share of mazes
    solved and of cells right at each size equal the counts made here maze by maze from the
    model's answer on the maze's own graph, and its budget sweep runs to the rule or stops where every solve
    converged."""
    metrics = {m: json.loads((pair / m / "metrics.json").read_text()) for m in ("deq", "explicit")}
    deq, twin = metrics["deq"], metrics["explicit"]
    assert deq["task"] == "mazes" and deq["model_shape"] == {"dim": 8, "heads": 2}
    assert twin["config"]["depth"] == mazes.reach(4) == twin["model_shape"]["depth"]
    assert abs(twin["params"] - deq["params"]) <= 0.05 * deq["params"]
    assert deq["train_mazes"] == 2 * 2 * 8 and deq["longer_size"] == mazes.longer_size(4) == 11
    assert 0 <= deq["test_accuracy"] <= 1 and deq["test_converged"] == 1.0
    assert len(mazes.load_model(pair / "explicit").core.steps) == mazes.reach(4)

    out = tmp_path / "result.json"
    with jax.enable_x64(False):
        code, text, err = run(capsys, "evaluate", "--checkpoint", str(pair / "deq"), "--json",
                              str(out), "--no-progress")  # fmt: skip
    assert code == 0, err
    assert "mazes (deq model, trained on 3-4 cells a side)" in text and "4 k^2 + 100" in text
    (row,) = json.loads(out.read_text())["sizes"]
    model = mazes.load_model(pair / "deq")
    test = mazes.draw_mazes(np.random.default_rng(10_000 + 5), 3, 5)
    cells = []  # each maze's cells, right or not
    for inputs, passages, targets in zip(test.inputs, test.passages, test.targets):
        with jax.enable_x64(False):
            p = model.predict(inputs, mazes.maze_graph(passages, 5), budget=mazes.budget_for(5))
        cells.append(np.argmax(np.asarray(p.logits), -1) == targets)
    assert row["n"] == 5 and row["at_rule"]["mazes"] == pytest.approx(np.mean(np.all(cells, 1)))
    assert row["at_rule"]["cells"] == pytest.approx(np.mean(cells))
    assert row["budget_rule"] == mazes.budget_for(5) == 200
    sweep = row["sweep"]
    assert [s["max_steps"] for s in sweep] == [25, 50, 100, 200][: len(sweep)]
    assert len(sweep) == 4 or sweep[-1]["converged"] == 1.0


def test_the_side_by_side_scores_the_compared_sizes_only(pair):
    """What `eqattn train` prints after both runs: each model's share of mazes solved at
    `compare_sizes` (here 4; the test sizes, 5, are `eqattn evaluate`'s), as scored here."""
    runs = {m: pair / m for m in ("deq", "explicit")}
    with jax.enable_x64(False):
        lines = mazes.MazesTask.comparison(runs)
        solved = {
            m: mazes.score(mazes.load_model(r), mazes.draw_mazes(np.random.default_rng(10_004),
                           3, 4), budget=mazes.budget_for(4))["mazes"]
            for m, r in runs.items()
        }  # fmt: skip
    assert lines[0].startswith("trained on mazes of 3-4 cells a side") and len(lines) == 2
    label = mazes.MazesTask.size_label(4)
    assert lines[1] == f"{label}: deq {solved['deq']:.2%}, explicit {solved['explicit']:.2%}"


@pytest.mark.bad_input
def test_the_settings_are_checked():
    assert mazes.MazesConfig(sizes=(3, 4), train_steps=2).depth == mazes.reach(4) + 2
    for fields, message in [
        (dict(dim=30, heads=4), "`dim` (30) must be divisible by `heads` (4)"),
        (dict(sizes=()), "`sizes` must be maze sizes >= 2; got []"),
        (dict(test_sizes=(1, 8)), "`test_sizes` must be maze sizes >= 2"),
        (dict(compare_sizes=()), "`compare_sizes` must be maze sizes >= 2; got []"),
        (dict(test_mazes=0), "`test_mazes` must be >= 1"),
        (dict(train_steps=-1), "`train_steps` must be >= 0"),
        (dict(penalty=-1.0), "`penalty` must be finite and >= 0"),
        (dict(warm=float("nan")), "`warm` must be finite and >= 0"),
    ]:
        with pytest.raises(train.ConfigError, match=re.escape(message)):
            mazes.MazesConfig(**fields)
    # a depth at which no twin has the DEQ's parameters: refused naming it, before training
    tiny = mazes.MazesConfig(model="explicit", dim=4, heads=2, sizes=(3, 4))
    with pytest.raises(train.ConfigError, match="no explicit model of 12 steps"):
        mazes.MazesTask.with_shape(tiny)
