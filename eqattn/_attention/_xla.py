r"""The XLA backend: one masked, numerically stable pass over the keys that returns the attention
output and the log-sum-exp of every query (the `"xla"` and `"chunked"` implementations), and the
online softmax's merge that every path shares.

It computes on the flattened problem (`q [B, n, d]`, `k [B, m, d]`, `v [B, m, dv]`, `beta [B]`,
`mask [1 or B, 1 or n, m]`, see `_prepare`) along a [`CorePath`][eqattn._attention._plan.CorePath]:
one pass, query tiles (CPU) or key chunks. A custom VJP saves only `(out, lse)` and recomputes the
weights in the backward pass, so no `n x m` array is kept between the two passes.
"""

from __future__ import annotations

import functools as ft

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Bool, Float


def compute_dtype(*dtypes) -> jnp.dtype:
    """Softmax and accumulation dtype: at least float32 (bf16/fp16 inputs are upcast)."""
    return jnp.promote_types(jnp.result_type(*dtypes), jnp.float32)


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


def forward(
    q: Float[Array, "B n d"],
    k: Float[Array, "B m d"],
    v: Float[Array, "B m dv"],
    beta: Float[Array, " B"],
    mask: Bool[Array, "#B #n m"] | None,
    path,
) -> tuple[Float[Array, "B n dv"], Float[Array, "B n"]]:
    """`(out, lse)` in the compute dtype (at least float32) of flattened inputs, along `path`."""
    dtype = compute_dtype(q.dtype, k.dtype, v.dtype)
    beta = beta.astype(dtype)
    size, always_chunked, rows, _ = path
    if always_chunked:
        return _forward_chunked(q, k, v, beta, mask, dtype, size)
    one_shot = ft.partial(_tile_forward, dtype=dtype, scale_logits=True)
    if rows is None and size is None:
        return one_shot(q, k, v, beta, mask)
    # CPU: query tiles (one batch element, one tile of queries at a time) bound the memory better
    # than key chunks; elsewhere an automatic chunk size takes the chunked path.
    cpu = one_shot if rows is None else ft.partial(_forward_tiled, dtype=dtype, tile=rows)
    default = one_shot if size is None else ft.partial(_forward_chunked, dtype=dtype, chunk=size)
    return lax.platform_dependent(q, k, v, beta, mask, cpu=cpu, default=default)


def backward(
    q: Float[Array, "B n d"],
    k: Float[Array, "B m d"],
    v: Float[Array, "B m dv"],
    beta: Float[Array, " B"],
    mask: Bool[Array, "#B #n m"] | None,
    lse: Float[Array, "B n"],
    delta: Float[Array, "B n"],
    g_out: Float[Array, "B n dv"],
    g_lse: Float[Array, "B n"],
    path,
    dtype,
) -> tuple[
    Float[Array, "B n d"], Float[Array, "B m d"], Float[Array, "B m dv"], Float[Array, " B"]
]:
    r"""`(dq, dk, dv, dbeta)` in `dtype` of one set of keys, with the weights recomputed from the
    `lse` over all keys (which may be more than these: then these are this set's shares) and
    $\delta = \sum g_o \odot o$; the path (one shot, query tiles, key chunks) as `forward`."""
    args = (q, k, v, beta, mask, lse, delta, g_out, g_lse)
    size, always_chunked, _, rows = path
    one_shot = ft.partial(_tile_backward, dtype=dtype)
    if always_chunked:
        return _backward_chunked(*args, dtype=dtype, chunk=size)
    if rows is None and size is None:
        return one_shot(*args)
    cpu = one_shot if rows is None else ft.partial(_backward_tiled, dtype=dtype, tile=rows)
    default = one_shot if size is None else ft.partial(_backward_chunked, dtype=dtype, chunk=size)
    return lax.platform_dependent(*args, cpu=cpu, default=default)


@ft.partial(jax.custom_vjp, nondiff_argnums=(5,))
def attention_core(q, k, v, beta, mask, path):
    """`(out, lse)` of flattened inputs in the dtype of `v`, along `path` (a `CorePath`)."""
    out, lse = forward(q, k, v, beta, mask, path)
    return out.astype(v.dtype), lse.astype(v.dtype)


def _core_fwd(q, k, v, beta, mask, path):
    out, lse = forward(q, k, v, beta, mask, path)
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


def _core_bwd(path, res, cotangents):
    return recomputing_backward(
        res, cotangents, lambda *args: backward(*args[:-1], path=path, dtype=args[-1])
    )


attention_core.defvjp(_core_fwd, _core_bwd)
