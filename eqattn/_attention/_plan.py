r"""Plan: the one decision of what computes an attention call, made from shapes and dtypes.

[`plan`][] returns a [`Plan`][]; the public [`eqattn.select_implementation`][] reports its
`implementation`, and the dispatch runs it, so the two never disagree. The rule for `"auto"` is
written once, in `select_implementation`'s docstring and in [`_auto`][]. The XLA core's own path
(query tiles on a CPU, key chunks elsewhere) follows from [`Tiling`][] by [`core_path`][].
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools as ft
import math
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp

from ._checks import Implementation, check_implementation
from ._graph import check_graph_shapes
from ._measured_tables import FIELDS, TABLES


@dataclasses.dataclass(frozen=True)
class Tiling:
    r"""How the XLA core splits its work, and the size thresholds of `"auto"`. Static (part of
    the compiled program): a different `Tiling` compiles a different program. The defaults were
    measured (`python -m benchmarks core` and `memory`; the docs' Benchmarks page); pass one to
    [`eqattn.attention_with_lse`][] (and the functions built on it) to force a path, e.g. in
    tests or to trade speed for memory.

    - `forward_logits`, `backward_logits` (defaults $2^{19}$, $2^{18}$): on a CPU the core works
      one batch element and one tile of queries at a time, a tile holding about this many logits
      (the backward three such arrays), so that the softmax's passes stay in cache. Tiles have a
      power-of-two number of rows in [32, 1024].
    - `min_logits` (default $2^{16}$): below this many logits per batch element, one pass
      without tiles.
    - `auto_chunk_logits` (default $2^{26}$): off CPU, above this many logits per batch element
      `"auto"` takes key chunks (online softmax), memory $O(n \cdot \mathrm{chunk})$ instead of
      $O(nm)$.
    - `chunk_size` (default 1024): keys per chunk when chunks are taken without an explicit
      `chunk_size` argument.
    - `causal_leaf` (default 512): with `causal=True`, the diagonal blocks are halved until they
      have at most this many queries; only these leaves take a (`leaf x leaf`) triangular mask.

    **Example:**

    ```python
    import jax, eqattn

    q = jax.random.normal(jax.random.key(0), (256, 16))
    # key chunks of 64 (online softmax) on every platform: equal to one pass to round-off
    out = eqattn.attention(q, q, implementation="chunked", tiling=eqattn.Tiling(chunk_size=64))
    assert jax.numpy.allclose(out, eqattn.attention(q, q, implementation="xla"), atol=1e-5)
    ```
    """

    forward_logits: int = 1 << 19
    backward_logits: int = 1 << 18
    min_logits: int = 1 << 16
    auto_chunk_logits: int = 1 << 26
    chunk_size: int = 1024
    causal_leaf: int = 512

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            low = 0 if field.name == "min_logits" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"`Tiling.{field.name}` must be an int >= {low}; got {value!r}.")


def check_tiling(tiling) -> Tiling:
    if tiling is None:
        return Tiling()
    if not isinstance(tiling, Tiling):
        raise TypeError(f"`tiling` must be an eqattn.Tiling or None; got {type(tiling).__name__}.")
    return tiling


class CorePath(NamedTuple):
    """The XLA core's static path for one shape: `chunk` keys per block (None: no key chunks),
    whether the chunks are taken on every platform (`always_chunked`; else off CPU only), and
    the CPU's query tiles' rows forward and backward (None: one pass)."""

    chunk: int | None
    always_chunked: bool
    forward_rows: int | None
    backward_rows: int | None


def core_path(
    n: int, m: int, chunk_size: int | None, implementation: str, tiling: Tiling | None = None
) -> CorePath:
    """The XLA core's path on `n` queries and `m` keys. `"chunked"` or an explicit `chunk_size`
    take key chunks everywhere (unless one chunk holds every key); `"auto"` off CPU above
    `tiling.auto_chunk_logits` logits; `"xla"` never."""
    tiling = Tiling() if tiling is None else tiling
    chunk, always = None, False
    if implementation == "chunked" or (implementation != "xla" and chunk_size is not None):
        size = tiling.chunk_size if chunk_size is None else chunk_size
        chunk, always = (size, True) if size < m else (None, False)
    elif implementation != "xla" and n * m >= tiling.auto_chunk_logits and tiling.chunk_size < m:
        chunk = tiling.chunk_size
    return CorePath(
        chunk,
        always,
        _tile_rows(n, m, tiling.forward_logits, tiling),
        _tile_rows(n, m, tiling.backward_logits, tiling),
    )


def _tile_rows(n: int, m: int, budget: int, tiling: Tiling) -> int | None:
    """Queries per tile for `m` keys and a logits budget (a power of two in [32, 1024]), or None
    for one pass."""
    rows = 1 << max(5, min(10, (budget // max(m, 1)).bit_length() - 1))
    return rows if n > rows and n * m >= tiling.min_logits else None


class Plan(NamedTuple):
    """What computes one call. `implementation`: what runs on the backend the plan was made for
    (`"xla"`, `"chunked"`, `"cudnn"` or `"pallas"`); `cudnn_on_gpu`: `"auto"` would run cuDNN on
    a GPU, so the program holds cuDNN's call for CUDA beside the XLA core (see the dispatch).
    The rest is what the XLA core needs to plan each block (`core_path`)."""

    implementation: Literal["xla", "chunked", "cudnn", "pallas"]
    cudnn_on_gpu: bool
    requested: Implementation
    chunk_size: int | None
    tiling: Tiling
    causal: bool


# The fused kernel's limits: head sizes up to this (wider tiles no longer fit the registers), and
# the dtypes it compiles for on each accelerator (float64 runs in interpret mode, on CPU, only).
_PALLAS_MAX_FEATURES = 256
_PALLAS_DTYPES = {
    "gpu": tuple(map(jnp.dtype, (jnp.bfloat16, jnp.float16, jnp.float32))),
    "tpu": tuple(map(jnp.dtype, (jnp.bfloat16, jnp.float32))),
}


def cudnn_unsupported(queries, keys, values, backend: str, causal: bool = False) -> str | None:
    """Why cuDNN's fused attention cannot run these inputs, or None if it can."""
    if backend != "gpu":
        return f"it needs an NVIDIA GPU (the default backend is {backend!r})"
    dtypes = {jnp.dtype(x.dtype) for x in (queries, keys, values)}
    if len(dtypes) != 1 or dtypes.pop() not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return (
            "it needs bfloat16 or float16 queries, keys and values of one dtype; got "
            f"{queries.dtype}, {keys.dtype}, {values.dtype}"
        )
    d, dv = queries.shape[-1], values.shape[-1]
    if d != dv or d > 128 or d % 8:
        return (
            "it needs the same feature size d for queries and values, a multiple of 8 and at "
            f"most 128; got d = {d}, dv = {dv}"
        )
    if queries.shape[-2] == 0 or keys.shape[-2] == 0:
        return "it needs at least one query and one key"
    if causal and queries.shape[-2] != keys.shape[-2]:
        return (
            "its causal mask is aligned at the top left, eqattn's at the bottom right: they agree "
            f"only for as many queries as keys; got n = {queries.shape[-2]}, m = {keys.shape[-2]}"
        )
    return None


def pallas_unsupported(queries, keys, values, backend: str) -> str | None:
    """Why eqattn's fused kernel cannot run these inputs, or None if it can."""
    if backend not in ("gpu", "tpu", "cpu"):
        return (
            "it is compiled for NVIDIA GPUs (Triton) and TPUs (Mosaic), and interpreted on CPU "
            f"(for tests); the backend is {backend!r}"
        )
    d, dv = queries.shape[-1], values.shape[-1]
    if max(d, dv) > _PALLAS_MAX_FEATURES:
        return f"it needs feature sizes d, dv <= {_PALLAS_MAX_FEATURES}; got d = {d}, dv = {dv}"
    dtype = jnp.dtype(jnp.result_type(queries.dtype, keys.dtype, values.dtype))
    allowed = _PALLAS_DTYPES.get(backend)
    if allowed is not None and dtype not in allowed:
        names = ", ".join(a.name for a in allowed)
        return f"on a {backend.upper()} it needs {names} inputs; got {dtype}"
    return None


# Set while tracing something that will be differentiated twice (`second_order`).
_SECOND_ORDER = contextvars.ContextVar("eqattn_second_order", default=False)


@contextlib.contextmanager
def second_order():
    """Attention traced inside will be differentiated twice (what `eqattn.jacobian_frobenius`
    traces: a Jacobian penalty's vector-Jacobian products, which the training loss
    differentiates again). jax differentiates cuDNN's call once, so inside, `"auto"` leaves
    cuDNN out and `implementation="cudnn"` is refused; the plan is made at trace time, so this
    holds for everything traced inside."""
    token = _SECOND_ORDER.set(True)
    try:
        yield
    finally:
        _SECOND_ORDER.reset(token)


@ft.cache
def gpu_kind() -> str | None:
    """The device kind of this process's first GPU (`jax.devices("gpu")`), None without one."""
    try:
        return jax.devices("gpu")[0].device_kind
    except RuntimeError:
        return None


def measured_choice(kind: str | None, queries, keys, values, need_lse, causal) -> str | None:
    """The fastest implementation measured on a GPU of this `kind` for inputs like these
    (`_measured_tables`, made from the committed benchmark results), or None where nothing
    was measured: another kind, a head size or dtype not timed, or logits per batch element
    below a quarter of the smallest size timed. Between sizes the nearest (in log scale) rules;
    above the largest, the largest."""
    table = TABLES.get(kind or "")
    d, dv = queries.shape[-1], values.shape[-1]
    logits = queries.shape[-2] * keys.shape[-2]
    if table is None or d != dv or logits == 0:
        return None
    dtype = jnp.dtype(queries.dtype).name
    rows = [
        dict(zip(FIELDS, row))
        for row in table["rows"]
        if row[:4] == (dtype, bool(need_lse), bool(causal), d)
    ]
    if not rows or logits < min(r["logits"] for r in rows) / 4:
        return None
    nearest = min(rows, key=lambda r: abs(math.log(logits / r["logits"])))
    return nearest["implementation"]


def _auto(
    queries, keys, values, mask, need_lse, chunk_size, tiling, causal, backend
) -> Literal["xla", "chunked", "cudnn", "pallas"]:
    """The rule for `"auto"` (stated in `select_implementation`'s docstring)."""
    if mask is None:
        if backend == "gpu":  # a GPU with a measured table: the fused kernel where it was fastest
            measured = measured_choice(gpu_kind(), queries, keys, values, need_lse, causal)
            if measured == "pallas" and pallas_unsupported(queries, keys, values, backend) is None:
                return "pallas"
        once = not need_lse and not _SECOND_ORDER.get()
        if once and cudnn_unsupported(queries, keys, values, backend, causal) is None:
            return "cudnn"
    path = core_path(queries.shape[-2], keys.shape[-2], chunk_size, "auto", tiling)
    off_cpu = path.chunk is not None and backend != "cpu"
    return "chunked" if path.always_chunked or off_cpu else "xla"


def plan(
    queries,
    keys,
    values,
    *,
    mask,
    implementation: Implementation,
    chunk_size: int | None,
    need_lse: bool,
    tiling: Tiling,
    causal: bool,
    backend: str | None = None,
) -> Plan:
    """The [`Plan`][] for these shapes and dtypes (arrays or `jax.ShapeDtypeStruct`s) on `backend`
    (default: `jax.default_backend()`); an explicit choice that cannot run raises a `ValueError`
    saying why."""
    backend = jax.default_backend() if backend is None else backend
    check_implementation(implementation, need_lse=need_lse)
    rest = (implementation, chunk_size, tiling, causal)
    if implementation in ("cudnn", "pallas"):
        if implementation == "cudnn":
            reason = cudnn_unsupported(queries, keys, values, backend, causal)
            if _SECOND_ORDER.get():
                reason = (
                    "jax differentiates cuDNN's call once, and this is traced to be "
                    "differentiated twice (a Jacobian penalty); use 'auto', 'xla' or 'pallas'"
                )
        else:
            reason = pallas_unsupported(queries, keys, values, backend)
        if reason is not None:
            raise ValueError(
                f"`implementation={implementation!r}` cannot run these inputs: {reason} (queries "
                f"{tuple(queries.shape)}, keys {tuple(keys.shape)}, values "
                f"{tuple(values.shape)})."
            )
        return Plan(implementation, False, *rest)
    if implementation in ("xla", "chunked"):
        return Plan(implementation, False, *rest)
    auto = ft.partial(_auto, queries, keys, values, mask, need_lse, chunk_size, tiling, causal)
    return Plan(auto(backend), auto("gpu") == "cudnn", *rest)


def select_implementation(
    queries,
    keys,
    values=None,
    *,
    mask=None,
    implementation: Implementation = "auto",
    chunk_size: int | None = None,
    need_lse: bool = False,
    backend: str | None = None,
    tiling: Tiling | None = None,
    causal: bool = False,
    receivers=None,
) -> Literal["xla", "chunked", "cudnn", "pallas", "segment"]:
    r"""The implementation that `attention` (`need_lse=False`) or `attention_with_lse`
    (`need_lse=True`) runs for these inputs; with `receivers`, what
    [`eqattn.graph_attention`][] runs for an edge list (`keys`, `values` and `receivers` one
    per edge): `"segment"`, its one path on every backend (a gather per edge, a segment max and
    segment sums, XLA's scatter-adds; O(E) memory), which takes none of the dense options.

    Arrays or `jax.ShapeDtypeStruct`s are accepted (only shapes and dtypes are read). `backend`
    defaults to `jax.default_backend()`; pass `"gpu"` to see what a GPU would run. An explicit
    choice that cannot run raises a `ValueError` saying why.

    **The rule for `"auto"`** (the one place it is written): without a mask, on a GPU whose
    kind has a measured table (`python -m benchmarks.auto_tables`, from the committed results;
    `eqattn info` names it), eqattn's fused kernel where it was measured fastest for inputs
    like these (with or without the log-sum-exp); else cuDNN's fused attention where it can run
    the inputs and no log-sum-exp is asked for (an NVIDIA GPU; bf16/fp16 inputs of one dtype;
    $d = d_v \le 128$ with $8 \mid d$; no mask; with `causal`, $n = m$); else eqattn's
    key-chunked pass (online softmax, memory $O(n \cdot \mathrm{chunk})$) when `chunk_size` is
    given or, off CPU, above `tiling.auto_chunk_logits` ($2^{26}$) logits per batch element;
    else `"xla"`, eqattn's one pass (on a CPU tile by tile over the queries, see
    [`eqattn.Tiling`][]). The fused kernel and the XLA core differentiate twice (the Jacobian
    penalty of DEQ training; the kernel's second-order terms run through the XLA core's
    backward), cuDNN once: what [`eqattn.jacobian_frobenius`][] traces (the penalty's
    vector-Jacobian products) `"auto"` never gives to cuDNN, and elsewhere a loss that
    differentiates attention twice on a GPU names `"xla"` or `"pallas"`. A program compiled for another
    platform than the host follows that platform: `"auto"` holds both cuDNN's call and the XLA
    core, and the compiler keeps the one for its target.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    x = jax.ShapeDtypeStruct((8, 16384, 64), jnp.bfloat16)  # [batch * heads, n, d]
    assert eqattn.select_implementation(x, x, backend="gpu") == "cudnn"
    # a log-sum-exp rules cuDNN out; 16384^2 logits per batch element take key chunks
    assert eqattn.select_implementation(x, x, backend="gpu", need_lse=True) == "chunked"
    assert eqattn.select_implementation(x, x, backend="cpu", need_lse=True) == "xla"
    # attention over 600,000 edges of a 100,000-node graph
    q, e = jax.ShapeDtypeStruct((100_000, 64), jnp.float32), jax.ShapeDtypeStruct((600_000, 64), jnp.float32)
    r = jax.ShapeDtypeStruct((600_000,), jnp.int32)
    assert eqattn.select_implementation(q, e, e, receivers=r, backend="gpu") == "segment"
    ```
    """
    values = keys if values is None else values
    if receivers is not None:
        dense = dict(mask=mask, chunk_size=chunk_size, tiling=tiling, causal=causal or None)
        given = [name for name, value in dense.items() if value is not None]
        if implementation != "auto" or given:
            raise ValueError(
                "graph attention (`receivers` given) has one implementation, `segment`, and "
                f"takes none of the dense options; got {given or ['implementation']}."
            )
        check_graph_shapes(queries, keys, values, receivers)
        return "segment"
    return plan(
        queries,
        keys,
        values,
        mask=mask,
        implementation=implementation,
        chunk_size=chunk_size,
        need_lse=need_lse,
        tiling=check_tiling(tiling),
        causal=causal,
        backend=backend,
    ).implementation


@ft.cache
def cudnn_buildable() -> bool:
    """Whether this jax can build cuDNN's attention call: it needs the CUDA plugin (a CPU-only
    install raises "cuDNN is not detected" while tracing it)."""
    spec = jax.ShapeDtypeStruct((1, 128, 1, 64), jnp.bfloat16)
    fused = ft.partial(jax.nn.dot_product_attention, implementation="cudnn")
    try:
        jax.eval_shape(fused, spec, spec, spec)
    except RuntimeError:
        return False
    return True
