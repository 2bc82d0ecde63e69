"""The benchmark runner works end to end at small sizes (timings are not checked here)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


@pytest.mark.slow
def test_quick_benchmarks_run(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "core", "deq", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    files = sorted(p.name for p in tmp_path.glob("*.json"))
    assert any(f.startswith("core-quick") for f in files) and any(
        f.startswith("deq-quick") for f in files
    )
    for path in tmp_path.glob("*.json"):
        payload = json.loads(path.read_text())
        assert payload["rows"] and payload["device"]["platform"] and payload["versions"]["jax"]
    deq = json.loads(next(tmp_path.glob("deq-quick*.json")).read_text())
    # every exact method agrees with the baseline's gradient
    for row in deq["rows"]:
        if "JacobianFree" not in row["method"]:
            assert row["grad_norm_rel_diff"] < 1e-3, row
