r"""Ring attention: queries, keys and values all split along the sequence over a mesh axis.

Each of the $P$ devices keeps its block of $n/P$ queries and passes its block of $m/P$ keys and
values to the next device, $P$ times around the ring (`jax.lax.ppermute`), so that every query
block meets every key block once. Each meeting gives the block's `(out, lse)` from the core's
`forward`, merged into the query block's running pair by the online softmax's merge
(`merge_partials`):

$$\mathrm{lse} = \log\left(e^{\mathrm{lse}_a} + e^{\mathrm{lse}_b}\right), \qquad
  \mathrm{out} = e^{\mathrm{lse}_a - \mathrm{lse}}\,\mathrm{out}_a
               + e^{\mathrm{lse}_b - \mathrm{lse}}\,\mathrm{out}_b .$$

The backward pass (a custom VJP) sends the key/value blocks around the ring again, each with
the accumulators of its gradients: a device adds its queries' shares to the block in hand
(weights recomputed from the saved global `lse`, as in the one-device core) and passes it on;
after $P$ moves every block is home with its full gradient. A device holds its own blocks,
one block in flight and its outputs: $O((n + m) d / P)$ memory, forward and backward.

Causal attention (query $i$ sees keys $j \le i$) splits the sequence into $2P$ chunks and gives
device $i$ chunks $i$ and $2P - 1 - i$ (the "zig-zag" order): every device then has the same
number of chunk pairs to compute at every ring step (two, three on its own block) and skips the
pairs that causality masks entirely. A contiguous split would leave device 0 idle for all
but one step and give device $P - 1$ all the work; a striped split balances the work too but
masks half of every block, so it can skip none. Pairs on the diagonal are the one-device causal
attention of the engine (`eqattn._attention._causal`: halved down to `chunk_size`, default 512, queries),
so no large causal mask is ever formed. The skip is a `lax.switch` per chunk pair (measured on
CPU devices only).
"""

from __future__ import annotations

import dataclasses
import functools as ft
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jaxtyping import Array, ArrayLike, Bool, Float

from .. import _attention as engine
from ._sequence import check_axis, varying


@dataclasses.dataclass(frozen=True)
class _Ring:
    """The static description of one ring computation (per device)."""

    axis: str
    size: int  # devices on the ring
    causal: bool
    chunk_size: int | None
    tiling: engine.Tiling
    # "auto", "xla" or "chunked": the core's plan for each pair of blocks; "pallas": the fused
    # kernel (`eqattn._attention._pallas`), whose forward and backward keep no block of logits.
    implementation: str = "auto"
    # A diagonal block (queries and keys at the same positions) is computed by the engine's
    # causal blocks (`eqattn._attention._causal`): halved until its leaves have at most this many queries.
    leaf: int = 512


def _zigzag(n: int, size: int) -> np.ndarray:
    """Positions in the order the devices hold them: device i gets chunks i and 2P - 1 - i."""
    chunks = np.arange(n).reshape(2 * size, n // (2 * size))
    return np.concatenate([np.concatenate([chunks[i], chunks[-1 - i]]) for i in range(size)])


def _chunk_home(c: int, size: int) -> int:
    """The device of chunk `c` of 2P in the zig-zag layout."""
    return c if c < size else 2 * size - 1 - c


def _to_zigzag(ring: _Ring, x):
    """Per device: from its contiguous block (chunks 2i, 2i + 1 along axis 1) to its zig-zag
    chunks (i, 2P - 1 - i). Each of the two halves goes to one device (two `ppermute`s, no
    gather): chunk j, the one device j keeps in front, comes from the first halves when j is
    even and from the second halves when it is odd; the back chunk 2P - 1 - j from the other."""
    size, c = ring.size, x.shape[1] // 2
    first = lax.ppermute(x[:, :c], ring.axis, [(i, _chunk_home(2 * i, size)) for i in range(size)])
    second = lax.ppermute(
        x[:, c:], ring.axis, [(i, _chunk_home(2 * i + 1, size)) for i in range(size)]
    )
    even = lax.axis_index(ring.axis) % 2 == 0
    front, back = jnp.where(even, first, second), jnp.where(even, second, first)
    return jnp.concatenate([front, back], axis=1)


def _from_zigzag(ring: _Ring, x):
    """Inverse of `_to_zigzag`."""
    size, c = ring.size, x.shape[1] // 2
    even = lax.axis_index(ring.axis) % 2 == 0
    front, back = x[:, :c], x[:, c:]
    first, second = jnp.where(even, front, back), jnp.where(even, back, front)
    first = lax.ppermute(first, ring.axis, [(_chunk_home(2 * i, size), i) for i in range(size)])
    second = lax.ppermute(
        second, ring.axis, [(_chunk_home(2 * i + 1, size), i) for i in range(size)]
    )
    return jnp.concatenate([first, second], axis=1)


def _pairs(ring: _Ring, me, src, nl: int, ml: int):
    """The (query rows, key rows, key columns of the full mask, chunk indices) this device
    computes when it holds the key block of device `src`. Without causality one pair: all
    local queries with all keys in hand. With it, the four pairs of chunks (half blocks)."""
    if not ring.causal:
        return [(slice(0, nl), slice(0, ml), src * ml, None)]
    c, last = nl // 2, 2 * ring.size - 1
    q_chunks = [(slice(0, c), me), (slice(c, nl), last - me)]
    k_chunks = [(slice(0, c), src, 0), (slice(c, ml), last - src, c)]
    return [
        (rows, keys, src * ml + offset, (qi, ki))
        for rows, qi in q_chunks
        for keys, ki, offset in k_chunks
    ]


def _pair_mask(msk, rows, col, width):
    """The user's mask of one pair (None without one): the rows of the local queries, `width`
    columns from `col` of the full key axis."""
    if msk is None:
        return None
    sub = msk if msk.shape[1] == 1 else msk[:, rows]
    return lax.dynamic_slice_in_dim(sub, col, width, axis=-1)


def _blocks(ring: _Ring):
    """What computes a pair of blocks: the fused kernel or the core (its path per block)."""
    if ring.implementation == "pallas":
        return engine.PallasBackend()
    return engine.XlaBackend(ring.implementation, ring.chunk_size, ring.tiling)


def _pair_forward(ring, q, k, v, b, mask, diag: bool):
    """`(out, lse)` of the queries against the keys; with `diag`, query i and key i are at the
    same position and a key after the query is hidden (the engine's causal blocks)."""
    if diag:
        return engine.causal_forward(q, k, v, b, mask, _blocks(ring), ring.leaf)
    return _blocks(ring).forward(q, k, v, b, mask)


def _pair_backward(ring, q, k, v, b, mask, rows_in, dtype, diag: bool):
    """`(dq, dk, dv, dbeta)` shares of one pair (as `_pair_forward`); `rows_in` = the queries'
    `(lse, delta, g_out, g_lse)`."""
    if diag:
        return engine.causal_backward(q, k, v, b, mask, *rows_in, dtype, _blocks(ring), ring.leaf)
    return _blocks(ring).backward(q, k, v, b, mask, *rows_in, dtype)


def _relation(chunks):
    """0: the key chunk is after the query chunk (skip), 1: before it (full), 2: the same."""
    qi, ki = chunks
    return jnp.where(ki < qi, 1, jnp.where(ki == qi, 2, 0))


def _block_forward(ring, me, src, q, k, v, b, msk, acc):
    """Merge this device's queries' pairs with the key block of device `src` into `acc`."""
    nl, ml = q.shape[1], k.shape[1]
    out, lse = acc
    dtype = out.dtype
    for rows, keys, col, chunks in _pairs(ring, me, src, nl, ml):
        qx, ky, vy = q[:, rows], k[:, keys], v[:, keys]
        mask = _pair_mask(msk, rows, col, ky.shape[1])

        def pair(diag, qx=qx, ky=ky, vy=vy, mask=mask):
            return _pair_forward(ring, qx, ky, vy, b, mask, diag)

        if chunks is None:
            new = pair(False)
        else:
            empty = (
                varying(jnp.zeros(out[:, rows].shape, dtype), ring.axis),
                varying(jnp.full(lse[:, rows].shape, -jnp.inf, dtype), ring.axis),
            )
            branches = [lambda empty=empty: empty, lambda: pair(False), lambda: pair(True)]
            new = lax.switch(_relation(chunks), branches)
        o, s = engine.merge_partials((out[:, rows], lse[:, rows]), new)
        out, lse = out.at[:, rows].set(o), lse.at[:, rows].set(s)
    return out, lse


def _shift(ring: _Ring, *xs):
    """Every device sends `xs` to the next device on the ring."""
    perm = [(j, (j + 1) % ring.size) for j in range(ring.size)]
    return lax.ppermute(xs, ring.axis, perm)


def _ring_forward(ring: _Ring, q, k, v, b, msk):
    dtype = engine.compute_dtype(q.dtype, k.dtype, v.dtype)
    me = lax.axis_index(ring.axis)
    b = b.astype(dtype)
    acc = (
        varying(jnp.zeros(q.shape[:-1] + v.shape[-1:], dtype), ring.axis),
        varying(jnp.full(q.shape[:-1], -jnp.inf, dtype), ring.axis),
    )

    def body(t, carry):
        acc, k, v = carry
        sent = _shift(ring, k, v)  # on its way while this block is computed
        acc = _block_forward(ring, me, (me - t) % ring.size, q, k, v, b, msk, acc)
        return (acc, *sent)

    acc, k, v = lax.fori_loop(0, ring.size - 1, body, (acc, k, v))
    return _block_forward(ring, me, (me + 1) % ring.size, q, k, v, b, msk, acc)


def _block_backward(ring, me, src, res, k, v, grads):
    """Add this device's queries' gradient shares with the key block of device `src`."""
    q, b, msk, lse, delta, g_out, g_lse, dtype = res
    dq, dbeta, dk, dv = grads
    nl, ml = q.shape[1], k.shape[1]
    for rows, keys, col, chunks in _pairs(ring, me, src, nl, ml):
        qx, ky, vy = q[:, rows], k[:, keys], v[:, keys]
        mask = _pair_mask(msk, rows, col, ky.shape[1])
        rows_in = tuple(x[:, rows] for x in (lse, delta, g_out, g_lse))

        def pair(diag, qx=qx, ky=ky, vy=vy, mask=mask, rows_in=rows_in):
            return _pair_backward(ring, qx, ky, vy, b, mask, rows_in, dtype, diag)

        if chunks is None:
            d = pair(False)
        else:
            zeros = tuple(varying(jnp.zeros(x.shape, dtype), ring.axis) for x in (qx, ky, vy, b))
            branches = [lambda zeros=zeros: zeros, lambda: pair(False), lambda: pair(True)]
            d = lax.switch(_relation(chunks), branches)
        dq = dq.at[:, rows].add(d[0])
        dk, dv = dk.at[:, keys].add(d[1]), dv.at[:, keys].add(d[2])
        dbeta = dbeta + d[3]
    return dq, dbeta, dk, dv


def _ring_backward(ring: _Ring, residuals, cotangents):
    q, k, v, b, msk, out, lse = residuals
    dtype = out.dtype
    g_out, g_lse = (g.astype(dtype) for g in cotangents)
    delta = jnp.sum(g_out * out, axis=-1)
    b = b.astype(dtype)
    me = lax.axis_index(ring.axis)
    res = (q, b, msk, lse, delta, g_out, g_lse, dtype)
    grads = tuple(varying(jnp.zeros(x.shape, dtype), ring.axis) for x in (q, b))

    def body(t, carry):
        dq, dbeta, k, v, dk, dv = carry
        sent = _shift(ring, k, v)  # on its way while this block is computed
        dq, dbeta, dk, dv = _block_backward(
            ring, me, (me - t) % ring.size, res, k, v, (dq, dbeta, dk, dv)
        )
        return (dq, dbeta, *sent, *_shift(ring, dk, dv))

    dk0 = varying(jnp.zeros(k.shape, dtype), ring.axis)
    dv0 = varying(jnp.zeros(v.shape, dtype), ring.axis)
    dq, dbeta, k, v, dk, dv = lax.fori_loop(0, ring.size - 1, body, (*grads, k, v, dk0, dv0))
    dq, dbeta, dk, dv = _block_backward(
        ring, me, (me + 1) % ring.size, res, k, v, (dq, dbeta, dk, dv)
    )
    dk, dv = _shift(ring, dk, dv)  # home: each block's gradient, complete
    return (
        dq.astype(q.dtype),
        dk.astype(k.dtype),
        dv.astype(v.dtype),
        dbeta.astype(residuals[3].dtype),
        None,
    )


def _make_inert(ring: _Ring, q, k, v, msk, m: int):
    """The engine's `make_masked_inert` per device, in the contiguous layout,
    where a query may see a key only some others see (a per-query `msk` `[1 or B, n/P, m]`, or
    causality): the non-finite queries, keys and values are zeroed, and `poison` `[B, n/P]`
    marks the queries one of them reaches. Every device learns which keys and values are
    non-finite by one all-reduce of `m` integers per batch element; with causality alone, by
    prefix maxima over them, so no `n/P x m` array is formed."""
    me = lax.axis_index(ring.axis)
    nl, ml = q.shape[1], k.shape[1]
    rows = me * nl + jnp.arange(nl)  # the sequence positions of this device's queries
    bad_q, bad_k, bad_v = engine.nonfinite_rows(q, k, v)
    flags = jnp.zeros((bad_k.shape[0], m), jnp.int32)
    flags = flags.at[:, me * ml + jnp.arange(ml)].set(2 * bad_k + bad_v)
    flags = lax.psum(flags, ring.axis)  # [B, m], in sequence order: 2 key, 1 value, 3 both
    bad_keys, bad_values = flags >= 2, flags % 2 == 1
    if msk is not None and msk.shape[1] == nl:  # per-query rows
        seen = msk
        if ring.causal:
            seen = seen & (jnp.arange(m)[None, :] <= rows[:, None])
        poison = engine.poison_codes(seen, bad_q, bad_keys, bad_values)
    else:  # causality with key padding (its unseen keys are zero already) or no mask
        codes = (2 * bad_keys + bad_values).astype(jnp.int8)
        reached = lax.cummax(codes, axis=1)[:, rows]
        sees = True if msk is None else (jnp.cumsum(msk[:, 0], axis=-1) > 0)[:, rows]
        poison = jnp.maximum(reached, 2 * (bad_q & sees).astype(jnp.int8))
    return (
        engine.zero_rows(q, bad_q),
        engine.zero_rows(k, bad_k),
        engine.zero_rows(v, bad_v),
        poison,
    )


@ft.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _ring_core(ring: _Ring, q, k, v, b, msk):
    """Per device: `(out, lse)` in the compute dtype of its queries against all keys."""
    return _ring_forward(ring, q, k, v, b, msk)


def _ring_core_fwd(ring, q, k, v, b, msk):
    out, lse = _ring_forward(ring, q, k, v, b, msk)
    return (out, lse), (q, k, v, b, msk, out, lse)


_ring_core.defvjp(_ring_core_fwd, _ring_backward)


def ring_attention_with_lse(
    queries: Float[ArrayLike, "*#batch n d"],
    keys: Float[ArrayLike, "*#batch m d"],
    values: Float[ArrayLike, "*#batch m dv"] | None = None,
    *,
    mesh: Mesh,
    axis: str,
    beta: float | Float[ArrayLike, "*#batch"] = 1.0,
    mask: Bool[ArrayLike, "*#batch #n #m"] | None = None,
    causal: bool = False,
    chunk_size: int | None = None,
    tiling: engine.Tiling | None = None,
    implementation: Literal["auto", "xla", "chunked", "pallas"] = "auto",
) -> tuple[Float[Array, "*batch n dv"], Float[Array, "*batch n"]]:
    r"""[`eqattn.attention_with_lse`][] with the queries, keys and values all split along the
    sequence over the mesh axis `axis` (ring attention, via `jax.shard_map`).

    With $P$ devices on `axis`, each holds $n/P$ queries and their outputs and, one block at a
    time, $m/P$ keys and values that travel around the ring: per-device memory
    $O((n + m)\,d / P)$ plus one block's logits, forward and backward (a custom VJP that sends
    the key/value blocks around again with their gradients). The same semantics as the
    one-device core: `beta` per batch element (differentiable), masks broadcasting to
    `[..., n, m]` (a per-query mask is split with the queries: each device keeps its rows of
    it, $n m / P$ booleans; a mask without a query axis, such as key padding, costs $m$), fully
    masked queries with `lse = -inf` and `out = 0`, masked keys and values inert, also where
    the mask or causality hides them from some queries only (as in the one-device core).

    **Arguments:** as [`eqattn.attention_with_lse`][], and

    - `mesh`: a `jax.sharding.Mesh`; `axis`: the name of its axis to split the sequence over.
      $n$ and $m$ must be multiples of its size $P$ ($2P$ with `causal`).
    - `causal`: query $i$ attends to keys $j \le i$ only (needs $n = m$), combined with `mask`.
      The sequence is then laid out over the devices in zig-zag order (device $i$ holds the
      chunks $i$ and $2P - 1 - i$ of $2P$), so that every device does the same work and the
      chunk pairs that causality masks entirely are skipped. Inputs and outputs stay in
      sequence order: the chunks move to and from that layout with two collective permutes
      each way.
    - `chunk_size`: keys per block within a device's block, as in the core; with `causal`,
      also the size (default 512) down to which the blocks on the diagonal are halved, so that
      no causal mask larger than `chunk_size` x `chunk_size` is formed.
    - `tiling`: an [`eqattn.Tiling`][] for the core on each device's blocks.
    - `implementation`: what computes each pair of blocks on a device: eqattn's core
      (`"auto"`, `"xla"`, `"chunked"`, as for [`eqattn.attention_with_lse`][]) or its fused
      kernel (`"pallas"`: no block of logits is formed, forward or backward).

    **Returns:** `(out, lse)` with shapes `[..., n, dv]` and `[..., n]`, sharded along `n` over
    `axis` like the queries, equal to the one-device result up to round-off. Reverse-mode
    differentiable (not forward mode, not twice).

    **Example:**

    ```python
    import jax, jax.numpy as jnp, numpy as np, eqattn
    from jax.sharding import Mesh

    mesh = Mesh(np.array(jax.devices()), ("seq",))
    n = 16 * jax.device_count()  # queries, keys and values all split over "seq"
    q, k, v = jax.random.normal(jax.random.key(0), (3, n, 8))
    out, lse = eqattn.parallel.ring_attention_with_lse(q, k, v, mesh=mesh, axis="seq", causal=True)
    ref_out, ref_lse = eqattn.attention_with_lse(q, k, v, causal=True)
    assert jnp.allclose(out, ref_out, atol=1e-5) and jnp.allclose(lse, ref_lse, atol=1e-5)
    ```
    """
    # Checked before `jit`: a concrete `beta`'s values, and the static arguments (hashable).
    queries, keys, values, beta, mask, _ = engine.check_arguments(queries, keys, values, beta, mask)
    check_axis(mesh, axis)
    engine.check_chunk_size(chunk_size)
    tiling = engine.check_tiling(tiling)
    check_ring_implementation(implementation, queries, keys, values)
    return _ring_attention_with_lse(
        queries,
        keys,
        values,
        beta,
        mask,
        mesh=mesh,
        axis=axis,
        causal=causal,
        chunk_size=chunk_size,
        tiling=tiling,
        implementation=implementation,
    )


def check_ring_implementation(implementation, queries, keys, values) -> None:
    """What a ring device may compute its blocks with (cuDNN gives no log-sum-exp to merge)."""
    if implementation not in ("auto", "xla", "chunked", "pallas"):
        raise ValueError(
            "ring attention's `implementation` must be 'auto', 'xla', 'chunked' or 'pallas'; "
            f"got {implementation!r}."
        )
    if implementation == "pallas":
        engine.select_implementation(queries, keys, values, implementation="pallas", need_lse=True)


# Jitted: run eagerly, `shard_map` executes the ring's steps one operation at a time (a causal
# ring of 8 CPU devices took seconds per call instead of milliseconds once compiled).
@ft.partial(
    jax.jit,
    static_argnames=("mesh", "axis", "causal", "chunk_size", "tiling", "implementation"),
)
def _ring_attention_with_lse(
    queries, keys, values, beta, mask, *, mesh, axis, causal, chunk_size, tiling, implementation
):
    # (the static arguments were checked by the caller, before `jit`)
    args = engine.check_arguments(queries, keys, values, beta, mask)
    queries, keys, values, beta, mask, batch = args
    size = mesh.shape[axis]
    n, m = queries.shape[-2], keys.shape[-2]
    parts = 2 * size if causal else size
    if causal and n != m:
        raise ValueError(
            f"`causal=True` needs as many queries as keys; got queries {queries.shape}, keys "
            f"{keys.shape}."
        )
    if n % parts or m % parts:
        raise ValueError(
            f"the numbers of queries n = {n} and keys m = {m} must be multiples of "
            f"{'2 x ' if causal else ''}the size {size} of mesh axis {axis!r}"
            f"{' (causal: 2 chunks per device)' if causal else ''}; got queries "
            f"{queries.shape}, keys {keys.shape}."
        )
    # Key padding is made inert here; per-query masks and causality on each device (_make_inert).
    per_query = mask is not None and mask.ndim >= 2 and mask.shape[-2] > 1
    q, k, v, b, mask = engine.prepare(args, inert=not per_query)[:5]
    split_mask = mask is not None and mask.shape[1] == n
    seq = P(None, axis, None)
    in_specs = (seq, seq, seq, P(), seq if split_mask else P())
    ring = _Ring(axis, size, causal, chunk_size, tiling, implementation, leaf=chunk_size or 512)

    def local(q, k, v, b, msk):
        # The custom VJP must see one kind of input: make the replicated ones device-varying
        # too (whose transpose sums their cotangents over `axis`).
        b = varying(b, axis)
        msk = msk if msk is None or split_mask else varying(msk, axis)
        poison = None
        if causal or split_mask:
            q, k, v, poison = _make_inert(ring, q, k, v, msk, m)
        if causal:  # contiguous blocks -> zig-zag chunks, by two collective permutes
            q, k, v = (_to_zigzag(ring, x) for x in (q, k, v))
            if msk is not None:
                msk = (_to_zigzag(ring, msk) if split_mask else msk)[..., _zigzag(m, size)]
        out, lse = _ring_core(ring, q, k, v, b, msk)
        if causal:
            out, lse = _from_zigzag(ring, out), _from_zigzag(ring, lse)
        out, lse = engine.apply_poison(out, lse, poison)
        return out.astype(v.dtype), lse.astype(v.dtype)

    args = (q, k, v, b, mask)
    args = tuple(
        None if x is None else jax.device_put(x, NamedSharding(mesh, spec))
        for x, spec in zip(args, in_specs)
    )
    # Pallas calls carry no varying-manual-axes types: the kernel runs unchecked (check_vma).
    fn = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=(seq, P(None, axis)),
        check_vma=implementation != "pallas",
    )
    out, lse = fn(*args)
    out = out.reshape(batch + out.shape[-2:])
    lse = lse.reshape(batch + lse.shape[-1:])
    lead = (None,) * len(batch)
    out = jax.device_put(out, NamedSharding(mesh, P(*lead, axis, None)))
    return out, jax.device_put(lse, NamedSharding(mesh, P(*lead, axis)))


def ring_attention(
    queries: Float[ArrayLike, "*#batch n d"],
    keys: Float[ArrayLike, "*#batch m d"],
    values: Float[ArrayLike, "*#batch m dv"] | None = None,
    *,
    mesh: Mesh,
    axis: str,
    beta: float | Float[ArrayLike, "*#batch"] = 1.0,
    mask: Bool[ArrayLike, "*#batch #n #m"] | None = None,
    causal: bool = False,
    chunk_size: int | None = None,
    tiling: engine.Tiling | None = None,
    implementation: Literal["auto", "xla", "chunked", "pallas"] = "auto",
) -> Float[Array, "*batch n dv"]:
    """The output of [`eqattn.parallel.ring_attention_with_lse`][] (same arguments).

    **Example:**

    ```python
    import jax, jax.numpy as jnp, numpy as np, eqattn
    from jax.sharding import Mesh

    mesh = Mesh(np.array(jax.devices()), ("seq",))
    x = jax.random.normal(jax.random.key(0), (2, 8 * jax.device_count(), 8))
    out = eqattn.parallel.ring_attention(x, x, mesh=mesh, axis="seq")
    assert jnp.allclose(out, eqattn.attention(x, x), atol=1e-5)
    ```
    """
    return ring_attention_with_lse(
        queries,
        keys,
        values,
        mesh=mesh,
        axis=axis,
        beta=beta,
        mask=mask,
        causal=causal,
        chunk_size=chunk_size,
        tiling=tiling,
        implementation=implementation,
    )[0]
