"""The digits task through the `eqattn` command at tiny sizes: outputs, files, errors, the DEQ's
training levers, retrieval."""

import hashlib
import importlib.metadata
import json
import os

import jax
import numpy as np
import pytest

import eqattn

pytest.importorskip("sklearn")
pytest.importorskip("tqdm")

from eqattn import digits  # noqa: E402
from eqattn.cli import main  # noqa: E402
from eqattn.digits._task import shift_images  # noqa: E402

from ..checks import DIGITS, run  # noqa: E402

# The command runs in JAX's default float32 for its users (the suite's default is float64).
pytestmark = pytest.mark.float32
TINY = DIGITS


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("deq")
    with jax.enable_x64(False):  # a module fixture runs outside the tests' float32 marker
        code = main(["train", *TINY, "--epochs", "2", "--max-steps", "8", "--out", str(out)])
    assert code == 0
    return out


def test_train_writes_checkpoint_and_metrics(trained):
    metrics = json.loads((trained / "metrics.json").read_text())
    assert metrics["status"] == "done" and metrics["epochs_done"] == 2
    assert [h["epoch"] for h in metrics["history"]] == [1, 2]
    assert 0 <= metrics["test_accuracy"] <= 1 and metrics["test_examples"] == 359
    assert 1 <= metrics["test_mean_solver_steps"] <= 8
    assert metrics["params"] > 0 and metrics["step_temp_memory_mb"] > 0
    assert metrics["config"]["max_steps"] == 8 and metrics["task"] == "digits"
    # the training budget of 10 (the default) capped at the step limit of 8
    assert all(h["solver_steps"] <= 8 for h in metrics["history"])
    header = json.loads((trained / "checkpoint.eqx").read_bytes().split(b"\n", 1)[0])
    assert header["format"] == "eqattn-checkpoint-3" and header["epoch"] == 2
    assert header["task"] == "digits" and header["config"] == metrics["config"]
    payload = (trained / "checkpoint.eqx").read_bytes().split(b"\n", 1)[1]
    assert header["sha256"] == hashlib.sha256(payload).hexdigest()


def test_evaluate_reproduces_accuracy(trained, capsys, tmp_path):
    metrics = json.loads((trained / "metrics.json").read_text())
    out_json = tmp_path / "eval.json"
    code, out, err = run(
        capsys,
        "evaluate",
        "--checkpoint",
        str(trained),
        "--steps",
        "1,4,16",
        "--json",
        str(out_json),
    )
    assert code == 0, err
    result = json.loads(out_json.read_text())
    assert result["test_accuracy"] == pytest.approx(metrics["test_accuracy"])
    assert f"test accuracy {100 * metrics['test_accuracy']:.2f}%" in out
    sweep = result["budget_sweep"]
    assert [r["max_steps"] for r in sweep] == [1, 4, 16]  # 16 > the trained limit of 8
    assert sweep[0]["mean_steps"] == 1 and sweep[0]["converged"] == 0
    assert sweep[-1]["mean_relative_residual"] < sweep[0]["mean_relative_residual"]
    assert len(result["solver_steps"]["per_example"]) == result["test_examples"]


def test_explicit_baseline_matches_parameters(trained, capsys, tmp_path):
    code, out, err = run(
        capsys, "train", *TINY, "--model", "explicit", "--epochs", "1", "--out", str(tmp_path)
    )
    assert code == 0, err
    assert out.splitlines()[0].startswith("epoch 1/1: loss")  # plain lines off a terminal
    assert any(line.startswith("explicit: test accuracy") for line in out.splitlines())
    deq = json.loads((trained / "metrics.json").read_text())["params"]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert abs(metrics["params"] - deq) <= 0.05 * deq
    # the shape built is recorded (its width was 20% short of the DEQ's parameters before)
    assert (metrics["config"]["width"], metrics["config"]["mlp_ratio"]) == (4, 3.25)
    code, out, _ = run(capsys, "evaluate", "--checkpoint", str(tmp_path / "checkpoint.eqx"))
    assert code == 0 and "explicit model" in out and "max steps" not in out
    # an explicit model has no solver budget to sweep: refused, not silently ignored
    code, _, err = run(capsys, "evaluate", "--checkpoint", str(tmp_path), "--steps", "4")
    assert code == 2 and "--steps are a DEQ's" in err and "explicit model" in err, err


@pytest.mark.parametrize("dim, heads", [(64, 4), (32, 4), (16, 2), (8, 2)])
def test_explicit_digits_model_has_the_deqs_parameters_within_5_percent(dim, heads):
    """Counted from the leaves of the models as built (their shapes: nothing is initialised).
    At every one of these settings the width alone (MLP ratio 2) missed by 10% to 20%."""
    from ..reference import built_model, parameter_count

    count = lambda config: parameter_count(built_model(digits.DigitsTask, config))  # noqa: E731
    deq = count(digits.DigitsConfig(dim=dim, heads=heads))
    assert deq > 8 * dim * dim  # one block: attention 4 d^2, MLP 4 d^2
    explicit = digits.DigitsConfig(model="explicit", dim=dim, heads=heads)
    assert abs(count(explicit) - deq) <= 0.05 * deq


def _one_line_error(code, err, expected_code, pattern):
    assert code == expected_code
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert pattern in err, err


def test_errors_are_one_line(trained, capsys, tmp_path):
    code, _, err = run(capsys, "evaluate", "--checkpoint", str(tmp_path / "nope.eqx"))
    _one_line_error(code, err, 1, "checkpoint not found")

    garbage = tmp_path / "garbage.eqx"
    garbage.write_bytes(os.urandom(256))
    code, _, err = run(capsys, "evaluate", "--checkpoint", str(garbage))
    _one_line_error(code, err, 1, "not an eqattn checkpoint")

    truncated = tmp_path / "truncated.eqx"
    truncated.write_bytes((trained / "checkpoint.eqx").read_bytes()[:-100])
    code, _, err = run(capsys, "evaluate", "--checkpoint", str(truncated))
    _one_line_error(code, err, 1, "is corrupt")

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, _, err = run(capsys, "train", *TINY, "--out", str(blocker / "run"))
    _one_line_error(code, err, 1, "cannot write to output directory")

    code, _, err = run(capsys, "train", "--task", "digits", "--dim", "10", "--heads", "4")
    _one_line_error(code, err, 2, "--dim (10) must be divisible by --heads (4)")

    code, _, err = run(capsys, "train", *TINY, "--train-size", "0", "--out", str(tmp_path / "z"))
    _one_line_error(code, err, 2, "--train-size must be >= 1; got 0")
    assert not (tmp_path / "z").exists()  # refused before anything is written
    with pytest.raises(digits.ConfigError, match=r"^`train_size` must be >= 1; got 0$"):
        digits.DigitsConfig(train_size=0)  # the Python API names the parameter

    for argv, pattern in [
        (["train", "--epochz", "3"], "unrecognized arguments: --epochz"),
        (["train", "--solver", "newton"], "invalid choice: 'newton'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["retrieve", "--betas", "1,x"], "expected numbers"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        _one_line_error(exit_info.value.code, capsys.readouterr().err, 2, pattern)


def test_training_levers(capsys, tmp_path):
    # The DEQ levers of `eqattn train` run end to end; one optimizer step is a valid run.
    levers = [
        "--warm-start",
        "--train-steps",
        "4",
        "--jacobian-weight",
        "0.5",
        "--jacobian-share",
        "0.5",
        "--solver",
        "picard",
        "--backward-solver",
        "picard",
        "--backward-steps",
        "3",
    ]
    code, out, err = run(
        capsys, "train", *TINY, "--epochs", "2", *levers, "--out", str(tmp_path / "a")
    )
    assert code == 0, err
    config = json.loads((tmp_path / "a" / "metrics.json").read_text())["config"]
    metrics = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert config["warm_start"] and config["train_steps"] == 4 and config["backward_steps"] == 3
    assert config["jacobian_share"] == 0.5
    assert all(h["solver_steps"] <= 4 for h in metrics["history"])
    # Broyden with the shared inverse, in a run of one optimizer step (8 images, one batch)
    code, out, err = run(
        capsys, "train", "--task", "digits", "--model", "deq", "--train-size", "8", "--epochs", "1",
        "--dim", "8",
        "--heads", "2", "--no-progress", "--adjoint", "shared-inverse", "--solver", "broyden",
        "--out", str(tmp_path / "one-step"),
    )  # fmt: skip
    assert code == 0, err
    assert len(json.loads((tmp_path / "one-step" / "metrics.json").read_text())["history"]) == 1
    # the phantom gradient through 2 half-damped steps, recorded for the checkpoint's rebuild
    code, out, err = run(
        capsys, "train", "--task", "digits", "--model", "deq", "--train-size", "8", "--epochs", "1",
        "--dim", "8",
        "--heads", "2", "--no-progress", "--adjoint", "phantom", "--phantom-steps", "2",
        "--phantom-damping", "0.5", "--out", str(tmp_path / "phantom"),
    )  # fmt: skip
    assert code == 0, err
    saved = json.loads((tmp_path / "phantom" / "metrics.json").read_text())["config"]
    config = digits.DigitsConfig.from_dict(saved)
    assert config.deq_adjoint() == eqattn.Phantom(steps=2, damping=0.5)
    # fixed-point correction: the training budget of 5 in pieces of 3 and 2 steps
    code, out, err = run(
        capsys, "train", *TINY, "--epochs", "1", "--train-steps", "5", "--corrections", "2",
        "--out", str(tmp_path / "corrected"),
    )  # fmt: skip
    assert code == 0, err
    metrics = json.loads((tmp_path / "corrected" / "metrics.json").read_text())
    assert metrics["config"]["corrections"] == 2
    assert 2 <= metrics["history"][0]["solver_steps"] <= 5
    for argv, pattern in [
        (["--corrections", "-1"], "--corrections must be >= 0"),
        (["--correction-decay", "0"], "--correction-decay must be in (0, 1]; got 0.0"),
        (["--corrections", "3", "--train-steps", "5"], "needs a training budget of at least 6"),
        (["--train-steps", "1"], "--train-steps must be >= 2 (a budget of 1 evaluates"),
        (["--max-steps", "1"], "--max-steps must be >= 2 (a budget of 1 evaluates"),
        (["--jacobian-weight", "-1"], "--jacobian-weight must be finite and >= 0"),
        (["--jacobian-share", "0"], "--jacobian-share must be in (0, 1]"),
        (["--backward-steps", "0"], "--backward-steps must be >= 1"),
        (["--phantom-steps", "0"], "--phantom-steps must be >= 1"),
        (["--phantom-damping", "1.5"], "--phantom-damping must be in (0, 1]"),
    ]:
        code, _, err = run(capsys, "train", *TINY, *argv, "--out", str(tmp_path / "c"))
        _one_line_error(code, err, 2, pattern)


def test_retrieve(capsys, tmp_path):
    code, out, err = run(
        capsys, "retrieve", "--patterns", "60", "--betas", "1,64", "--out", str(tmp_path)
    )
    assert code == 0, err
    report = json.loads((tmp_path / "retrieval.json").read_text())
    acc = {r["beta"]: r["pattern_accuracy"] for r in report["rows"]}
    assert acc[64.0] > acc[1.0] + 0.3  # single patterns at large beta, averages at small
    assert f"{100 * acc[64.0]:.1f}%" in out
    assert (tmp_path / "retrieval.png").stat().st_size > 1000
    code, _, err = run(capsys, "retrieve", "--patterns", "0", "--out", str(tmp_path))
    _one_line_error(code, err, 2, "--patterns must be in [1,")
    with pytest.raises(digits.ConfigError, match="^`patterns` must be in"):
        digits.retrieve(tmp_path, patterns=0)


def test_info(capsys):
    code, out, _ = run(capsys, "info")
    assert code == 0
    assert f"jax           {importlib.metadata.version('jax')}" in out
    assert "device        cpu:0" in out


def test_console_script_entry_point():
    scripts = importlib.metadata.entry_points(group="console_scripts", name="eqattn")
    assert [ep.value for ep in scripts] == ["_eqattn_command:run"]


def test_shift_images():
    images = np.zeros((500, 8, 8), np.float32)
    images[:, 4, 3] = 1.0
    shifted = shift_images(images, 1, np.random.default_rng(0))
    assert shifted.shape == images.shape and np.all(shifted.sum((1, 2)) == 1)
    rows, cols = np.nonzero(shifted)[1:]
    assert set(rows) == {3, 4, 5} and set(cols) == {2, 3, 4}
    np.testing.assert_array_equal(shift_images(images, 0, np.random.default_rng(0)), images)
