"""The command as its users expect it: options checked before anything loads, another task's
options refused, refusals that leave the file system as they found it, runs extended with
`--resume --epochs`, evaluation sweeps that stop once every solve converged, and the old
names of the Python API still working (with a warning)."""

import json
import os
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqattn
from eqattn.cli import main

pytest.importorskip("sklearn")
pytestmark = pytest.mark.float32
TINY = ["--train-size", "64", "--batch-size", "32", "--dim", "8", "--heads", "2", "--no-progress"]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err.strip()


def _usage_error(code, err, pattern):
    assert code == 2 and pattern in err and "\n" not in err and "--help)" in err, err


def test_options_are_checked_before_anything_loads(capsys, tmp_path):
    """No checkpoint exists: a usage error (exit 2) proves the option was refused before the
    checkpoint was read (a missing one is exit 1)."""
    missing = str(tmp_path / "nope")
    for argv, pattern in [
        (["--temperature", "-1"], "--temperature must be finite and >= 0"),
        (["--temperature", "nan"], "--temperature must be finite and >= 0"),
        (["--top-k", "0"], "--top-k must be in 1 .. 256"),
        (["--top-k", "1000"], "--top-k must be in 1 .. 256"),
        (["--tokens", "-1"], "--tokens must be >= 0"),
        (["--max-steps", "1"], "--max-steps must be >= 2"),
    ]:
        _usage_error(*run(capsys, "generate", "--checkpoint", missing, *argv)[::2], pattern)
    with pytest.raises(SystemExit) as exit_info:
        main(["evaluate", "--checkpoint", missing, "--steps", "0,4"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "solver budgets >= 1" in err and "--help)" in err
    with pytest.raises(SystemExit):
        main(["train", "--epochz", "3"])
    assert "eqattn train: error: unrecognized arguments" in capsys.readouterr().err


def test_another_tasks_options_are_refused(capsys, tmp_path):
    out = tmp_path / "run"
    for argv, pattern in [
        (["--context", "64"], "--context is not for --task digits"),
        (["--epoch-steps", "5", "--text", "x"], "--epoch-steps, --text are not for --task digits"),
        (["--task", "text", "--tokens", "patches"], "--tokens is not for --task text"),
        (["--task", "text", "--shift", "1"], "--shift is not for --task text"),
    ]:
        _usage_error(*run(capsys, "train", *argv, "--out", str(out))[::2], pattern)
    assert not out.exists()
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    help_text = capsys.readouterr().out
    assert "[text] positions per window" in help_text and "[digits] 8 rows" in help_text
    assert "0.003 for digits, 0.01 for text" in help_text  # --lr's defaults by task


def test_a_refused_run_leaves_the_file_system_as_it_found_it(capsys, tmp_path, monkeypatch):
    out = tmp_path / "new" / "run"
    code, _, err = run(capsys, "train", "--resume", "--out", str(out))
    assert code == 1 and "nothing to resume" in err and not (tmp_path / "new").exists()
    # a failure after the directory is locked, before anything is written
    import eqattn.train._api as api

    def broken(*args, **kwargs):
        raise eqattn.train.RunError("no trainer today")

    monkeypatch.setattr(api, "Trainer", broken)
    code, _, err = run(capsys, "train", *TINY, "--out", str(out))
    assert code == 1 and "no trainer today" in err and not (tmp_path / "new").exists()
    monkeypatch.undo()
    # a run's directory: refused, its lock file not rewritten
    assert run(capsys, "train", *TINY, "--epochs", "1", "--out", str(out))[0] == 0
    lock = out / ".eqattn.lock"
    before = (lock.read_bytes(), lock.stat().st_mtime_ns, sorted(os.listdir(out)))
    code, _, err = run(capsys, "train", *TINY, "--out", str(out))
    assert code == 1 and "holds a run" in err
    assert (lock.read_bytes(), lock.stat().st_mtime_ns, sorted(os.listdir(out))) == before


def test_resume_with_more_epochs_extends_a_finished_run(capsys, tmp_path):
    out = tmp_path / "run"
    assert run(capsys, "train", *TINY, "--epochs", "1", "--out", str(out))[0] == 0
    first = json.loads((out / "metrics.json").read_text())
    code, _, err = run(capsys, "train", "--resume", "--out", str(out))
    assert code == 1 and "is complete (1 epoch); nothing to resume (--epochs N above 1" in err
    _usage_error(*run(capsys, "train", "--resume", "--lr", "0.1", "--out", str(out))[::2], "--lr")
    code, _, err = run(capsys, "train", "--resume", "--epochs", "1", "--out", str(out))
    _usage_error(code, err, "--epochs (1) must be above the 1 epoch")
    code, printed, err = run(capsys, "train", "--resume", "--epochs", "3", "--out", str(out))
    assert code == 0, err
    assert "3 epochs in" in printed and "epoch 2/3" in printed and "epoch 1/" not in printed
    extended = json.loads((out / "metrics.json").read_text())
    assert extended["epochs_done"] == 3 and extended["train_config"]["epochs"] == 3
    assert extended["history"][0] == first["history"][0]  # the first epoch is the run's own
    split = extended["time_split_s"]  # every session counted, no part negative
    assert min(split.values()) >= 0 and split["total"] > first["time_split_s"]["total"]
    parts = ("startup_and_data", "compile", "training", "evaluation")
    assert sum(split[k] for k in parts) == pytest.approx(split["total"], rel=1e-6)
    assert split["training"] == pytest.approx(extended["train_time_s"])
    assert not (out / "best.eqx").exists()  # the digits have no validation split


def test_the_budget_sweep_stops_once_every_solve_converged(capsys, tmp_path):
    out = tmp_path / "run"
    argv = ["train", *TINY, "--epochs", "1", "--rtol", "0.1", "--out", str(out)]
    assert main(argv) == 0
    result = eqattn.train.evaluate(out, [1, 2, 30, 45, 60], progress=False)
    stop = result["sweep_converged_at"]
    rows = result["budget_sweep"]
    assert stop is not None and rows[-1]["max_steps"] == stop and rows[-1]["converged"] == 1.0
    assert all(row["converged"] < 1.0 for row in rows[:-1])
    # a budget past the stop gives the same results: nothing was lost by stopping
    later = eqattn.train.evaluate(out, [60], progress=False)["budget_sweep"][0]
    assert {k: v for k, v in later.items() if k != "max_steps"} == {
        k: v for k, v in rows[-1].items() if k != "max_steps"
    }
    lines = eqattn.train.task_of("digits").evaluation_report(result)
    assert lines[-1].startswith(f"(every solve converged within {stop} steps")


def test_the_old_names_still_work_with_a_warning(tmp_path):
    with pytest.warns(DeprecationWarning, match="eqattn.train.train"):
        from eqattn.cli import train  # noqa: F401
    with pytest.warns(DeprecationWarning, match="eqattn.train.load_model"):
        old = eqattn.cli.load_model
    assert old is eqattn.train.load_model
    fixture = Path(__file__).parent.parent / "fixtures" / "text-explicit-v1"
    with pytest.warns(DeprecationWarning, match=r"load_model\(path\).model"):
        model = eqattn.text.load_model(fixture)
    assert isinstance(model, eqattn.nn.Transformer)
    layer = eqattn.nn.Hopfield(8, 6, 2, key=jax.random.key(0))
    x, y = jnp.ones((3, 8)), jnp.ones((4, 6))
    with pytest.warns(DeprecationWarning, match="budget="):
        old_budget = layer.forward(x, y, max_steps=5)[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        eq = layer.forward(x, y, budget=5)[1]
    assert int(eq.steps) == int(old_budget.steps) <= 5
    with pytest.warns(DeprecationWarning, match="stats"):
        assert bool(eq.energy_rose) == bool(eq.stats["energy_rose"])
    with pytest.raises(TypeError, match="not also `max_steps`"):
        eqattn.fixed_point(lambda z, _: jnp.cos(z), jnp.zeros(()), budget=3, max_steps=3)
    np.testing.assert_array_equal(eq.converged, eq.result == eqattn.RESULTS.successful)
