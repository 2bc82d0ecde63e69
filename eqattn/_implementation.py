r"""The one dispatch: inputs validated and flattened once, then one implementation computes.

- `"xla"`: eqattn's single pass (on CPU, tile by tile over the queries), with its recomputing VJP.
- `"chunked"`: eqattn's key-chunked (online-softmax) pass: memory $O(n \cdot \mathrm{chunk})$.
- `"pallas"`: eqattn's fused kernel (FlashAttention-2 tiling in Pallas: Triton on NVIDIA GPUs,
  Mosaic on TPUs; interpreted on CPU, for tests): memory $O((n + m) d)$, and a log-sum-exp that is
  an output you can differentiate.
- `"cudnn"`: `jax.nn.dot_product_attention(..., implementation="cudnn")` (flash attention on
  NVIDIA GPUs). It returns no log-sum-exp, so it can serve [`eqattn.attention`][] only.
- `"auto"`: cuDNN when it can run the inputs and no log-sum-exp is needed (a CUDA GPU, bf16/fp16
  inputs of one dtype, one feature size $d = d_v \le 128$ with $8 \mid d$, no mask); otherwise
  `"chunked"` when `chunk_size` is given or, off CPU, above $2^{26}$ logits per batch element;
  otherwise `"xla"`. (`"auto"` does not take `"pallas"` until GPU benchmarks show where it wins.)

No implementation calls back into this module.
"""

from __future__ import annotations

import functools as ft
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _causal, _core
from ._core import Implementation, check_implementation
from ._pallas import attention_core as pallas_attention_core

# What `jax.nn.dot_product_attention` is asked for (the tests run the wrapper on CPU with "xla").
_FUSED = "cudnn"

# The fused kernel's limits: head sizes up to this (wider tiles no longer fit the registers), and
# the dtypes it compiles for on each accelerator (float64 runs in interpret mode, on CPU, only).
_PALLAS_MAX_FEATURES = 256
_PALLAS_DTYPES = {
    "gpu": tuple(map(jnp.dtype, (jnp.bfloat16, jnp.float16, jnp.float32))),
    "tpu": tuple(map(jnp.dtype, (jnp.bfloat16, jnp.float32))),
}


def cudnn_unsupported(queries, keys, values, mask, backend: str, causal=False) -> str | None:
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
    del mask
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
    tiling: _core.Tiling | None = None,
    causal: bool = False,
) -> Literal["xla", "chunked", "cudnn", "pallas"]:
    r"""The implementation that `attention` (`need_lse=False`) or `attention_with_lse`
    (`need_lse=True`) runs for these inputs.

    Arrays or `jax.ShapeDtypeStruct`s are accepted (only shapes and dtypes are read). `backend`
    defaults to `jax.default_backend()`; pass `"gpu"` to see what a GPU would run. An explicit
    choice that cannot run raises a `ValueError` saying why.

    The rule for `"auto"`: cuDNN where it can run the inputs and no log-sum-exp is asked for
    (a GPU, bf16/fp16, $d = d_v \le 128$, $8 \mid d$, no mask); else the key-chunked pass when
    `chunk_size` is given or, off CPU, above $2^{26}$ logits per batch element (see
    [`eqattn.Tiling`][]); else `"xla"`. `"pallas"` runs only when asked for: its GPU speed is not yet measured against these.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    x = jax.ShapeDtypeStruct((8, 16384, 64), jnp.bfloat16)  # [batch * heads, n, d]
    assert eqattn.select_implementation(x, x, backend="gpu") == "cudnn"
    # a log-sum-exp rules cuDNN out; 16384^2 logits per batch element take key chunks
    assert eqattn.select_implementation(x, x, backend="gpu", need_lse=True) == "chunked"
    assert eqattn.select_implementation(x, x, backend="cpu", need_lse=True) == "xla"
    ```
    """
    backend = jax.default_backend() if backend is None else backend
    values = keys if values is None else values
    check_implementation(implementation, need_lse=need_lse)
    if implementation in ("cudnn", "pallas"):
        if implementation == "cudnn":
            reason = cudnn_unsupported(queries, keys, values, mask, backend, causal)
        else:
            reason = pallas_unsupported(queries, keys, values, backend)
        if reason is not None:
            raise ValueError(
                f"`implementation={implementation!r}` cannot run these inputs: {reason} (queries "
                f"{tuple(queries.shape)}, keys {tuple(keys.shape)}, values "
                f"{tuple(values.shape)})."
            )
        return implementation
    if implementation in ("xla", "chunked"):
        return implementation
    if (
        not need_lse
        and mask is None
        and cudnn_unsupported(queries, keys, values, mask, backend, causal) is None
    ):
        return "cudnn"
    n, m = queries.shape[-2], keys.shape[-2]
    size, explicit = _core.chunk_spec(n, m, chunk_size, "auto", _core.check_tiling(tiling))
    return "chunked" if explicit or (size is not None and backend != "cpu") else "xla"


def as_arrays(queries, keys, values, beta, mask):
    queries, keys = jnp.asarray(queries), jnp.asarray(keys)
    values = keys if values is None else jnp.asarray(values)
    mask = None if mask is None else jnp.asarray(mask)
    return queries, keys, values, jnp.asarray(beta), mask


def make_inert(queries, keys, values, mask, rank, causal: bool = False):
    """Masked entries made inert: whatever they hold (NaN, inf), the output and the gradients
    equal those of the problem without them (a masked logit is dropped, but 0 * NaN in a matmul
    is NaN).

    A mask without a query axis (key padding) is the same for every query: the keys and values
    no query may see, and the queries that may see no key, are zeroed. A per-query mask, or
    `causal`, can hide a key from some queries only: then every non-finite query, key and value
    is zeroed, and `poison` (`[..., n]` integers, else `None`) marks the queries it would have
    reached: 2 where the query itself (seeing some key) or a key it sees is not finite, so `lse`
    and `out` are NaN; 1 where only a value it sees is, so `out` is NaN (the whole row: which of
    its entries the value reaches would cost one more `n x m x dv` product). [`poisoned`][]
    applies it.

    Returns `(queries, keys, values, poison)`."""
    rows = None if mask is None else mask if mask.ndim >= 2 else mask[None, :]

    def trim(x, tail):  # the mask may carry more leading size-1 axes than the batch has
        return x.reshape(x.shape[max(0, x.ndim - (rank + tail)) :])

    def zero(x, bad):
        return trim(zero_rows(x, bad), 2)

    if rows is not None and rows.shape[-2] == 1:
        key_unused = ~jnp.any(rows, axis=-2)  # [..., m]
        query_unused = ~jnp.any(rows, axis=-1)  # [..., 1]
        queries, keys, values = (
            zero(queries, query_unused),
            zero(keys, key_unused),
            zero(values, key_unused),
        )
        if not causal:
            return queries, keys, values, None
    n, m = queries.shape[-2], keys.shape[-2]
    if causal and (rows is None or rows.shape[-2] == 1):
        # Query i sees a prefix of the keys: what reaches it is a running maximum over them.
        bad_q, bad_k, bad_v = nonfinite_rows(queries, keys, values)
        seen = np.clip(np.arange(n) + (m - n), -1, m - 1)
        keep = jnp.ones((m,), bool) if rows is None else jnp.any(rows, axis=-2)
        has_key = (seen >= 0) & jnp.take(
            lax.cummax(keep.astype(jnp.int8), keep.ndim - 1) > 0, seen, axis=-1
        )
        code = (2 * bad_k.astype(jnp.int8)) | bad_v.astype(jnp.int8)
        reached = jnp.where(seen >= 0, jnp.take(lax.cummax(code, code.ndim - 1), seen, axis=-1), 0)
        poison = jnp.maximum(reached, 2 * (bad_q & has_key).astype(jnp.int8))
        return zero(queries, bad_q), zero(keys, bad_k), zero(values, bad_v), trim(poison, 1)
    if causal:
        rows = rows & _causal.causal_mask(n, m)
    bad_q, bad_k, bad_v = nonfinite_rows(queries, keys, values)
    return (
        zero(queries, bad_q),
        zero(keys, bad_k),
        zero(values, bad_v),
        trim(poison_codes(rows, bad_q, bad_k, bad_v), 1),
    )


def nonfinite_rows(*xs):
    """For each `x` `[..., t, f]`: `[..., t]`, True where a row holds NaN or inf."""
    return tuple(~jnp.all(jnp.isfinite(x), axis=-1) for x in xs)


def zero_rows(x, bad):
    """`x` with the rows `bad` marks set to 0."""
    return jnp.where(bad[..., None], jnp.zeros((), x.dtype), x)


def poison_codes(rows, bad_q, bad_k, bad_v):
    """[`make_inert`][]'s `poison` from the mask's rows `[..., n, m]` and the non-finite
    queries `[..., n]`, keys and values `[..., m]`: one reduction over the rows."""
    code = (2 * bad_k.astype(jnp.int8)) | bad_v.astype(jnp.int8)  # [..., m]
    reached = jnp.max(jnp.where(rows, code[..., None, :], jnp.int8(0)), axis=-1)
    return jnp.maximum(reached, 2 * (bad_q & jnp.any(rows, axis=-1)).astype(jnp.int8))


def poisoned(out, lse, poison):
    """`out` and `lse` (or `None`) with NaN where `poison` says (see [`make_inert`][])."""
    if poison is None:
        return out, lse
    out = jnp.where(poison[..., None] > 0, jnp.array(jnp.nan, out.dtype), out)
    return out, None if lse is None else jnp.where(poison > 1, jnp.array(jnp.nan, lse.dtype), lse)


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


def dispatch(
    queries,
    keys,
    values,
    *,
    beta,
    mask,
    chunk_size,
    implementation,
    need_lse: bool,
    tiling=None,
    causal: bool = False,
) -> tuple[jax.Array, jax.Array | None]:
    """Validate, choose the implementation, run it: `(out, lse)` (`lse` None from cuDNN).

    `"auto"` follows the platform the program is compiled for, not the host: where it would run
    cuDNN on a GPU, the program holds both paths (`lax.platform_dependent`), and the compiler
    keeps cuDNN's for CUDA and the other choice elsewhere, so a program exported or compiled for
    a GPU from a CPU host carries cuDNN, and one for a CPU from a GPU host does not. A jax that
    cannot build cuDNN's call (no CUDA plugin installed) builds the other choice alone."""
    queries, keys, values, beta, mask, batch = validate(queries, keys, values, beta, mask)
    check_chunk_size(chunk_size)
    check_causal(causal)
    tiling = _core.check_tiling(tiling)
    choose = ft.partial(
        select_implementation,
        queries,
        keys,
        values,
        mask=mask,
        implementation=implementation,
        chunk_size=chunk_size,
        need_lse=need_lse,
        tiling=tiling,
        causal=causal,
    )
    choice = choose()
    on_gpu = choose(backend="gpu") if implementation == "auto" else choice
    queries, keys, values, beta, poison = sanitize(
        queries, keys, values, beta, mask, batch, causal=causal
    )
    cudnn = ft.partial(_cudnn_attention, mask=mask, batch=batch, causal=causal)
    compute = ft.partial(
        _computed, mask=mask, batch=batch, chunk_size=chunk_size, tiling=tiling, causal=causal
    )
    if implementation == "auto" and on_gpu == "cudnn" and cudnn_buildable():
        core = ft.partial(compute, choose(backend="cpu"))
        out = lax.platform_dependent(
            queries, keys, values, beta, cuda=cudnn, default=lambda *a: core(*a)[0]
        )
        return poisoned(out, None, poison)
    if choice == "cudnn":
        return poisoned(cudnn(queries, keys, values, beta), None, poison)
    out, lse = compute(choice, queries, keys, values, beta, implementation=implementation)
    return poisoned(out, lse, poison)


def _computed(
    choice,
    queries,
    keys,
    values,
    beta,
    *,
    mask,
    batch,
    chunk_size,
    tiling,
    causal=False,
    implementation="auto",
):
    """`(out, lse)` of checked, sanitized inputs by eqattn's core or its fused kernel."""
    q, k, v, b, mask = flatten(queries, keys, values, beta, mask, batch)
    if causal:
        if choice == "pallas":
            backend = _causal.Pallas()
        else:
            backend = _causal.Core(implementation, chunk_size, tiling)
        out, lse = _causal.attention_core(q, k, v, b, mask, backend, tiling.causal_leaf)
    elif choice == "pallas":
        out, lse = pallas_attention_core(q, k, v, b, mask)
    else:
        plan = _core.plan(q.shape[-2], k.shape[-2], chunk_size, implementation, tiling)
        out, lse = _core.attention_core(q, k, v, b, mask, plan)
    return out.reshape(batch + out.shape[-2:]), lse.reshape(batch + lse.shape[-1:])


def validate(queries, keys, values, beta, mask):
    """The arguments as arrays (`values` defaulting to `keys`), checked; and the batch shape."""
    queries, keys, values, beta, mask = as_arrays(queries, keys, values, beta, mask)
    return queries, keys, values, beta, mask, _core.check_inputs(queries, keys, values, beta, mask)


def sanitize(queries, keys, values, beta, mask, batch, *, inert: bool = True, causal=False):
    """Checked inputs made safe to compute on: `beta` guarded ([`guard_beta`][]) and what the mask
    excludes made inert ([`make_inert`][]; skipped with `inert=False`, for callers that do it
    themselves). Returns `(queries, keys, values, beta, poison)`."""
    poison = None
    if (mask is not None or causal) and inert:
        queries, keys, values, poison = make_inert(queries, keys, values, mask, len(batch), causal)
    return queries, keys, values, guard_beta(beta), poison


def check_causal(causal) -> None:
    if not isinstance(causal, bool):
        raise TypeError(f"`causal` must be True or False (static); got {causal!r}.")


def check_chunk_size(chunk_size) -> None:
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"`chunk_size` must be a positive int or None; got {chunk_size!r}.")


def guard_beta(beta):
    """`beta`, or NaN where a traced `beta` is not finite and > 0 (a concrete one is checked
    eagerly, by `check_inputs`): the output is then NaN, loudly wrong rather than plausibly.

    Not a runtime error (`eqx.error_if`): its host callback cannot be exported (`jax.export` of
    attention with a traced `beta` failed for CPU and for CUDA); in a program over several
    devices, an error raised on one leaves the others waiting at their next collective until
    XLA aborts the process (seen on CPU devices, after 40 s); and on GPUs XLA reads a
    conditional's predicate on the host, a sync per call, inside solver loops too. A caller who
    wants the error wraps its own `beta` in `eqx.error_if`."""
    if _core.is_concrete(beta):
        return beta
    return jnp.where(jnp.isfinite(beta) & (beta > 0), beta, jnp.array(jnp.nan, beta.dtype))


def flatten(queries, keys, values, beta, mask, batch):
    """Checked inputs as the core takes them: `q [B, n, d]`, `k [B, m, d]`, `v [B, m, dv]` in their
    common dtype, `beta [B]` (at least float32) and `mask [1 or B, 1 or n, m]`."""
    (n, d), (m, dv) = queries.shape[-2:], values.shape[-2:]
    dtype = jnp.result_type(queries, keys, values)
    B = int(np.prod(batch, dtype=np.int64))

    def flat(x, tail):
        return jnp.broadcast_to(x.astype(dtype), batch + tail).reshape((B,) + tail)

    q, k, v = flat(queries, (n, d)), flat(keys, (m, d)), flat(values, (m, dv))
    b = jnp.broadcast_to(beta.astype(jnp.promote_types(dtype, jnp.float32)), batch).reshape(B)
    if mask is not None:
        # Broadcast along m only; keep a mask shared over the batch (or over queries) un-copied.
        mask_batch, mask_n = mask.shape[:-2], mask.shape[-2] if mask.ndim >= 2 else 1
        if any(s != 1 for s in mask_batch):
            mask = jnp.broadcast_to(mask, batch + (mask_n, m)).reshape(B, mask_n, m)
        else:  # leading axes all of size 1 (or none)
            rows = mask.reshape(mask.shape[-2:]) if mask.ndim >= 2 else mask
            mask = jnp.broadcast_to(rows, (mask_n, m)).reshape(1, mask_n, m)
    return q, k, v, b, mask


def _cudnn_attention(queries, keys, values, beta, *, mask, batch, causal=False):
    """Attention through `jax.nn.dot_product_attention(implementation="cudnn")`.

    Inputs already checked; beta is folded into the queries (or into `scale` when it is a concrete
    number); a query whose mask excludes every key gets 0.
    """
    (n, d), (m, dv) = queries.shape[-2:], values.shape[-2:]
    B = int(np.prod(batch, dtype=np.int64))

    def flat(x, tail):  # [..., t, f] -> [B, t, 1, f] (BTNH with one head)
        return jnp.broadcast_to(x, batch + tail).reshape((B,) + tail[:1] + (1,) + tail[1:])

    q, k, v = flat(queries, (n, d)), flat(keys, (m, d)), flat(values, (m, dv))
    if _core.is_concrete(beta) and jnp.ndim(beta) == 0:
        scale = float(beta)
    else:
        b = jnp.broadcast_to(beta, batch).reshape(B, 1, 1, 1)
        q, scale = (q.astype(jnp.float32) * b).astype(q.dtype), 1.0
    mask4, mask_n = None, 1
    if mask is not None:
        mask_n = mask.shape[-2] if mask.ndim >= 2 else 1
        if any(s != 1 for s in mask.shape[:-2]):
            mask4 = jnp.broadcast_to(mask, batch + (mask_n, m)).reshape(B, 1, mask_n, m)
        else:
            rows = mask.reshape(mask.shape[-2:]) if mask.ndim >= 2 else mask
            mask4 = jnp.broadcast_to(rows, (mask_n, m)).reshape(1, 1, mask_n, m)
    out = jax.nn.dot_product_attention(
        q, k, v, mask=mask4, scale=scale, is_causal=causal, implementation=_FUSED
    )
    out = out.reshape(batch + (n, dv))
    if mask is not None:
        any_key = jnp.any(jnp.broadcast_to(mask, batch + (mask_n, m)), axis=-1)
        out = jnp.where(any_key[..., None], out, 0)
    return out


def cudnn_attention(queries, keys, values, *, beta, mask, causal=False):
    """[`eqattn.attention`][] through cuDNN's kernel, whatever the selection rule says (tests)."""
    queries, keys, values, beta, mask, batch = validate(queries, keys, values, beta, mask)
    return _cudnn_attention(queries, keys, values, beta, mask=mask, batch=batch, causal=causal)
