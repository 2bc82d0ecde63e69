"""A real multi-process run: 2 Python processes with 2 CPU devices each, joined by
`jax.distributed.initialize` on a free localhost port, run a data-parallel `DEQTransformer`
training step and causal ring attention over all 4 devices and check them against a
one-device run (`tests/multiprocess_worker.py`). Bounded in time; the processes always end."""

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


def test_two_processes_match_one_device():
    pytest.importorskip("jax")
    address = f"127.0.0.1:{_free_port()}"
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.multiprocess_worker", address, str(i), str(PROCESSES)],
            cwd=ROOT,
            env=env,
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
    for i, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"process {i} exited with {p.returncode}:\n{out[-4000:]}"
        assert "ok training step on 4 devices" in out, out[-4000:]
        assert "ok ring attention on 4 devices" in out, out[-4000:]
