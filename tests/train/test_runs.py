"""`eqattn train` never loses a run: refusing to replace one, locking, checksummed checkpoints,
atomic writes, and resuming after SIGKILL to the very model an uninterrupted run ends with."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..conftest import FAST_COMPILE

pytest.importorskip("sklearn")
pytest.importorskip("tqdm")

from eqattn.cli import main  # noqa: E402

ROOT = Path(__file__).parent.parent.parent
TINY = [
    "--task", "digits", "--model", "deq", "--train-size", "64", "--batch-size", "32", "--dim", "8", "--heads", "2", "--no-progress",
    "--max-steps", "6", "--epochs", "3",
]  # fmt: skip


def _env(**extra):
    """The command lines' environment, read when they start: it then holds the run's shared
    compilation cache (set by a session fixture, after this module is imported)."""
    return {
        **os.environ,
        "XLA_FLAGS": FAST_COMPILE,
        "PYTHONPATH": str(ROOT),
        "JAX_PLATFORMS": "cpu",
        **extra,
    }


def _train(out, *extra, failpoint=None, timeout=180):
    env = _env(**({"EQATTN_FAILPOINT": failpoint} if failpoint else {}))
    return subprocess.run(
        [sys.executable, "-m", "eqattn", "train", *extra, "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def _model_bytes(out):
    return (Path(out) / "checkpoint.eqx").read_bytes().split(b"\n", 1)[1]


def _one_line(err):
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run."""
    out = tmp_path_factory.mktemp("uninterrupted")
    result = _train(out, *TINY)
    assert result.returncode == 0, result.stderr
    return out


def _killed_leaves_the_last_epoch(out):
    """What a kill left: a loadable last-good checkpoint (of epoch 1) and a valid metrics.json."""
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["epochs_done"] == 1 and metrics["status"] == "running"
    assert main(["evaluate", "--checkpoint", str(out), "--steps", "2"]) == 0


@pytest.mark.slow
def test_sigkill_then_resume_ends_where_an_uninterrupted_run_does(reference, tmp_path):
    """Killed mid-epoch, then its resumption killed mid-checkpoint-write, then that one's
    mid-metrics-write (each kill in the second epoch): each leaves the last good epoch; a plain
    rerun refuses to replace the run; the last resumption ends with the uninterrupted run's
    model, history and accuracy, and no temporary file."""
    killed = _train(tmp_path, *TINY, failpoint="step:2:1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    _killed_leaves_the_last_epoch(tmp_path)
    again = _train(tmp_path, *TINY)
    assert again.returncode == 1 and "holds a run" in _one_line(again.stderr)
    for write in ("checkpoint.eqx", "metrics.json"):
        killed = _train(tmp_path, "--resume", failpoint=f"write:{write}")
        assert killed.returncode == -signal.SIGKILL, (write, killed.stderr)
        _killed_leaves_the_last_epoch(tmp_path)
    resumed = _train(tmp_path, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert _model_bytes(tmp_path) == _model_bytes(reference)
    final, ref = (json.loads((d / "metrics.json").read_text()) for d in (tmp_path, reference))
    assert final["status"] == "done" and final["epochs_done"] == 3
    assert final["test_accuracy"] == ref["test_accuracy"]
    assert [h["loss"] for h in final["history"]] == [h["loss"] for h in ref["history"]]
    assert not [p.name for p in tmp_path.iterdir() if "tmp" in p.name]  # no temp file survives


def _refused(capsys, *argv):
    """`(exit code, the one line of stderr)` of an `eqattn train` refused before training (in
    this process: no start-up to pay)."""
    code = main(["train", *argv])
    return code, _one_line(capsys.readouterr().err)


def test_overwrite_moves_the_old_run_aside_and_resume_of_a_finished_run(
    reference, tmp_path, capsys
):
    out = tmp_path / "run"
    out.mkdir()
    for name in ("checkpoint.eqx", "metrics.json"):
        (out / name).write_bytes((reference / name).read_bytes())
    code, line = _refused(capsys, "--resume", "--out", str(out))
    assert code == 1 and "complete" in line
    fresh = _train(out, *TINY[:-2], "--epochs", "1", "--overwrite")
    assert fresh.returncode == 0, fresh.stderr
    (moved,) = out.glob("replaced-*")
    assert (moved / "checkpoint.eqx").read_bytes() == (reference / "checkpoint.eqx").read_bytes()
    assert json.loads((out / "metrics.json").read_text())["epochs_done"] == 1
    code, line = _refused(capsys, "--overwrite", "--resume", "--out", str(out))
    assert code == 2 and "exclude each other" in line
    code, line = _refused(capsys, "--resume", "--out", str(tmp_path / "empty"))
    assert code == 1 and "nothing to resume" in line


@contextlib.contextmanager
def _started(argv, env=None):
    """`eqattn train ARGV` started in the background; killed on the way out if still running."""
    process = subprocess.Popen(
        [sys.executable, "-m", "eqattn", "train", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or _env(),
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=30)


def _wait_for(path: Path, process, poll: float = 0.2) -> None:
    """Until `path` exists (the running `process` must not end first; 120 s at most)."""
    deadline = time.monotonic() + 120
    while not path.exists() and time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        time.sleep(poll)


def test_a_locked_run_refuses_a_second_and_ctrl_c_keeps_its_checkpoint(tmp_path, capsys):
    """A second `eqattn train` into a directory in use exits at once, moving nothing; Ctrl-C
    (SIGINT) then ends the first with its model saved, metrics marked `interrupted` and a
    one-line hint to resume it."""
    with _started([*TINY[:-2], "--epochs", "10000", "--out", str(tmp_path)]) as first:
        _wait_for(tmp_path / "checkpoint.eqx", first)
        t0 = time.monotonic()
        second = _train(tmp_path, *TINY, "--overwrite", timeout=60)
        assert second.returncode == 1
        assert f"in use by another eqattn train (PID {first.pid})" in _one_line(second.stderr)
        assert time.monotonic() - t0 < 30  # it did not wait for the lock
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=60)
    assert not list(tmp_path.glob("replaced-*"))  # the refused run moved nothing
    assert first.returncode == 130, err
    assert "interrupted in epoch" in err and "Traceback" not in err, err
    assert f"(eqattn train --resume --out {tmp_path} continues it)" in err, err
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["status"] == "interrupted" and metrics["epochs_done"] >= 1
    code = main(["evaluate", "--checkpoint", str(tmp_path), "--steps", "4"])
    out = capsys.readouterr().out
    assert code == 0
    assert f"test accuracy {100 * metrics['test_accuracy']:.2f}%" in out


def test_ctrl_c_while_starting_exits_130_with_one_line(tmp_path):
    """SIGINT while the command is still importing eqattn (JAX's start-up: its first seconds):
    the entry point that stands before the package says so in one line, exit status 130, no
    traceback."""
    entry = "import _eqattn_command; _eqattn_command.run()"
    process = subprocess.Popen(
        [sys.executable, "-c", entry, "train", "--out", str(tmp_path / "run")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    time.sleep(0.3)  # Python has started, eqattn is not imported yet
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert err == "eqattn: interrupted while starting\n", err
    assert not (tmp_path / "run").exists()


def test_ctrl_c_while_compiling_exits_130_with_one_line_and_leaves_nothing(tmp_path):
    """SIGINT a second after the run has locked its directory (while the step compiles): exit
    status 130, one line, no crash on the way out (the interpreter's teardown used to end in a
    segmentation fault; Ctrl-C landing in a garbage-collection callback was lost, and the run
    went on), and no file of the run written."""
    out = tmp_path / "pair"
    # XLA's own settings, no compilation cache: compiling runs on XLA's threads, as for users
    env = {k: v for k, v in _env().items() if k not in ("XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR")}
    with _started(["--model", "both", "--out", str(out)], env) as first:
        _wait_for(out / "deq" / ".eqattn.lock", first, poll=0.05)
        time.sleep(1.0)  # into the step's compilation
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=60)
    assert first.returncode == 130, err
    assert _one_line(err).startswith("eqattn train: interrupted"), err
    assert not [p.name for p in out.rglob("*") if p.is_file()]  # the lock file is gone too


@pytest.mark.parametrize("damage", ["overwrite", "truncate", "append"])
def test_damaged_checkpoints_are_refused(reference, tmp_path, capsys, damage):
    data = bytearray((reference / "checkpoint.eqx").read_bytes())
    if damage == "overwrite":  # bytes overwritten in place: same size, plausible content
        data[-40:-20] = bytes(20)
    elif damage == "truncate":
        data = data[: len(data) - 100]
    else:
        data += b"\0"
    path = tmp_path / "checkpoint.eqx"
    path.write_bytes(bytes(data))
    code = main(["evaluate", "--checkpoint", str(path)])
    _, err = capsys.readouterr()
    assert code == 1 and "corrupt" in _one_line(err) and str(path) in err


BAD_OPTIONS = [
    (["train", "--task", "digits", "--lr", "nan"], "--lr must be finite and > 0"),
    (["train", "--task", "digits", "--lr", "-1"], "--lr must be finite and > 0"),
    (["train", "--task", "digits", "--lr", "inf"], "--lr must be finite and > 0"),
    (["train", "--task", "digits", "--epochs", "0"], "--epochs must be >= 1"),
    (
        ["train", "--task", "digits", "--weight-decay", "inf"],
        "--weight-decay must be finite and >= 0",
    ),
    (["train", "--task", "digits", "--clip", "nan"], "--clip must be finite and >= 0"),
    (["train", "--task", "digits", "--rtol", "nan"], "--rtol must be finite and > 0"),
    (["train", "--task", "digits", "--dropout", "1"], "--dropout must be in [0, 1)"),
    (["train", "--task", "digits", "--dim", "x"], "invalid int value: 'x'"),
    (["train", "--task", "digits", "--overwrite", "--resume"], "exclude each other"),
    (["retrieve", "--betas", "nan"], "every --betas value must be finite and > 0"),
    (["retrieve", "--betas", "0,1"], "every --betas value must be finite and > 0"),
    (["retrieve", "--amount", "inf", "--corruption", "noise"], "--amount must be finite"),
    (["retrieve", "--steps", "0"], "--steps must be >= 1"),
]


@pytest.mark.parametrize(
    "argv,pattern", BAD_OPTIONS, ids=lambda x: " ".join(x) if isinstance(x, list) else None
)
def test_bad_option_values_are_usage_errors(argv, pattern, capsys, tmp_path):
    """One line on stderr, no traceback, exit status 2 (as argparse gives)."""
    try:
        code = main([*argv, "--out", str(tmp_path / "out")])
    except SystemExit as e:  # argparse's own checks
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and pattern in _one_line(err), (code, err)


def test_failures_exit_1_and_debug_shows_the_traceback(reference, tmp_path, capsys):
    cases = [
        (["evaluate", "--checkpoint", str(tmp_path / "missing.eqx")], "checkpoint not found"),
        (["evaluate", "--checkpoint", str(tmp_path)], "checkpoint not found"),
    ]
    garbage = tmp_path / "garbage.eqx"
    garbage.write_bytes(b"{}\n" + bytes(64))
    cases.append((["evaluate", "--checkpoint", str(garbage)], "not an eqattn checkpoint"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cases.append((["train", *TINY, "--out", str(blocker / "run")], "cannot write"))
    cases.append((["retrieve", "--out", str(blocker / "run")], "cannot write"))
    if os.geteuid() != 0:  # root reads any file
        unreadable = tmp_path / "unreadable.eqx"
        unreadable.write_bytes((reference / "checkpoint.eqx").read_bytes())
        unreadable.chmod(0)
        cases.append((["evaluate", "--checkpoint", str(unreadable)], "not an eqattn checkpoint"))
    for argv, pattern in cases:
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 1 and pattern in _one_line(err), (argv, err)
    shown = subprocess.run(
        [sys.executable, "-m", "eqattn", "--debug", "evaluate", "--checkpoint", "missing.eqx"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert shown.returncode == 1 and "Traceback" in shown.stderr and "RunError" in shown.stderr
    via_env = subprocess.run(
        [sys.executable, "-m", "eqattn", "evaluate", "--checkpoint", "missing.eqx"],
        capture_output=True,
        text=True,
        env=_env(EQATTN_DEBUG="1"),
        timeout=120,
    )
    assert "Traceback" in via_env.stderr


def test_plain_lines_off_a_terminal_and_the_wall_time_split(tmp_path):
    result = _train(tmp_path, *TINY[:-2], "--epochs", "2")  # stdout is a pipe here
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:2]] == ["epoch 1/2", "epoch 2/2"]
    assert "test accuracy" in lines[0] and "\r" not in result.stderr  # no progress bar
    split = json.loads((tmp_path / "metrics.json").read_text())["time_split_s"]
    parts = split["startup_and_data"] + split["compile"] + split["training"] + split["evaluation"]
    assert all(v >= 0 for v in split.values()) and abs(parts - split["total"]) < 1e-6
    assert any(line.startswith("wall time ") for line in lines)
    # each epoch's line splits its seconds: training (the run's training time in all) and the
    # evaluation after it (the last one's includes the test set's)
    times = [re.search(r"\((\S+) s training, (\S+) s evaluation\)$", line) for line in lines[:2]]
    train_s, eval_s = (sum(float(m[i]) for m in times) for i in (1, 2))
    assert abs(train_s - split["training"]) <= 0.1 and 0 < eval_s <= split["evaluation"] + 0.1
