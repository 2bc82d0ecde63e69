"""Real multi-process runs: 2 Python processes with 2 CPU devices each, joined by `eqattn train
--coordinator` (`jax.distributed.initialize` on a free localhost port, gloo CPU collectives),
train, then run a float64 data-parallel `DEQTransformer` training step and causal ring attention
over all 4 devices (`tests/multiprocess_worker.py`); each checked against a one-process run. One
launch for all three (starting processes and joining them is much of the cost). Bounded in time;
the processes always end."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import FAST_COMPILE

ROOT = Path(__file__).parent.parent.parent
PROCESSES = 2
TIMEOUT_S = 150


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(devices: int) -> dict:
    env = dict(os.environ)
    # (the suite's fast-compile flag too: nothing here is timed)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE}"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _run_processes(argv_of, cwd) -> list[tuple[int, str]]:
    """Start PROCESSES processes (`argv_of(address, i)`), 2 CPU devices each, wait for all (at
    most TIMEOUT_S), kill any left; their (exit code, output)."""
    address = f"127.0.0.1:{_free_port()}"
    procs = [
        subprocess.Popen(
            argv_of(address, i),
            cwd=cwd,
            env=_env(2),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(PROCESSES)
    ]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=TIMEOUT_S)[0])
    except subprocess.TimeoutExpired:
        pytest.fail(f"the processes did not finish within {TIMEOUT_S} s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [(p.returncode, out) for p, out in zip(procs, outputs)]


@pytest.mark.slow
def test_two_processes_match_one(tmp_path):
    """One launch of 2 processes (4 devices): `eqattn train --coordinator ...` gives the losses,
    test accuracy and parameters of a one-process run, process 0 writes the run and reports,
    process 1 stays silent; then the same processes check a float64 data-parallel training step
    and causal ring attention against one device (`tests/multiprocess_worker.py`)."""
    args = [
        "--task",
        "digits",
        "--model",
        "deq",
        "--epochs",
        "2",
        "--train-size",
        "128",
        "--batch-size",
        "32",
    ]
    args += ["--no-progress"]
    results = _run_processes(
        lambda address, i: [
            *(
                sys.executable,
                "-m",
                "tests.parallel.multiprocess_worker",
                address,
                str(i),
                str(PROCESSES),
            ),
            *("--", *args, "--out", str(tmp_path / "two")),
        ],
        ROOT,
    )
    for i, (code, out) in enumerate(results):
        assert code == 0, f"process {i} exited with {code}:\n{out[-4000:]}"
        for check in ("eqattn train in 2 processes", "training step on 4", "ring attention on 4"):
            assert f"ok {check}" in out, out[-4000:]
    assert "test accuracy" in results[0][1]
    assert "test accuracy" not in results[1][1] and "checkpoint:" not in results[1][1]
    one = subprocess.run(
        [sys.executable, "-m", "eqattn", "train", *args, "--out", str(tmp_path / "one")],
        cwd=tmp_path,
        env=_env(1),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert one.returncode == 0, one.stderr[-4000:]
    two, ref = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("two", "one"))
    assert sorted(p.name for p in (tmp_path / "two").iterdir() if not p.name.startswith(".")) == [
        "checkpoint.eqx",
        "metrics.json",
    ]
    losses = [[h["loss"] for h in m["history"]] for m in (two, ref)]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    assert two["test_accuracy"] == ref["test_accuracy"]


def test_distributed_flags_errors(tmp_path, capsys):
    """Refused before anything starts (in this process: no distributed runtime is begun)."""
    from eqattn.cli import main

    base = ["train", "--out", str(tmp_path / "x")]
    for argv, message in [
        (["--coordinator", "127.0.0.1:1"], "go together"),
        (
            ["--coordinator", "x:1", "--num-processes", "2", "--process-id", "2"],
            "--process-id must be in 0 .. --num-processes - 1",
        ),
        (["--cluster", "--process-id", "0"], "--cluster"),
    ]:
        assert main([*base, *argv]) == 2, argv
        assert message in capsys.readouterr().err, argv
    assert not (tmp_path / "x").exists()
