"""The command as its users expect it: options checked before anything loads, each task's own
options, library errors named by the options that set them, refusals that leave the file system
as they found it, runs extended or refused by `--resume`, evaluation sweeps that stop once every
solve converged."""

import json
import os

import pytest

import eqattn
from eqattn.cli import main

from ..checks import DIGITS, run as _run

pytest.importorskip("sklearn")
pytestmark = pytest.mark.float32
TINY = DIGITS


def run(capsys, *argv):
    code, out, err = _run(capsys, *argv)
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


def test_each_task_takes_its_own_options(capsys, tmp_path):
    """`eqattn train --task NAME` has that task's settings alone, with that task's defaults in
    its help; another task's option is not one of them."""
    out = tmp_path / "run"
    for argv in (["--context", "64"], ["--task", "digits", "--epoch-steps", "5"]):
        with pytest.raises(SystemExit) as exit_info:
            main(["train", *argv, "--out", str(out)])
        err = capsys.readouterr().err.strip()
        assert exit_info.value.code == 2 and f"unrecognized arguments: {argv[-2]}" in err, err
    assert not out.exists()
    helps = {}
    for task in ("graphs", "digits", "text"):
        with pytest.raises(SystemExit):
            main(["train", "--task", task, "--help"])
        helps[task] = " ".join(capsys.readouterr().out.split())  # as one line
    assert "--context" in helps["text"] and "--context" not in helps["digits"] + helps["graphs"]
    assert "--tokens" in helps["digits"] and "--tokens" not in helps["text"] + helps["graphs"]
    assert "--families" in helps["graphs"] and "--families" not in helps["text"]
    assert "--epoch-steps" not in helps["digits"]  # its epochs are passes over the data
    # each task's own default, stated once per option
    assert "peak learning rate (warm-up, cosine decay) (default: 0.003)" in helps["digits"]
    assert "peak learning rate (warm-up, cosine decay) (default: 0.01)" in helps["text"]
    assert "capped at --max-steps (default: 40)" in helps["graphs"]
    # the default task: the graphs
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert " ".join(capsys.readouterr().out.split()) == helps["graphs"]


def test_a_pairs_folder_is_not_a_checkpoint(capsys, tmp_path):
    """`eqattn train` writes the DEQ's and the twin's runs into one folder: evaluating the folder
    names the runs in it."""
    for model in ("deq", "explicit"):
        assert (
            main(
                ["train", *TINY, "--model", model, "--epochs", "1", "--out", str(tmp_path / model)]
            )
            == 0
        )
    capsys.readouterr()
    code = main(["evaluate", "--checkpoint", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert (
        code == 1
        and f"holds the runs deq, explicit: name one of them (--checkpoint '{tmp_path / 'deq'}')"
        in err
    ), err


def test_library_errors_name_parameters_the_command_names_options(capsys, tmp_path):
    """The library's error names the Python parameter; the command's, the option that sets it."""
    from eqattn import digits, graphs

    with pytest.raises(digits.ConfigError, match=r"^`dim` \(30\) must be divisible by `heads`"):
        digits.DigitsConfig(dim=30, heads=4)
    argv = ["train", "--task", "digits", "--dim", "30", "--heads", "4", "--out", str(tmp_path)]
    _usage_error(*run(capsys, *argv)[::2], "--dim (30) must be divisible by --heads (4)")
    with pytest.raises(TypeError, match="heads"):  # the graph task has no attention heads
        graphs.GraphConfig(heads=4)
    with pytest.raises(graphs.ConfigError, match=r"`graph_sizes` must be two sizes"):
        graphs.GraphConfig(graph_sizes=(8, 4))
    code, _, err = run(capsys, "train", "--graph-sizes", "8", "4", "--out", str(tmp_path))
    _usage_error(code, err, "--graph-sizes must be two sizes 2 <= low <= high; got 8, 4")
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--families", "path", "moon", "--out", str(tmp_path)])
    assert exit_info.value.code == 2 and "invalid choice: 'moon'" in capsys.readouterr().err
    with pytest.raises(graphs.ConfigError, match="`families` must be each of path, .*; got moon"):
        graphs.GraphConfig(families=("moon",))


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
    # a finished run leaves no lock file; a run refused on its directory adds none
    assert run(capsys, "train", *TINY, "--epochs", "1", "--out", str(out))[0] == 0
    before = sorted(os.listdir(out))
    assert ".eqattn.lock" not in before and "checkpoint.eqx" in before
    code, _, err = run(capsys, "train", *TINY, "--out", str(out))
    assert code == 1 and "holds a run" in err
    assert sorted(os.listdir(out)) == before


def test_resume_with_more_epochs_extends_a_finished_run(capsys, tmp_path):
    out = tmp_path / "run"
    assert run(capsys, "train", *TINY, "--epochs", "1", "--out", str(out))[0] == 0
    first = json.loads((out / "metrics.json").read_text())
    code, _, err = run(capsys, "train", "--resume", "--out", str(out))
    assert code == 1 and "is complete (1 epoch); nothing to resume (--epochs above 1" in err
    _usage_error(*run(capsys, "train", "--resume", "--lr", "0.1", "--out", str(out))[::2], "--lr")
    # the run's own settings, repeated, are no change: the run goes on as it would without them
    lr = str(first["config"]["lr"])
    code, _, err = run(capsys, "train", "--resume", "--lr", lr, "--epochs", "1", "--out", str(out))
    _usage_error(code, err, "--epochs (1) must be above the 1 epoch")  # got past the settings
    for argv, wanted in (
        (["--task", "text"], "--task text"),
        (["--model", "explicit"], "--model explicit"),
    ):
        code, _, err = run(capsys, "train", "--resume", *argv, "--out", str(out))
        _usage_error(code, err, f"--resume continues the deq digits run in '{out}': not {wanted}")
    code, _, err = run(capsys, "train", "--resume", "--epochs", "1", "--out", str(out))
    _usage_error(code, err, "--epochs (1) must be above the 1 epoch")
    code, printed, err = run(capsys, "train", "--resume", "--epochs", "3", "--out", str(out))
    assert code == 0, err
    assert "3 epochs in" in printed and "epoch 2/3" in printed and "epoch 1/" not in printed
    extended = json.loads((out / "metrics.json").read_text())
    assert extended["epochs_done"] == 3 and extended["config"]["epochs"] == 3
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
    result = eqattn.train.evaluate(
        out, eqattn.digits.DigitsTask, [1, 2, 30, 45, 60], progress=False
    )
    stop = result["sweep_converged_at"]
    rows = result["budget_sweep"]
    assert stop is not None and rows[-1]["max_steps"] == stop and rows[-1]["converged"] == 1.0
    assert all(row["converged"] < 1.0 for row in rows[:-1])
    # a budget past the stop gives the same results: nothing was lost by stopping
    later = eqattn.train.evaluate(out, eqattn.digits.DigitsTask, [60], progress=False)
    later = later["budget_sweep"][0]
    assert {k: v for k, v in later.items() if k != "max_steps"} == {
        k: v for k, v in rows[-1].items() if k != "max_steps"
    }
    lines = eqattn.digits.DigitsTask.evaluation_report(result)
    assert lines[-1].startswith(f"(every solve converged within {stop} steps")


def test_a_bar_that_is_off_leaves_tqdm_auto_alone(monkeypatch):
    """A bar that is off (in a notebook, `progress=False`) never imports `tqdm.auto`, which in a
    Jupyter kernel without ipywidgets warns as it is imported; a bar shown does."""
    import sys

    from eqattn.train import progress_bar

    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # any import of it fails
    with progress_bar(3, "x", False) as bar:
        bar.update(3)
    with pytest.raises(ImportError):
        progress_bar(3, "x", True)
