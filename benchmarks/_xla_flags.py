"""XLA's quickest CPU compile settings, for what is compiled to run rather than to be timed (the
tests, `python -m benchmarks --quick`). Imports no JAX: the flags must be set before JAX starts.

LLVM's optimization level 0 compiles about a quarter faster; one LLVM module per program (no
parallel code generation, which on two cores only adds the work of splitting) about 15% faster
again; XLA's older CPU emitters for fusions (instead of the MLIR fusion emitters) about 40%
faster again (one test: 22.2 s -> 13.0 s). The code they make is slower, and rounds a little
differently (fusions evaluate some operations in another order): a trained model's figures can
move, so nothing documented is measured with them.
"""

from __future__ import annotations

import os
import subprocess
import sys

QUICKEST = (
    "--xla_backend_optimization_level=0 --xla_cpu_parallel_codegen_split_count=1 "
    "--xla_cpu_use_fusion_emitters=false"
)
_PROBED = "EQATTN_FAST_COMPILE"
"""The environment variable that holds the probe's answer for the processes started after it."""


def accepted(flags: str = QUICKEST) -> str:
    """`flags` less those this jaxlib's XLA does not know: it aborts at start-up on an unknown
    flag (jaxlib 0.11 has no `--xla_cpu_use_fusion_emitters`). Probed once, in a subprocess;
    processes started later inherit the answer."""
    known = os.environ.get(_PROBED)
    if known is not None:
        return known

    def ok(f):
        env = {**os.environ, "XLA_FLAGS": f, "JAX_PLATFORMS": "cpu"}
        probe = [sys.executable, "-c", "import jax; jax.devices('cpu')"]
        return subprocess.run(probe, env=env, capture_output=True).returncode == 0

    known = flags if ok(flags) else " ".join(f for f in flags.split() if ok(f))
    os.environ[_PROBED] = known
    return known


def use_quickest() -> str:
    """Add the accepted quickest flags to `XLA_FLAGS` (those not set there already); returns
    them. Call before JAX starts."""
    flags = accepted()
    current = os.environ.get("XLA_FLAGS", "")
    for flag in flags.split():
        if flag.split("=")[0] not in current:
            current += " " + flag
    os.environ["XLA_FLAGS"] = current.strip()
    return flags
