r"""The log-normalizer core in XLA: one masked, numerically stable pass over the keys that returns
the attention output and the log-sum-exp of every query (the `"xla"` and `"chunked"`
implementations), and the input checks every implementation shares.

Everything in eqattn that needs $\log\sum_j e^{s_j}$ or a softmax-weighted mean calls
[`eqattn.attention_with_lse`][] (directly or through `log_normalizer` / `attention`), which
validates and flattens the inputs and picks an implementation (`_implementation.py`).

The work is done on flattened inputs `q [B, n, d]`, `k [B, m, d]`, `v [B, m, dv]`, `beta [B]` and
`mask [1 or B, 1 or n, m]`. A custom VJP saves only `(out, lse)` and recomputes the weights in the
backward pass, so no `n x m` array is kept between the two passes.
"""

from __future__ import annotations

import dataclasses
import functools as ft
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

Implementation = Literal["auto", "xla", "chunked", "cudnn", "pallas"]
IMPLEMENTATIONS = ("auto", "xla", "chunked", "cudnn", "pallas")


@dataclasses.dataclass(frozen=True)
class Tiling:
    r"""How the XLA core splits its work; static (part of the compiled program), so a different
    `Tiling` compiles a different program. The defaults were measured (`python -m benchmarks
    core` and `memory`); pass one to [`eqattn.attention_with_lse`][] (and the functions built on
    it) to force a path, e.g. in tests or to trade speed for memory.

    - `forward_logits`, `backward_logits` (defaults $2^{19}$, $2^{18}$): on CPU the softmax (exp,
      max, sum over $n \times m$ logits) dominates, not the matmuls, and XLA makes several passes
      over memory for it. Working one batch element and one tile of queries at a time keeps a
      tile's logits (about this many entries; the backward holds three such arrays) in cache:
      about 2x faster forward, and the recomputing backward then beats autodiff of the one-shot
      form. Tiles have a power-of-two number of rows in [32, 1024].
    - `min_logits` (default $2^{16}$): below this many logits per batch element the one-shot
      form is already cache-resident and a loop over tiles would only add overhead.
    - `auto_chunk_logits` (default $2^{26}$): off CPU, above this many logits per batch element
      the key-chunked (online-softmax) path is taken when no `chunk_size` is given, memory
      $O(n \cdot \mathrm{chunk})$ instead of $O(nm)$. (On CPU the query tiles bound it better:
      measured forward+backward temporaries at $n = m = 16384$, $d = 64$, 4 heads: one pass
      12 GB, key chunks of 1024 0.58 GB, query tiles 0.04 GB.)
    - `chunk_size` (default 1024): keys per block when the chunked path is taken without an
      explicit `chunk_size` argument.
    - `causal_leaf` (default 512): with `causal=True`, the diagonal blocks are halved until they
      have at most this many queries; only these leaves take a (`leaf x leaf`) triangular mask,
      and the blocks above the diagonal are never computed.
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


class Plan(NamedTuple):
    """The static path of one core call: `chunk` keys per block (None: no key blocks), whether
    the chunked path is `forced` (else it is taken off CPU only), and the CPU query tiles' rows
    forward and backward (None: the one-shot form)."""

    chunk: int | None
    forced: bool
    forward_rows: int | None
    backward_rows: int | None


def check_tiling(tiling) -> Tiling:
    if tiling is None:
        return Tiling()
    if not isinstance(tiling, Tiling):
        raise TypeError(f"`tiling` must be an eqattn.Tiling or None; got {type(tiling).__name__}.")
    return tiling


def check_implementation(implementation, need_lse: bool) -> None:
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"`implementation` must be one of {', '.join(map(repr, IMPLEMENTATIONS))}; "
            f"got {implementation!r}."
        )
    if need_lse and implementation == "cudnn":
        raise ValueError(
            "`implementation='cudnn'` returns no log-sum-exp: use it with `eqattn.attention`, "
            "or pick 'auto', 'xla', 'chunked' or 'pallas' for the log-sum-exp."
        )


def compute_dtype(*dtypes) -> jnp.dtype:
    """Softmax and accumulation dtype: at least float32 (bf16/fp16 inputs are upcast)."""
    return jnp.promote_types(jnp.result_type(*dtypes), jnp.float32)


def is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _shape_error(message: str, **arrays) -> ValueError:
    shapes = ", ".join(f"{name} {tuple(jnp.shape(a))}" for name, a in arrays.items())
    return ValueError(f"{message}; got {shapes}.")


def _broadcast_batch(**arrays) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*(jnp.shape(a)[:-2] for a in arrays.values())))
    except ValueError:
        raise _shape_error(
            "the leading (batch) axes of "
            + ", ".join(f"`{name}`" for name in arrays)
            + " must broadcast against each other",
            **arrays,
        ) from None


def check_inputs(queries, keys, values, beta, mask):
    """Trace-time validation. Returns the broadcast batch shape."""
    for name, a in (("queries", queries), ("keys", keys), ("values", values)):
        if jnp.ndim(a) < 2:
            raise ValueError(
                f"`{name}` must have shape [..., tokens, features]; got shape {jnp.shape(a)}."
            )
        if not jnp.issubdtype(jnp.result_type(a), jnp.floating):
            raise ValueError(f"`{name}` must be a floating-point array; got dtype {a.dtype}.")
    if queries.shape[-1] != keys.shape[-1]:
        raise _shape_error(
            "`queries` and `keys` must have the same feature size d", queries=queries, keys=keys
        )
    if values.shape[-2] != keys.shape[-2]:
        raise _shape_error(
            "`values` must have one row per key (the same m as `keys`)", keys=keys, values=values
        )
    batch = _broadcast_batch(queries=queries, keys=keys, values=values)
    n, m = queries.shape[-2], keys.shape[-2]

    beta_shape = jnp.shape(beta)
    if not jnp.issubdtype(jnp.result_type(beta), jnp.floating) and not jnp.issubdtype(
        jnp.result_type(beta), jnp.integer
    ):
        raise ValueError(
            f"`beta` must be a real number or array; got dtype {jnp.result_type(beta)}."
        )
    try:
        ok = np.broadcast_shapes(beta_shape, batch) == batch
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"`beta` must be a scalar or broadcast to the batch axes {batch} of the inputs "
            "(e.g. shape [heads] for inputs [..., heads, tokens, features]); "
            f"got shape {beta_shape}."
        )
    if is_concrete(beta) and not np.all(np.isfinite(beta) & (np.asarray(beta) > 0)):
        raise ValueError(
            f"`beta` (the inverse temperature) must be finite and > 0; got {np.asarray(beta)}."
        )

    if mask is not None:
        if jnp.result_type(mask) != jnp.bool_:
            raise ValueError(
                f"`mask` must be boolean (True = may attend); got dtype {jnp.result_type(mask)}."
            )
        target = batch + (n, m)
        try:
            ok = np.broadcast_shapes(jnp.shape(mask), target) == target
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(
                f"`mask` must broadcast to [..., n, m] = {target}; got shape {jnp.shape(mask)} "
                f"(queries {queries.shape}, keys {keys.shape})."
            )
    return batch


# --- the math on one tile (any leading axes) ---------------------------------------------------


def _scaled_queries(q, beta, dtype):
    # beta scales q (n x d), not the n x m logits.
    return q.astype(dtype) * beta[..., None, None]


def _block_stats(q, k, v, beta, mask, dtype, scale_logits=False):
    """Unnormalized softmax statistics of one block of keys: the row maximum `smax` (-inf where
    every key is masked), `total` = sum exp(s - smax) and `acc` = sum exp(s - smax) v.

    `scale_logits`: beta scales the n x m logits (elementwise work fused into the exp) instead
    of the n x d queries. The one-shot form of small problems takes it: a scaling of the
    queries sits between their layout change (e.g. splitting heads) and this product, and
    XLA, which folds a transpose into a dot, moves one past an elementwise op only where the
    value has no other use; then a linearized copy of a map (an implicit layer's backward pass)
    differs from a plain copy, and XLA cannot merge two evaluations at one point. Tiles and
    chunks of large problems scale the queries (on a CPU the logits' scaling cost about 8% of
    the forward at 2048 keys)."""
    qs = q.astype(dtype) if scale_logits else _scaled_queries(q, beta, dtype)
    s = jnp.einsum("...nd,...md->...nm", qs, k, preferred_element_type=dtype)
    if scale_logits:
        s = s * beta[..., None, None]
    if mask is not None:
        s = jnp.where(mask, s, -jnp.inf)
    smax = jnp.max(s, axis=-1, initial=-jnp.inf)
    # Shifting a fully masked row by 0 instead of -inf keeps exp(-inf) = 0 (no NaN).
    p = jnp.exp(s - _finite_or_zero(smax)[..., None])
    return smax, jnp.sum(p, axis=-1), jnp.einsum("...nm,...md->...nd", p, v.astype(dtype))


def _finite_or_zero(x):
    return jnp.where(jnp.isfinite(x), x, 0)


def _merge_stats(a, b):
    """Exact combination of the statistics of two disjoint blocks of keys (online softmax)."""
    (ma, ta, aa), (mb, tb, ab) = a, b
    m = jnp.maximum(ma, mb)
    ca = jnp.exp(ma - _finite_or_zero(m))  # exp(-inf) = 0 for an empty block
    cb = jnp.exp(mb - _finite_or_zero(m))
    return m, ta * ca + tb * cb, aa * ca[..., None] + ab * cb[..., None]


def finalize(stats):
    """`(out, lse)` from the statistics (max, sum of exp(s - max), weighted sum) of a set of keys;
    an empty set (total 0) gives out = 0, lse = -inf, and finite gradients."""
    smax, total, acc = stats
    some = total != 0  # NaN (from NaN logits) stays NaN
    safe = jnp.where(some, total, 1)
    lse = jnp.where(some, _finite_or_zero(smax) + jnp.log(safe), -jnp.inf)
    return acc / safe[..., None], lse


def merge_partials(a, b):
    r"""`(out, lse)` of the union of two disjoint sets of keys from each set's `(out, lse)`:
    $\mathrm{lse} = \log(e^{\mathrm{lse}_a} + e^{\mathrm{lse}_b})$,
    $\mathrm{out} = e^{\mathrm{lse}_a - \mathrm{lse}}\,\mathrm{out}_a
    + e^{\mathrm{lse}_b - \mathrm{lse}}\,\mathrm{out}_b$ (an empty set has `lse = -inf`).
    The online softmax's one merge (`_merge_stats`), on normalized pairs."""
    (out_a, lse_a), (out_b, lse_b) = a, b
    stats = (lse_a, jnp.ones_like(lse_a), out_a), (lse_b, jnp.ones_like(lse_b), out_b)
    return finalize(_merge_stats(*stats))


def _tile_forward(q, k, v, beta, mask, dtype, scale_logits=False):
    return finalize(_block_stats(q, k, v, beta, mask, dtype, scale_logits))


def _tile_backward(q, k, v, beta, mask, lse, delta, g_out, g_lse, dtype):
    r"""Cotangents of one tile from recomputed weights $p = e^{s - \mathrm{lse}}$.

    With $o = p v$, $\ell = \mathrm{lse}$ and $\delta = \sum g_o \odot o$:
    $\partial s = p \odot (g_o v^\top - \delta + g_\ell)$, $dv = p^\top g_o$,
    $dk = \partial s^\top (\beta q)$, $dq = \beta\, \partial s\, k$ and
    $d\beta = \sum \partial s \odot q k^\top = \sum q \odot (\partial s\, k)$, which costs
    $O(nd)$ instead of $O(nm)$.

    The `m x n` arrays are formed transposed ($s^\top = k (\beta q)^\top$): then every product with
    them is a plain row-major matmul and only the small `[m, d]` and `[n, d]` operands are
    transposed (on CPU, about 30% faster than contracting over the leading axis of `p` and `ds`).
    """

    def t(x):
        return jnp.swapaxes(x, -1, -2)

    qs = _scaled_queries(q, beta, dtype)
    k, v = k.astype(dtype), v.astype(dtype)
    s_t = jnp.einsum("...md,...nd->...mn", k, qs)
    if mask is not None:
        s_t = jnp.where(t(mask), s_t, -jnp.inf)
    lse = jnp.where(jnp.isfinite(lse), lse, 0)
    p_t = jnp.exp(s_t - lse[..., None, :])
    dv = jnp.einsum("...mn,...nd->...md", p_t, g_out)
    dp_t = jnp.einsum("...md,...nd->...mn", v, g_out)
    ds_t = p_t * (dp_t - (delta - g_lse)[..., None, :])
    dk = jnp.einsum("...mn,...nd->...md", ds_t, qs)
    ds_k = t(jnp.einsum("...dm,...mn->...dn", t(k), ds_t))
    dbeta = jnp.sum(q.astype(dtype) * ds_k, axis=(-2, -1))
    return beta[..., None, None] * ds_k, dk, dv, dbeta


# --- drivers: one shot, or tile by tile (CPU) -------------------------------------------------


def _pad_rows(x, rows):
    pad = rows - x.shape[-2]
    if pad == 0:
        return x
    return jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, pad), (0, 0)])


def _to_tiles(x, tile):
    """[..., n, f] -> [n/tile, ..., tile, f] (n already padded to a multiple of tile)."""
    *lead, n, f = x.shape
    x = x.reshape(*lead, n // tile, tile, f)
    return jnp.moveaxis(x, -3, 0)


def _from_tiles(x):
    """Inverse of `_to_tiles`."""
    x = jnp.moveaxis(x, 0, -3)
    *lead, t, tile, f = x.shape
    return x.reshape(*lead, t * tile, f)


def _row_tiles(mask, tile, rows):
    """Tiles of a [.., n or 1, m] mask along n; a mask shared by every query is not tiled."""
    if mask is None or mask.shape[-2] == 1:
        return None
    return _to_tiles(_pad_rows(mask, rows), tile)


def _forward_tiled(q, k, v, beta, mask, dtype, tile):
    n = q.shape[-2]
    rows = -(-n // tile) * tile
    shared_mask = mask is not None and mask.shape[0] == 1

    def one(args):
        qb, kb, vb, bb, mb = args
        mb = mask[0] if shared_mask else mb
        mtiles = _row_tiles(mb, tile, rows)

        def tile_fn(args):
            qt, mt = args
            return _tile_forward(qt, kb, vb, bb, mb if mt is None else mt, dtype)

        out, lse = lax.map(tile_fn, (_to_tiles(_pad_rows(qb, rows), tile), mtiles))
        return _from_tiles(out)[:n], _from_tiles(lse[..., None])[:n, 0]

    return lax.map(one, (q, k, v, beta, None if shared_mask else mask))


def _backward_tiled(q, k, v, beta, mask, lse, delta, g_out, g_lse, dtype, tile):
    n = q.shape[-2]
    rows = -(-n // tile) * tile
    shared_mask = mask is not None and mask.shape[0] == 1

    def one(args):
        qb, kb, vb, bb, mb, lb, db, gob, glb = args
        mb = mask[0] if shared_mask else mb
        rows_in = [_to_tiles(_pad_rows(x, rows), tile) for x in (qb, gob)]
        # Padded rows have zero cotangents, so they add nothing to dk, dv, dbeta.
        rows_in += [_to_tiles(_pad_rows(x[:, None], rows), tile)[..., 0] for x in (lb, db, glb)]

        def step(carry, args):
            qt, got, lt, dt, glt, mt = args
            dq, dk, dv, dbeta = _tile_backward(
                qt, kb, vb, bb, mb if mt is None else mt, lt, dt, got, glt, dtype
            )
            dk_acc, dv_acc, db_acc = carry
            return (dk_acc + dk, dv_acc + dv, db_acc + dbeta), dq

        # `zeros_like`: the carry has the inputs' type, device-varying ones too (`shard_map`).
        init = (
            jnp.zeros_like(kb, dtype),
            jnp.zeros_like(vb, dtype),
            jnp.zeros_like(bb, dtype, shape=()),
        )
        (dk, dv, dbeta), dq = lax.scan(step, init, (*rows_in, _row_tiles(mb, tile, rows)))
        return _from_tiles(dq)[:n], dk, dv, dbeta

    return lax.map(one, (q, k, v, beta, None if shared_mask else mask, lse, delta, g_out, g_lse))


def _key_chunks(k, v, mask, chunk):
    """Keys, values and mask in blocks of `chunk` keys along m, leading: [T, ...]. Padded keys
    are masked out."""
    m = k.shape[-2]
    blocks = -(-m // chunk)
    pad = blocks * chunk - m

    def split(x, axis):
        x = jnp.pad(x, [(0, 0)] * (x.ndim + axis) + [(0, pad)] + [(0, 0)] * (-axis - 1))
        x = x.reshape(*x.shape[: x.ndim + axis], blocks, chunk, *x.shape[x.ndim + axis + 1 :])
        return jnp.moveaxis(x, x.ndim + axis - 1, 0)

    mask = jnp.ones((1, 1, m), bool) if mask is None else mask
    return split(k, -2), split(v, -2), split(mask, -1)  # padding keys get mask False


def _forward_chunked(q, k, v, beta, mask, dtype, chunk):
    kb, vb, mb = _key_chunks(k, v, mask, chunk)
    dv = v.shape[-1]
    init = (
        jnp.full_like(q, -jnp.inf, dtype, shape=q.shape[:-1]),
        jnp.zeros_like(q, dtype, shape=q.shape[:-1]),
        jnp.zeros_like(q, dtype, shape=q.shape[:-1] + (dv,)),
    )

    def step(stats, block):
        kc, vc, mc = block
        return _merge_stats(stats, _block_stats(q, kc, vc, beta, mc, dtype)), None

    return finalize(lax.scan(step, init, (kb, vb, mb))[0])


def _backward_chunked(q, k, v, beta, mask, lse, delta, g_out, g_lse, dtype, chunk):
    # Per block of keys, `_tile_backward` gives that block's dk, dv and its share of dq, dbeta.
    kb, vb, mb = _key_chunks(k, v, mask, chunk)

    def step(carry, block):
        dq, dbeta = carry
        kc, vc, mc = block
        dq_c, dk_c, dv_c, dbeta_c = _tile_backward(
            q, kc, vc, beta, mc, lse, delta, g_out, g_lse, dtype
        )
        return (dq + dq_c, dbeta + dbeta_c), (dk_c, dv_c)

    init = (jnp.zeros_like(q, dtype), jnp.zeros_like(beta, dtype))
    (dq, dbeta), (dk, dv) = lax.scan(step, init, (kb, vb, mb))
    m = k.shape[-2]

    def unblock(x):  # [T, B, chunk, f] -> [B, m, f]
        x = jnp.moveaxis(x, 0, -3)  # explicit sizes: f may be 0 (log_normalizer's values)
        return x.reshape(*x.shape[:-3], x.shape[-3] * x.shape[-2], x.shape[-1])[..., :m, :]

    return dq, unblock(dk), unblock(dv), dbeta


def chunk_spec(
    n: int, m: int, chunk_size: int | None, implementation: str, tiling: Tiling | None = None
) -> tuple[int | None, bool]:
    """`(keys per block or None, whether the chunked path is forced)`. `"chunked"` or an explicit
    `chunk_size` force it; `"auto"` takes it (chunks of `tiling.chunk_size`) only off CPU above
    `tiling.auto_chunk_logits` logits; `"xla"` never does."""
    tiling = Tiling() if tiling is None else tiling
    if implementation == "xla":
        return None, False
    if implementation == "chunked" or chunk_size is not None:
        size = tiling.chunk_size if chunk_size is None else chunk_size
        return (size, True) if size < m else (None, False)
    if n * m >= tiling.auto_chunk_logits and tiling.chunk_size < m:
        return tiling.chunk_size, False
    return None, False


def _tile_rows(n: int, m: int, budget: int, tiling: Tiling) -> int | None:
    """Queries per tile for `m` keys and a logits budget (a power of two in [32, 1024]), or None
    for the one-shot form."""
    rows = 1 << max(5, min(10, (budget // max(m, 1)).bit_length() - 1))
    return rows if n > rows and n * m >= tiling.min_logits else None


def plan(
    n: int, m: int, chunk_size: int | None, implementation: str, tiling: Tiling | None = None
) -> Plan:
    """The path of a core call on `n` queries and `m` keys (see `chunk_spec` and `Tiling`)."""
    tiling = Tiling() if tiling is None else tiling
    chunk, forced = chunk_spec(n, m, chunk_size, implementation, tiling)
    return Plan(
        chunk,
        forced,
        _tile_rows(n, m, tiling.forward_logits, tiling),
        _tile_rows(n, m, tiling.backward_logits, tiling),
    )


def forward(q, k, v, beta, mask, plan: Plan):
    """`(out, lse)` in the compute dtype (at least float32) of flattened inputs."""
    dtype = compute_dtype(q.dtype, k.dtype, v.dtype)
    beta = beta.astype(dtype)
    size, explicit, rows, _ = plan
    if explicit:
        return _forward_chunked(q, k, v, beta, mask, dtype, size)
    one_shot = ft.partial(_tile_forward, dtype=dtype, scale_logits=True)
    if rows is None and size is None:
        return one_shot(q, k, v, beta, mask)
    # CPU: query tiles (one batch element, one tile of queries at a time) bound the memory better
    # than key chunks; elsewhere an automatic chunk size takes the chunked path.
    cpu = one_shot if rows is None else ft.partial(_forward_tiled, dtype=dtype, tile=rows)
    default = one_shot if size is None else ft.partial(_forward_chunked, dtype=dtype, chunk=size)
    return lax.platform_dependent(q, k, v, beta, mask, cpu=cpu, default=default)


def backward(q, k, v, beta, mask, lse, delta, g_out, g_lse, plan: Plan, dtype):
    r"""`(dq, dk, dv, dbeta)` in `dtype` of one set of keys, with the weights recomputed from the
    `lse` over all keys (which may be more than these: then these are this set's shares) and
    $\delta = \sum g_o \odot o$; the path (one shot, query tiles, key chunks) as `forward`."""
    args = (q, k, v, beta, mask, lse, delta, g_out, g_lse)
    size, explicit, _, rows = plan
    one_shot = ft.partial(_tile_backward, dtype=dtype)
    if explicit:
        return _backward_chunked(*args, dtype=dtype, chunk=size)
    if rows is None and size is None:
        return one_shot(*args)
    cpu = one_shot if rows is None else ft.partial(_backward_tiled, dtype=dtype, tile=rows)
    default = one_shot if size is None else ft.partial(_backward_chunked, dtype=dtype, chunk=size)
    return lax.platform_dependent(*args, cpu=cpu, default=default)


@ft.partial(jax.custom_vjp, nondiff_argnums=(5,))
def attention_core(q, k, v, beta, mask, plan: Plan):
    """`(out, lse)` of flattened inputs in the dtype of `v`; `plan` from `plan`."""
    out, lse = forward(q, k, v, beta, mask, plan)
    return out.astype(v.dtype), lse.astype(v.dtype)


def _core_fwd(q, k, v, beta, mask, plan):
    out, lse = forward(q, k, v, beta, mask, plan)
    res = (q, k, v, beta, mask, out, lse)
    return (out.astype(v.dtype), lse.astype(v.dtype)), res


def recomputing_backward(res, cotangents, backward):
    r"""The custom VJPs' backward pass: from the residuals `(q, k, v, beta, mask, out, lse)` and
    the cotangents of `(out, lse)`, $\delta = \sum g_o \odot o$ and `backward(q, k, v, beta,
    mask, lse, delta, g_out, g_lse, dtype)`, which recomputes the weights; the gradients in the
    inputs' dtypes (none for the mask)."""
    q, k, v, beta, mask, out, lse = res
    dtype = out.dtype
    g_out, g_lse = (g.astype(dtype) for g in cotangents)
    delta = jnp.sum(g_out * out, axis=-1)
    grads = backward(q, k, v, beta.astype(dtype), mask, lse, delta, g_out, g_lse, dtype)
    return (*(g.astype(x.dtype) for g, x in zip(grads, (q, k, v, beta))), None)


def _core_bwd(plan, res, cotangents):
    return recomputing_backward(
        res, cotangents, lambda *args: backward(*args[:-1], plan=plan, dtype=args[-1])
    )


attention_core.defvjp(_core_fwd, _core_bwd)
