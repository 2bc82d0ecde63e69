"""The tile sweep behind `eqattn._attention._pallas`'s tile tables (`python -m benchmarks compile --sweep`).

For each dtype and padded head size D, every candidate tiling of the Triton kernels is compiled
for the H100 (forward tilings in a forward program; backward tilings in a gradient program with
a fixed small forward), and the Mosaic kernels' blocks for a TPU, recording each kernel's
resources. The compiler reports resources, not speed: the choice made from this alone
(`choose_triton`) is zero spills first, then wgmma, then the most resident blocks per SM, then
the largest tiles; where the `kernel` suite timed spill-free tilings on GPUs (`kernel_timings`),
the fastest of them.
"""

from __future__ import annotations

import dataclasses
import itertools
import json

import jax
import jax.numpy as jnp

from eqattn._attention._pallas import _attention, _mosaic, _triton

from . import _deviceless

DTYPES = {"cuda": ("float32", "bfloat16", "float16"), "tpu": ("float32", "bfloat16")}
WIDTHS = (16, 32, 64, 128, 256)
BATCH, SIZE = 8, 4096
# A forward tile small enough for any width, fixed while backward tiles are swept.
_SMALL_FORWARD = _triton.Tile(32, 32, 4, 1)


def triton_candidates():
    """`(pass, Blocks)` pairs: forward tiles, and backward tiles (the same for `dk, dv` and `dq`,
    which compile as kernels of their own and are chosen independently)."""
    Tile, Blocks = _triton.Tile, _triton.Blocks
    for bq, bk, w, s in itertools.product((32, 64, 128), (32, 64, 128), (4, 8), (1, 2, 3)):
        tile = Tile(bq, bk, w, s)
        yield "forward", Blocks(tile, tile, tile)
    for bq, bk, w, s in itertools.product((16, 32, 64, 128), (16, 32, 64, 128), (4, 8), (1, 2)):
        tile = Tile(bq, bk, w, s)
        yield "backward", Blocks(_SMALL_FORWARD, tile, tile)


def mosaic_candidates():
    for bq, bk in itertools.product((128, 256, 512), (128, 256, 512)):
        yield "both", _mosaic.Blocks(bq, bk)


def _program(mode: str, config: _attention.Config):
    def forward(q, k, v, beta, mask=None):
        return _attention.attention_core(q, k, v, beta, mask, config)

    def loss(q, k, v, beta, mask=None):
        out, lse = _attention.attention_core(q, k, v, beta, mask, config)
        return jnp.sum(out.astype(jnp.float32)) + jnp.sum(lse.astype(jnp.float32))

    return forward if mode == "forward" else jax.grad(loss, argnums=(0, 1, 2))


# Each tiling compiled without a mask and with a per-query mask (`[1, n, m]`, read tile by tile:
# the most registers a mask costs); a tile is chosen only if spill-free with both.
MASKS = ("none", "per-query")


def run(target: _deviceless.Target) -> list[dict]:
    sharding = _deviceless.one_device_sharding(target)
    rows = []
    cuda = target.platform == "cuda"
    for dtype, d in itertools.product(DTYPES[target.platform], WIDTHS):

        def spec(shape, dt=dtype):
            return jax.ShapeDtypeStruct(shape, jnp.dtype(dt), sharding=sharding)

        args = [spec((BATCH, SIZE, d)) for _ in range(3)] + [spec((BATCH,), "float32")]
        masked = {"none": args, "per-query": [*args, spec((1, SIZE, SIZE), "bool")]}
        for mode, blocks in triton_candidates() if cuda else mosaic_candidates():
            config = _attention.Config(**{"triton" if cuda else "mosaic": blocks})
            program = _program("forward" if mode == "forward" else "gradient", config)
            for mask in MASKS if cuda else ("none",):
                result = _deviceless.compile_program(target, program, masked[mask])
                row = {"dtype": dtype, "d": d, "pass": mode, "mask": mask, **_tiles(blocks)}
                rows.append(slim({**row, **result}))
                print(_line(rows[-1]), flush=True)
    return rows


def slim(row: dict) -> dict:
    """A sweep row as stored: a backward row without its fixed forward kernel, times to the
    millisecond, errors to their first 200 characters (thousands of rows)."""
    row = dict(row)
    if row["pass"] == "backward":
        row["kernels"] = {
            k: v for k, v in row.get("kernels", {}).items() if k != "eqattn_attention_forward"
        }
    row["compile_s"] = round(row["compile_s"], 3)
    if "error" in row:
        row["error"] = row["error"][:200]
    for k in row.get("kernels", {}).values():
        k.pop("stack_bytes", None)
    return row


def _tiles(blocks) -> dict:
    if isinstance(blocks, _mosaic.Blocks):
        return {"blocks": dataclasses.asdict(blocks)}
    tile = blocks.forward if blocks.forward == blocks.dkdv else blocks.dkdv
    return {"tile": dataclasses.asdict(tile)}


def _line(row) -> str:
    b = row.get("tile") or row.get("blocks")
    head = f"{row['dtype']:>8} d={row['d']:<3} {row['pass']:<8} {row['mask']:<9} {b}"
    if not row["compiled"]:
        return f"{head}: {row['error'][:100]}"
    return f"{head}: " + "; ".join(
        f"{name[17:]} {k.get('registers')}r {k.get('spill_stores')}s {k.get('mma')} "
        f"{k.get('blocks_per_sm')}b {k.get('vmem_bytes')}"
        for name, k in sorted(row["kernels"].items())
    )


# --- the choice ----------------------------------------------------------------------------------

KERNELS = {"forward": "forward", "dkdv": "backward", "dq": "backward"}


def _spill_free(k: dict | None) -> bool:
    return k is not None and "registers" in k and k["spill_stores"] == k["spill_loads"] == 0


def _rank(reports: dict[str, dict | None], tile: dict):
    """Larger is better: spill-free with and without a mask, then (without one) wgmma, occupancy
    (resident warps per SM), tile size, then fewer warps and stages."""
    k = reports["none"]
    free = all(_spill_free(reports.get(mask)) for mask in MASKS)
    occupancy = k["blocks_per_sm"] * tile["num_warps"]
    size = tile["block_q"] * tile["block_k"]
    return (free, k["mma"] == "wgmma", occupancy, size, -tile["num_warps"], -tile["num_stages"])


def kernel_timings(payloads: list[dict]) -> dict[tuple[str, int, str], dict[tuple, float]]:
    """What the `kernel` suite measured on GPUs (its results, one payload per device): per
    (dtype, D, "forward" or "backward"), each tiling timed on every device -> its worst time
    over the devices, as a ratio to the fastest tiling of the same run (so runs made with
    different default tiles compare). A forward tiling is the forward kernel's tile; a backward
    one the `(dk/dv tile, dq tile)` pair; a tile is `tile_key` of its `Tile` fields."""
    worst: dict = {}
    for payload in payloads:
        groups: dict = {}
        for r in payload["rows"]:
            if r.get("ms") is not None:  # None: did not compile or run on this device
                part = "forward" if r["mode"] == "forward" else "backward"
                groups.setdefault((r["dtype"], r["d"], part), []).append(r)
        for (dtype, d, part), timed in groups.items():
            fastest = min(r["ms"] for r in timed)
            kernels = ("forward",) if part == "forward" else ("dkdv", "dq")
            for r in timed:
                tiling = tuple(tile_key(r[k]) for k in kernels)
                ratios = worst.setdefault((dtype, d, part), {}).setdefault(tiling, [])
                ratios.append(r["ms"] / fastest)
    n = len(payloads)
    return {
        key: {tiling: max(ratios) for tiling, ratios in timed.items() if len(ratios) == n}
        for key, timed in worst.items()
    }


def tile_key(tile: dict) -> str:
    """A tile's fields as a string (JSON, keys sorted)."""
    return json.dumps(tile, sort_keys=True)


def choose_triton(
    rows: list[dict], timings: dict | None = None
) -> dict[tuple[str, int], dict[str, dict] | None]:
    """Per (dtype, D) and kernel, the best tile of a sweep (see `_rank`); None for a (dtype, D)
    where some kernel has no tile that is spill-free with and without a mask. Where `timings`
    (`kernel_timings`) has tilings of a (dtype, D) whose every tile is spill-free with and
    without a mask, the fastest of those is chosen instead (the compiler reports resources; the
    device decides speed)."""
    table: dict = {}
    for key in dict.fromkeys((r["dtype"], r["d"]) for r in rows):
        chosen, free = {}, {}
        for kernel, mode in KERNELS.items():
            found = _found(rows, key, kernel, mode)
            free[kernel] = {tile_key(tile) for rank, tile in found if rank[0]}
            best = max(found, key=lambda f: f[0], default=None)
            chosen[kernel] = best[1] if best and best[0][0] else None
        if None in chosen.values():
            table[key] = None
            continue
        for part, kernels in (("forward", ("forward",)), ("backward", ("dkdv", "dq"))):
            timed = (timings or {}).get((*key, part), {})
            fine = {
                tiling: ratio
                for tiling, ratio in timed.items()
                if all(tile in free[k] for tile, k in zip(tiling, kernels))
            }
            if fine:
                fastest = min(fine, key=fine.get)
                chosen.update({k: json.loads(tile) for tile, k in zip(fastest, kernels)})
        table[key] = chosen
    return table


def _found(rows, key, kernel: str, mode: str) -> list[tuple[tuple, dict]]:
    """`(rank, tile)` of each tile of `kernel` that compiles spill-free without a mask."""
    name = f"eqattn_attention_{kernel}"
    reports: dict = {}  # tile -> mask -> the kernel's report
    for r in rows:
        if (r["dtype"], r["d"]) == key and r["pass"] == mode:
            report = r["kernels"].get(name) if r["compiled"] else None
            reports.setdefault(json.dumps(r["tile"]), {})[r["mask"]] = report
    return [
        (_rank(by_mask, json.loads(tile)), json.loads(tile))
        for tile, by_mask in reports.items()
        if _spill_free(by_mask.get("none"))
    ]


# One table for every TPU generation: within this share of the least scoped VMEM (v4, v5e).
MOSAIC_BUDGET = (16 << 20) // 4


def choose_mosaic(rows: list[dict]) -> dict[tuple[str, int], dict]:
    """Per (dtype, D), the largest blocks (queries x keys) whose every kernel's scoped VMEM is
    within `MOSAIC_BUDGET`, the least VMEM among equals."""
    table = {}
    for key in dict.fromkeys((r["dtype"], r["d"]) for r in rows):
        found = []
        for r in rows:
            if (r["dtype"], r["d"]) != key or not r["compiled"]:
                continue
            vmem = max(k["vmem_bytes"] for k in r["kernels"].values())
            if vmem <= MOSAIC_BUDGET:
                b = r["blocks"]
                found.append(((b["block_q"] * b["block_k"], -vmem), b))
        table[key] = max(found, key=lambda f: f[0])[1]
    return table
