"""`eqattn train` never loses a run: refusing to replace one, locking, checksummed checkpoints,
atomic writes, and resuming after SIGKILL to the very model an uninterrupted run ends with."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("sklearn")
pytest.importorskip("tqdm")

from eqattn.cli import main  # noqa: E402

ROOT = Path(__file__).parent.parent
TINY = [
    "--train-size", "64", "--batch-size", "32", "--dim", "8", "--heads", "2", "--no-progress",
    "--max-steps", "6", "--epochs", "3",
]  # fmt: skip
ENV = {
    **os.environ,
    "XLA_FLAGS": "--xla_backend_optimization_level=0",
    "PYTHONPATH": str(ROOT),
    "JAX_PLATFORMS": "cpu",
}


def _train(out, *extra, failpoint=None, timeout=180):
    env = {**ENV, **({"EQATTN_FAILPOINT": failpoint} if failpoint else {})}
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


@pytest.mark.slow
@pytest.mark.parametrize(
    "failpoint",
    ["step:2:1", "write:checkpoint.eqx@2", "write:metrics.json@2"],
    ids=["mid-epoch", "mid-checkpoint-write", "mid-metrics-write"],
)
def test_sigkill_then_resume_ends_where_an_uninterrupted_run_does(reference, tmp_path, failpoint):
    killed = _train(tmp_path, *TINY, failpoint=failpoint)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # what the kill left: a loadable last-good checkpoint and a valid metrics.json
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["epochs_done"] == 1 and metrics["status"] == "running"
    code = main(["evaluate", "--checkpoint", str(tmp_path), "--steps", "2"])
    assert code == 0
    # a plain rerun refuses to replace it
    again = _train(tmp_path, *TINY)
    assert again.returncode == 1 and "holds a run" in _one_line(again.stderr)
    resumed = _train(tmp_path, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert _model_bytes(tmp_path) == _model_bytes(reference)
    final, ref = (json.loads((d / "metrics.json").read_text()) for d in (tmp_path, reference))
    assert final["status"] == "done" and final["epochs_done"] == 3
    assert final["test_accuracy"] == ref["test_accuracy"]
    assert [h["loss"] for h in final["history"]] == [h["loss"] for h in ref["history"]]
    assert not [p.name for p in tmp_path.iterdir() if "tmp" in p.name]  # no temp file survives


def test_overwrite_moves_the_old_run_aside_and_resume_of_a_finished_run(reference, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    for name in ("checkpoint.eqx", "metrics.json"):
        (out / name).write_bytes((reference / name).read_bytes())
    done = _train(out, "--resume")
    assert done.returncode == 1 and "complete" in _one_line(done.stderr)
    fresh = _train(out, *TINY[:-2], "--epochs", "1", "--overwrite")
    assert fresh.returncode == 0, fresh.stderr
    (moved,) = out.glob("replaced-*")
    assert (moved / "checkpoint.eqx").read_bytes() == (reference / "checkpoint.eqx").read_bytes()
    assert json.loads((out / "metrics.json").read_text())["epochs_done"] == 1
    both = _train(out, "--overwrite", "--resume")
    assert both.returncode == 1 and "exclude each other" in _one_line(both.stderr)
    nothing = _train(tmp_path / "empty", "--resume")
    assert nothing.returncode == 1 and "nothing to resume" in _one_line(nothing.stderr)


def test_a_second_run_into_a_locked_directory_exits_at_once(tmp_path):
    first = subprocess.Popen(
        [sys.executable, "-m", "eqattn", "train", *TINY[:-2], "--epochs", "10000"]
        + ["--out", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "checkpoint.eqx").exists() and time.monotonic() < deadline:
            assert first.poll() is None, first.communicate()
            time.sleep(0.2)
        t0 = time.monotonic()
        second = _train(tmp_path, *TINY, "--overwrite", timeout=60)
        assert second.returncode == 1
        assert f"in use by another eqattn train (PID {first.pid})" in _one_line(second.stderr)
        assert time.monotonic() - t0 < 30  # it did not wait for the lock
    finally:
        first.kill()
        first.communicate(timeout=30)
    assert not list(tmp_path.glob("replaced-*"))  # the refused run moved nothing


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
