"""`eqattn train --task prefix-sums` and `eqattn evaluate` as users run them: the DEQ and its
explicit twin of equal parameters trained side by side, scored against answers computed here
string by string in numpy; the settings checked with errors that name them."""

import dataclasses
import json
import re

import equinox as eqx
import jax
import numpy as np
import pytest

from eqattn import prefix_sums, train

from ..checks import run

pytestmark = pytest.mark.float32

TINY = ["--dim", "4", "--heads", "2", "--lengths", "2", "3", "--epochs", "1", "--epoch-steps",
        "3", "--test-lengths", "5", "9", "--test-strings", "6", "--no-progress"]  # fmt: skip


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A DEQ and its twin trained by the command (3 steps: the code path, not the learning;
    `tests/prefix_sums/test_prefix_sums.py` trains the recipe)."""
    from eqattn.cli import main

    out = tmp_path_factory.mktemp("prefix-sums")
    with jax.enable_x64(False):
        assert main(["train", "--task", "prefix-sums", *TINY, "--out", str(out)]) == 0
    return out


def test_the_command_trains_the_deq_and_its_twin_and_sets_them_side_by_side(pair, capsys):
    """Both runs are recorded with their shapes (the twin: as deep as the longest training
    string plus the steps with gradient, within 5% of the DEQ's parameters, its shape recorded
    so that the checkpoint rebuilds it), and `--model both` ends with both models' strings
    right at every test length."""
    metrics = {m: json.loads((pair / m / "metrics.json").read_text()) for m in ("deq", "explicit")}
    deq, twin = metrics["deq"], metrics["explicit"]
    assert deq["task"] == "prefix-sums" and deq["model_shape"] == {"dim": 4, "heads": 2}
    assert twin["config"]["depth"] == 3 + prefix_sums.EXTRA_STEPS == twin["model_shape"]["depth"]
    assert abs(twin["params"] - deq["params"]) <= 0.05 * deq["params"]
    assert deq["train_strings"] == 3 * 2 * 8 and deq["longer_bits"] == prefix_sums.LONGER * 3
    assert 0 <= deq["test_accuracy"] <= 1 and deq["test_converged"] == 1.0
    twin_model = prefix_sums.load_model(pair / "explicit")
    assert len(twin_model.core.steps) == 3 + prefix_sums.EXTRA_STEPS


def test_evaluate_scores_every_length_as_numpy_does(pair, capsys, tmp_path):
    """`eqattn evaluate`: per test length, the share of strings with every bit right equals the
    count made here from each string's own prediction against its numpy running parity; the DEQ
    also against the solver budget, ending at the rule `4 n + 100`."""
    out = tmp_path / "result.json"
    with jax.enable_x64(False):
        code, text, err = run(capsys, "evaluate", "--checkpoint", str(pair / "deq"), "--json",
                              str(out), "--no-progress")  # fmt: skip
    assert code == 0, err
    assert "prefix sums (deq model, trained on 2-3 bits)" in text and "against the budget" in text
    result = json.loads(out.read_text())
    model = prefix_sums.load_model(pair / "deq")
    assert [r["n"] for r in result["sizes"]] == [5, 9]
    for row in result["sizes"]:
        n = row["n"]
        bits = np.random.default_rng(10_000 + n).integers(0, 2, (6, n))
        with jax.enable_x64(False):
            answers = [
                np.argmax(np.asarray(model.predict(b, budget=4 * n + 100).logits), -1) for b in bits
            ]
        right = [np.array_equal(a, np.cumsum(b) % 2) for a, b in zip(answers, bits)]
        assert row["at_rule"]["strings"] == pytest.approx(np.mean(right))
        assert row["budget_rule"] == 4 * n + 100 == row["sweep"][-1]["max_steps"]


def test_the_settings_are_checked_and_the_twin_follows_the_training_lengths():
    config = prefix_sums.PrefixSumsConfig(lengths=(4, 10), train_steps=6)
    assert config.depth == 16
    assert prefix_sums.PrefixSumsConfig(train_steps=1).depth == 33  # not a solver's limit here
    for fields, message in [
        (dict(dim=30, heads=4), "`dim` (30) must be divisible by `heads` (4)"),
        (dict(lengths=()), "`lengths` must be string lengths >= 1; got []"),
        (dict(test_lengths=(0, 8)), "`test_lengths` must be string lengths >= 1"),
        (dict(test_strings=0), "`test_strings` must be >= 1"),
        (dict(train_steps=0), "`train_steps` must be >= 1"),  # steps beyond the length
    ]:
        with pytest.raises(train.ConfigError, match=re.escape(message)):
            prefix_sums.PrefixSumsConfig(**fields)
    with pytest.raises(ValueError, match="`lengths` must name at least one"):
        prefix_sums.draw_batch(np.random.default_rng(0), 2, ())
    # the untrained control (`train.initial_model`) is the twin the command trains: shaped by the
    # task's rule (here 12 channels, MLP ratio 5/3), not the generic one (13, 1.0: 8,810 params)
    twin = prefix_sums.PrefixSumsConfig(model="explicit", lengths=(2, 3))
    shaped = prefix_sums.PrefixSumsTask.with_shape(twin)
    start = train.initial_model(prefix_sums.PrefixSumsTask, twin)
    params = sum(a.size for a in jax.tree.leaves(eqx.filter(start, eqx.is_inexact_array)))
    assert params == train.count_params(prefix_sums.PrefixSumsTask.build_model, shaped) == 9050


def test_a_reasoning_suite_goes_on_from_the_runs_and_parts_its_work_folder_kept(
    pair, tmp_path, monkeypatch
):
    """`benchmarks.reasoning`'s seed run into a work folder that holds the command's finished
    runs: nothing trains again; run a second time, every part is read back (nothing scores),
    with the same rows, those of another commit marked; a folder of other settings is
    refused."""
    import shutil

    from benchmarks import _reasoning_parts
    from benchmarks.reasoning import PARTS

    config = dict(dim=4, heads=2, lengths=(2, 3), epochs=1, epoch_steps=3, test_lengths=(5, 9),
                  test_strings=6)  # the command's TINY  # fmt: skip
    settings = dict(config=config, sizes=(5,), count=4, paths_count=2, budgets=(2, 8))
    for model in ("deq", "explicit"):
        shutil.copytree(pair / model, tmp_path / "seed-0" / model)

    def refused(*args, **kwargs):
        raise AssertionError("ran again what the work folder holds")

    monkeypatch.setattr(train, "train", refused)
    monkeypatch.setattr(train, "resume", refused)
    with jax.enable_x64(False):
        rows, _ = _reasoning_parts.run(PARTS, settings, (0,), tmp_path)
        kept = sorted(p.name for p in (tmp_path / "seed-0").glob("*.json"))
        assert kept == ["n5-deq.json", "n5-explicit.json", "n5-paths.json", "n5-steps.json",
                        "n5-untrained.json", "settings.json"]  # fmt: skip
        parts = dataclasses.replace(PARTS, score=refused, score_steps=refused, paths=refused)
        again, _ = _reasoning_parts.run(parts, settings, (0,), tmp_path)
        # a part kept from another commit: its rows say which
        deq = tmp_path / "seed-0" / "n5-deq.json"
        deq.write_text(json.dumps({**json.loads(deq.read_text()), "git_commit": "an earlier"}))
        marked, _ = _reasoning_parts.run(parts, settings, (0,), tmp_path)
    assert again == rows and [r["budget"] for r in rows if r["part"] == "budget"] == [2, 8]
    assert [r.get("made_at") for r in marked if r["part"] == "size"] == ["an earlier"] + [None] * 4
    assert next(r for r in rows if r["part"] == "paths")["count"] == 2
    with pytest.raises(SystemExit, match="holds a run of other settings"):
        _reasoning_parts.run(parts, {**settings, "count": 5}, (0,), tmp_path)
