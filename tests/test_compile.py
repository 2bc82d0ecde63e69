"""The compile suite's machinery (`benchmarks/compile.py`, `_deviceless.py`, `_sweep.py`) and the
tile tables it chose; the deviceless compilation itself runs in CI's compile check, which needs
the CUDA and TPU compilers (`pip install -e ".[compile]"`)."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax import export

import eqattn
from benchmarks import _deviceless, _sweep, compile as suite
from eqattn._attention._pallas import _mosaic, _triton

RESULTS = Path(__file__).parent.parent / "benchmarks" / "results"


def _sweep_rows(target):
    return json.loads((RESULTS / f"compile-sweep-{target}.json").read_text())["rows"]


def _spills_everywhere(rows, key, kernel) -> bool:
    """Whether every tile of the sweep spills `kernel`'s registers (or fails to compile) with
    or without a mask."""
    tiles: dict = {}
    for r in rows:
        if (r["dtype"], r["d"], r["pass"]) == (*key, _sweep.KERNELS[kernel]):
            k = r["kernels"].get(f"eqattn_attention_{kernel}", {}) if r["compiled"] else {}
            bad = k.get("spill_stores", 1) > 0 or k.get("spill_loads", 1) > 0
            tiles[json.dumps(r["tile"])] = tiles.get(json.dumps(r["tile"]), False) or bad
    return bool(tiles) and all(tiles.values())


def test_triton_table_is_the_sweeps_choice():
    # The H100 table in `_triton` is what the rule picks from the committed sweep and the GPU
    # kernel timings: no tile was edited by hand, and each is spill-free in ptxas's report, with
    # and without a mask.
    rows = _sweep_rows("h100")
    timed = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("kernel-gpu-*.json"))]
    assert len(timed) >= 2  # an H100 and an H200
    timings = _sweep.kernel_timings(timed)
    chosen = _sweep.choose_triton(rows, timings)
    assert set(chosen) == set(_triton._H100)
    for key, tiles in chosen.items():
        blocks = _triton._H100[key]
        if tiles is None:  # refused: some kernel spills in every tile, with a mask or without
            assert blocks is None
            assert any(_spills_everywhere(rows, key, kernel) for kernel in _sweep.KERNELS), key
            continue
        for kernel, tile in tiles.items():
            assert getattr(blocks, kernel) == _triton.Tile(**tile), (key, kernel)
            mode = _sweep.KERNELS[kernel]
            found = [
                r
                for r in rows
                if (r["dtype"], r["d"], r["pass"]) == (*key, mode) and r["tile"] == tile
            ]
            assert sorted(r["mask"] for r in found) == ["none", "per-query"]
            for row in found:  # spill-free with and without a mask
                report = row["kernels"][f"eqattn_attention_{kernel}"]
                assert report["spill_stores"] == report["spill_loads"] == 0


def test_kernel_timings_take_each_tilings_worst_device():
    a, b, c = (
        {"block_q": q, "block_k": 64, "num_warps": 4, "num_stages": 2} for q in (32, 64, 128)
    )
    row = lambda mode, fwd, bwd, ms: dict(  # noqa: E731
        dtype="bfloat16", d=64, mode=mode, forward=fwd, dkdv=bwd, dq=bwd, ms=ms
    )
    h100 = {
        "rows": [
            row("forward", a, a, 2.0),
            row("forward", b, a, 1.0),
            row("forward", c, a, 0.8),
            row("forward+backward", a, b, 3.0),
        ]
    }
    h200 = {
        "rows": [
            row("forward", a, a, 3.0),
            row("forward", b, a, 2.0),
            row("forward+backward", a, b, None),
        ]
    }
    timings = _sweep.kernel_timings([h100, h200])
    key = _sweep.tile_key
    # times against each run's fastest (h100: c, 0.8 ms; h200: b), the worst over the runs; c
    # was timed on one device only, and the backward tiling did not run on the H200
    assert timings[("bfloat16", 64, "forward")] == {(key(a),): 2.5, (key(b),): 1.25}
    assert timings[("bfloat16", 64, "backward")] == {}


def test_mosaic_table_is_the_sweeps_choice():
    for (dtype, d), blocks in _sweep.choose_mosaic(_sweep_rows("v5e")).items():
        got = _mosaic.default_blocks(1 << 16, 1 << 16, d, d, jnp.dtype(dtype))
        assert got == _mosaic.Blocks(**blocks), (dtype, d)


def test_tiles_never_exceed_the_padded_sizes():
    blocks = _triton.default_blocks(20, 40, 64, 64, jnp.bfloat16)
    for tile in (blocks.forward, blocks.dkdv, blocks.dq):
        assert tile.block_q <= 32 and tile.block_k <= 64
    assert _mosaic.default_blocks(20, 300, 64, 64, jnp.float32) == _mosaic.Blocks(32, 512)


def test_a_configuration_without_a_spill_free_tiling_is_refused(monkeypatch, rng):
    # Refused when the program is lowered for CUDA (before ptxas runs), with an error that names
    # the alternative; the same function still runs on this CPU (interpreted kernel).
    monkeypatch.setitem(_triton._H100, ("float32", 256), None)
    q = jnp.asarray(rng.normal(size=(2, 8, 200)), jnp.float32)
    f = jax.jit(lambda q: eqattn.attention_with_lse(q, q, implementation="pallas")[0])
    triton = [export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
    with pytest.raises(ValueError, match=r"no spill-free tiling.*implementation='chunked'"):
        export.export(f, platforms=["cuda"], disabled_checks=triton)(q)
    ref = eqattn.attention(q, q, implementation="xla")
    assert jnp.allclose(f(q), ref, atol=1e-5)


PTXAS = """\
I1125 subprocess_compilation.cc:349] ptxas warning : Registers are spilled to local memory in \
function 'eqattn_attention_dkdv', 3316 bytes spill stores, 3392 bytes spill loads
ptxas info    : Compiling entry function 'eqattn_attention_dkdv' for 'sm_90a'
ptxas info    : Function properties for eqattn_attention_dkdv
    2904 bytes stack frame, 3316 bytes spill stores, 3392 bytes spill loads
ptxas info    : Used 32 registers, used 1 barriers, 2904 bytes cumulative stack size
ptxas info    : Compiling entry function 'loop_add_fusion' for 'sm_90a'
ptxas info    : Function properties for loop_add_fusion
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 0 barriers
ptxas info    : Compiling entry function 'eqattn_attention_dq' for 'sm_90a'
ptxas info    : Function properties for eqattn_attention_dq
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 160 registers, used 1 barriers
"""


def test_reports_are_read_per_kernel():
    # ptxas's log (as XLA prints it) and the launch: registers, spills, occupancy per kernel.
    kernels = {
        "eqattn_attention_dkdv": {"threads": 256, "shared_bytes": 65792, "mma": "mma.sync"},
        "eqattn_attention_dq": {"threads": 256, "shared_bytes": 65536, "mma": "wgmma"},
    }
    _deviceless._merge_ptxas(kernels, PTXAS)
    dkdv, dq = kernels["eqattn_attention_dkdv"], kernels["eqattn_attention_dq"]
    assert (dkdv["registers"], dkdv["spill_stores"], dkdv["spill_loads"]) == (32, 3316, 3392)
    assert (dq["registers"], dq["spill_stores"]) == (160, 0)
    # 160 registers x 256 threads = 40,960 of 65,536: one block; 32 x 256: 8 by registers, 3
    # by shared memory (233,472 / 66,816)
    assert dq["blocks_per_sm"] == 1 and dkdv["blocks_per_sm"] == 3
    hlo = (
        "  %eqattn_attention_forward.1 = (f32[8,4096,128]) custom-call(%q), custom_call_target="
        '"tpu_custom_call", backend_config={"flag_configs":[],"scoped_memory_configs":[],'
        '"used_scoped_memory_configs":[{"memory_space":"1","offset":"0","size":"630784"}]}\n'
    )
    target = _deviceless.TARGETS["v5e"]
    assert _deviceless._tpu_kernels(hlo, target) == {
        "eqattn_attention_forward": {"vmem_bytes": 630784, "vmem_limit": 16 << 20}
    }


def test_verdicts():
    h100, v5e = _deviceless.TARGETS["h100"], _deviceless.TARGETS["v5e"]
    ok = {"registers": 100, "threads": 128, "spill_stores": 0, "spill_loads": 0}
    row = {"compiled": True, "d": 128, "kernels": {"eqattn_attention_dq": ok}}
    assert suite.verdict(row, h100) == []
    spilled = {**row, "kernels": {"eqattn_attention_dq": {**ok, "spill_stores": 8}}}
    assert "spills 8 bytes" in suite.verdict(spilled, h100)[0]
    assert "not found" in suite.verdict({**row, "kernels": {"eqattn_attention_dq": {}}}, h100)[0]
    assert suite.verdict({**row, "kernels": {}}, h100) == [
        "no eqattn kernel in the compiled program"
    ]
    refused = {"compiled": False, "refused": True, "error": "ValueError: ...", "d": 256}
    assert suite.verdict(refused, h100) == []
    assert suite.verdict({**refused, "d": 128}, h100)  # refusals only at d = 256
    big = {"vmem_bytes": 17 << 20, "vmem_limit": 16 << 20}
    assert suite.verdict({**row, "kernels": {"eqattn_attention_forward": big}}, v5e)


def test_check_needs_the_compilers(monkeypatch, capsys):
    def version(name):
        raise suite.md.PackageNotFoundError(name)

    monkeypatch.setattr(suite.md, "version", version)
    assert suite.main(["--check"]) == 2
    assert 'pip install -e ".[compile]"' in capsys.readouterr().err


def test_configurations():
    # every dtype the kernel takes on each platform, four head sizes, three masks and a ragged n
    assert len(suite.cases("cuda", check=False)) == 3 * 4 * 4 * 2
    assert len(suite.cases("tpu", check=True)) == 2 * 4 * 4
    assert {c["pass"] for c in suite.cases("cuda", check=True)} == {"gradient"}


def test_compiled_memory_and_ring_rows_become_results_of_those_suites(tmp_path):
    # The memory and ring rows of a compile run are written as `memory` and `ring` results,
    # labelled compiled; the ring's per-device temporaries against the CPU causal ring's.
    (tmp_path / "ring-cpu-cpu.json").write_text(
        json.dumps({"rows": [{"part": "memory", "case": "ring, causal", "temp_mb": 50.0}]})
    )
    mb = 2**20
    programs = [
        {"part": "program", "case": "train", "compiled": True, "temp_bytes": mb},
        {
            "part": "core",
            "case": "xla-dense",
            "n": 16384,
            "compiled": True,
            "temp_mb": 800.0,
            "of_dense": 1.0,
            "compile_s": 1.0,
        },
        {
            "part": "core",
            "case": "eqattn-pallas",
            "n": 16384,
            "compiled": True,
            "temp_mb": 8.0,
            "of_dense": 0.01,
            "compile_s": 1.0,
        },
        {
            "part": "ring",
            "case": "ring, causal, 8 devices, pallas",
            "n": 65536,
            "devices": 8,
            "compiled": True,
            "temp_bytes": 100 * mb,
            "collective_permutes": 26,
            "all_gathers": 0,
            "compile_s": 1.0,
        },
    ]
    device = {"target": "h100", "platform": "cuda", "description": "H100", "ring_topology": "1x1x8"}
    head = {"date": "d", "device": device, "versions": {}, "git_commit": "c", "compiled_on": "cpu"}
    out = suite.compiled_results({**head, "programs": programs}, tmp_path)
    assert sorted(out) == ["memory-h100-compiled.json", "ring-h100-compiled.json"]
    memory, ring = out["memory-h100-compiled.json"], out["ring-h100-compiled.json"]
    assert memory["suite"] == "memory" and memory["compiled"] and ring["compiled"]
    assert [r["case"] for r in memory["rows"]] == ["xla-dense", "eqattn-pallas"]
    (row,) = ring["rows"]
    assert (row["temp_mb"], row["of_cpu"], row["devices"]) == (100.0, 2.0, 8)
    assert suite.compiled_results({**head, "programs": programs[:1]}, tmp_path) == {}


def test_the_auto_program_must_follow_the_platform():
    # The check fails a CUDA program of "auto" without cuDNN's call, or a TPU one with it.
    def payload(platform, cudnn):
        program = {"case": suite.CHECKED_PROGRAMS[0], "problems": [], "cudnn": cudnn}
        control = {"problems": ["did not compile"], "reported_vmem_limit": None}
        device = {"target": "t", "platform": platform}
        return {"device": device, "rows": [], "programs": [program], "negative_control": control}

    assert suite._failures(payload("cuda", True)) == []
    assert "cuDNN missing" in suite._failures(payload("cuda", False))[0]
    assert "cuDNN present" in suite._failures(payload("tpu", True))[0]
