"""Compiling for accelerators this host does not have (deviceless ahead-of-time compilation), and
reading the compilers' own reports.

A target is an H100 (`jax[cuda12]`: Pallas -> Triton -> PTX -> ptxas for sm_90a) or a TPU
generation (`libtpu`: Mosaic's passes and LLO). One target per process: libtpu reads its flags
once, and ptxas's report reaches us through XLA's log, which is configured from the environment
at start-up; `environment(target)` is what such a process needs.

What is read, per kernel (a `pallas_call` named `eqattn_attention_*`):
- GPU: registers per thread, spill stores and loads, stack frame (ptxas's report), the launch grid,
  threads per block and dynamic shared memory (XLA's thunk sequence), the matrix-multiply
  instructions in its PTX (`wgmma` or `mma.sync`), and the blocks per SM that registers, shared
  memory and threads allow;
- TPU: scoped VMEM (`used_scoped_memory_configs` of the compiled custom call) against the
  generation's scoped-VMEM limit.
And per program: the compiled temporary memory (`memory_analysis()`) and the compile time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import jax

HERE = Path(__file__).parent


@dataclasses.dataclass(frozen=True)
class Target:
    """A device to compile for: `platform` "cuda" or "tpu", the topology's name, and for TPUs
    the scoped-VMEM limit the compiler enforces (bytes; the negative control reads it back from
    the compiler's own error)."""

    name: str
    platform: str
    topology: str
    vmem_limit: int | None = None
    description: str = ""
    ring_topology: str | None = None  # eight devices, for the ring attention programs


MiB = 1 << 20
TARGETS = {
    "h100": Target("h100", "cuda", "1x1x1", None, "NVIDIA H100 80GB HBM3 (SXM, sm_90a)", "1x1x8"),
    "v5e": Target("v5e", "tpu", "v5e:1x1", 16 * MiB, "TPU v5e", "v5e:2x4"),
    "v6e": Target("v6e", "tpu", "v6e:1x1", 32 * MiB, "TPU v6e"),
    "v5p": Target("v5p", "tpu", "v5p:1x1x1", 64 * MiB, "TPU v5p"),
    "v4": Target("v4", "tpu", "v4:1x1x1", 16 * MiB, "TPU v4"),
}
# H100 SXM: the device facts XLA's GPU compiler needs (a GpuTargetConfigProto's device part).
H100_SPEC = HERE / "targets" / "h100_sxm.txtpb"
# Per SM, for occupancy (sm_90): 64K registers, 228 KB of shared memory (1 KB of it reserved
# per block), 2048 threads, 32 blocks; registers are allocated per warp in units of 256.
_SM = dict(registers=65536, shared=233472, reserved=1024, threads=2048, blocks=32)


def environment(target: Target) -> dict[str, str]:
    """Environment variables a process compiling for `target` needs (set before jax starts)."""
    # The default backend stays the CPU: the target's plugin is used only for its topology.
    if target.platform == "cuda":
        # Without a GPU the CUDA plugin would stop at its driver checks; ptxas's report (its
        # registers and spills) is logged by XLA's subprocess_compilation at verbosity 2.
        return {
            "JAX_PLATFORMS": "cpu",
            "JAX_SKIP_CUDA_CONSTRAINTS_CHECK": "1",
            "TF_CPP_VMODULE": "subprocess_compilation=2",
            "TF_CPP_MIN_LOG_LEVEL": "0",
        }
    # No metadata server to ask; several compiling processes may load libtpu at once.
    return {"JAX_PLATFORMS": "cpu", "TPU_SKIP_MDS_QUERY": "1", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}


def topology_devices(target: Target, topology: str | None = None):
    """The devices of the target's topology (or of `topology`, e.g. eight of them), to build
    meshes and shardings on (no device is touched)."""
    from jax.experimental import topologies

    topology = target.topology if topology is None else topology
    if target.platform == "cuda":
        topo = topologies.get_topology_desc(
            platform="cuda",
            topology_name="",
            topology=topology,
            target_config=H100_SPEC.read_text(),
        )
    elif topology.endswith(("1x1", "1x1x1")):  # one chip: name the host's bounds
        topo = topologies.get_topology_desc(
            topology, platform="tpu", chips_per_host_bounds=[1, 1, 1]
        )
    else:
        topo = topologies.get_topology_desc(topology, platform="tpu")
    return topo.devices


def one_device_sharding(target: Target):
    """A sharding that places an array whole on the target's first device."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(topology_devices(target)[:1], ("devices",))
    return NamedSharding(mesh, PartitionSpec())


@contextlib.contextmanager
def _captured_stderr():
    """Everything written to file descriptor 2 (C++ logs included) while inside; the text is
    in the yielded list afterwards."""
    sys.stderr.flush()
    saved = os.dup(2)
    text: list[str] = []
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 2)
        try:
            yield text
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            text.append(f.read().decode(errors="replace"))


def placed(tree, sharding):
    """Every array leaf of `tree` as a `jax.ShapeDtypeStruct` placed by `sharding`."""
    return jax.tree.map(
        lambda a: (
            jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding) if hasattr(a, "shape") else a
        ),
        tree,
    )


def compile_program(target: Target, fn, args, inspect=None) -> dict:
    """Compile `jax.jit(fn)` for `args` (ShapeDtypeStructs placed on the target) and report.

    Returns `{"compiled": bool, "error": str?, "compile_s", "temp_bytes", "kernels": {name:
    {...}}}`, and `inspect(compiled HLO text)`'s entries; an error of the compiler (or a refusal
    by eqattn before it) is a result, not an exception."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as dump, _captured_stderr() as log:
        options = {"xla_dump_to": dump} if target.platform == "cuda" else {}
        try:
            compiled = jax.jit(fn).lower(*args).compile(compiler_options=options)
        except Exception as e:  # noqa: BLE001 -- the compiler's verdict is the result
            error = f"{type(e).__name__}: {e}"
            compiled = None
        compile_s = time.perf_counter() - t0
        kernels = _gpu_kernels(Path(dump)) if target.platform == "cuda" else {}
    if target.platform == "cuda":
        _merge_ptxas(kernels, log[0])
    if compiled is None:
        return {"compiled": False, "error": _short(error), "compile_s": compile_s}
    if target.platform == "tpu":
        kernels = _tpu_kernels(compiled.as_text(), target)
    memory = compiled.memory_analysis()
    extra = {} if inspect is None else inspect(compiled.as_text())
    return {
        "compiled": True,
        "compile_s": compile_s,
        "temp_bytes": int(memory.temp_size_in_bytes),
        "kernels": kernels,
        **extra,
    }


def _short(error: str, limit: int = 600) -> str:
    """The first lines of an error (XLA's can run to pages of HLO), and any later line that
    states a limit (Mosaic's comes after the HLO of the kernel that exceeded it)."""
    error = error.split("\n--------------------")[0].strip()
    if len(error) <= limit:
        return error
    limits = [line[:300] for line in error[limit:].splitlines() if re.search(r"\blimit\b", line)]
    return " ... ".join([error[:limit], *limits[:3]])


# --- GPU: PTX, thunk sequence and ptxas's log -----------------------------------------------

_ENTRY = re.compile(r"\.visible \.entry (\w+)\(")
_LAUNCH = re.compile(
    r"\] (eqattn_\w+) grid: \[(\d+), (\d+), (\d+)\] threads: \[(\d+), (\d+), (\d+)\]\s+"
    r"shared_memory: (\d+) bytes"
)


def _gpu_kernels(dump: Path) -> dict[str, dict]:
    """eqattn's kernels in a dump: their MMA instructions and launch."""
    kernels: dict[str, dict] = {}
    for ptx in dump.glob("*.ptx"):
        text = ptx.read_text(errors="replace")
        for name in _ENTRY.findall(text):
            if name.startswith("eqattn_"):
                wgmma, mma = text.count("wgmma.mma_async"), text.count("mma.sync")
                kind = "wgmma" if wgmma else ("mma.sync" if mma else "none")
                kernels[name] = {"mma": kind}
    for seq in dump.glob("*thunk_sequence.txt"):
        for m in _LAUNCH.finditer(seq.read_text(errors="replace")):
            name, grid, threads = m[1], [int(m[i]) for i in (2, 3, 4)], int(m[5])
            kernels.setdefault(name, {}).update(grid=grid, threads=threads, shared_bytes=int(m[8]))
    return kernels


_PTXAS_FN = re.compile(r"Compiling entry function '(\w+)'")
_PTXAS_FRAME = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_PTXAS_REGS = re.compile(r"Used (\d+) registers")


def _merge_ptxas(kernels: dict[str, dict], log: str) -> None:
    """Registers and spills from ptxas's report, into the kernels found in the dump."""
    name = None
    for line in log.splitlines():
        if m := _PTXAS_FN.search(line):
            name = m[1] if m[1] in kernels else None
        elif name and (m := _PTXAS_FRAME.search(line)):
            frame, stores, loads = map(int, m.groups())
            kernels[name].update(stack_bytes=frame, spill_stores=stores, spill_loads=loads)
        elif name and (m := _PTXAS_REGS.search(line)):
            kernels[name]["registers"] = int(m[1])
    for k in kernels.values():
        if "registers" in k and "threads" in k:
            k["blocks_per_sm"] = blocks_per_sm(k["registers"], k["threads"], k["shared_bytes"])


def blocks_per_sm(registers: int, threads: int, shared_bytes: int) -> int:
    """Resident blocks per H100 SM that registers, shared memory and threads allow."""
    warps = -(-threads // 32)
    per_warp = -(-registers * 32 // 256) * 256
    by_regs = _SM["registers"] // (per_warp * warps)
    by_smem = _SM["shared"] // (shared_bytes + _SM["reserved"])
    return min(by_regs, by_smem, _SM["threads"] // threads, _SM["blocks"])


# --- TPU: the compiled custom calls ------------------------------------------------------------

_CALL = re.compile(r"%(eqattn_\w+?)(?:\.\d+)? = ")
_USED = re.compile(r'used_scoped_memory_configs\\?"\s*:\s*\[([^\]]*)\]')
_SIZE = re.compile(r'size\\?"\s*:\s*\\?"(\d+)')


def _tpu_kernels(hlo: str, target: Target) -> dict[str, dict]:
    """eqattn's Mosaic kernels in compiled HLO: scoped VMEM used, against the limit."""
    kernels: dict[str, dict] = {}
    for line in hlo.splitlines():
        if "tpu_custom_call" not in line or not (m := _CALL.search(line)):
            continue
        used = _USED.search(line)
        vmem = sum(int(s) for s in _SIZE.findall(used[1])) if used else 0
        kernels[m[1]] = {"vmem_bytes": vmem, "vmem_limit": target.vmem_limit}
    return kernels
