"""Real multi-process runs: 2 Python processes with 2 CPU devices each, joined by
`jax.distributed.initialize` on a free localhost port (gloo CPU collectives), run a data-parallel
`DEQTransformer` training step and causal ring attention over all 4 devices
(`tests/multiprocess_worker.py`), and `eqattn train` with `--coordinator`; each checked against a
one-process run. Bounded in time; the processes always end."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PROCESSES = 2
TIMEOUT_S = 150


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(devices: int) -> dict:
    env = dict(os.environ)
    # (the suite's fast-compile flag too: nothing here is timed)
    env["XLA_FLAGS"] = (
        f"--xla_force_host_platform_device_count={devices} --xla_backend_optimization_level=0"
    )
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


def test_two_processes_match_one_device():
    results = _run_processes(
        lambda address, i: [
            sys.executable,
            "-m",
            "tests.multiprocess_worker",
            address,
            str(i),
            str(PROCESSES),
        ],
        ROOT,
    )
    for i, (code, out) in enumerate(results):
        assert code == 0, f"process {i} exited with {code}:\n{out[-4000:]}"
        assert "ok training step on 4 devices" in out, out[-4000:]
        assert "ok ring attention on 4 devices" in out, out[-4000:]


@pytest.mark.slow
def test_eqattn_train_in_two_processes_matches_one(tmp_path):
    """`eqattn train --coordinator ...` in 2 processes (4 devices): the same losses and test
    accuracy as one process; process 0 writes the run and reports, process 1 stays silent."""
    args = ["train", "--epochs", "2", "--train-size", "128", "--batch-size", "32", "--no-progress"]
    eqattn = [sys.executable, "-m", "eqattn"]
    results = _run_processes(
        lambda address, i: [
            *eqattn,
            *args,
            "--out",
            str(tmp_path / "two"),
            "--coordinator",
            address,
            "--num-processes",
            str(PROCESSES),
            "--process-id",
            str(i),
        ],
        tmp_path,
    )
    for i, (code, out) in enumerate(results):
        assert code == 0, f"process {i} exited with {code}:\n{out[-4000:]}"
    assert "test accuracy" in results[0][1]
    assert "test accuracy" not in results[1][1] and "checkpoint:" not in results[1][1]
    one = subprocess.run(
        [*eqattn, *args, "--out", str(tmp_path / "one")],
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
