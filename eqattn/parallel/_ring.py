"""Ring attention's public functions: the checks, the zig-zag layout of a causal sequence and
the `jax.shard_map` around the per-device ring (`_ring_core`, where the algorithm is described)."""

from __future__ import annotations

import functools as ft
from typing import Literal

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jaxtyping import Array, ArrayLike, Bool, Float

from .._attention import Tiling, blockwise
from ._ring_core import Ring, from_zigzag, make_inert_per_device, ring_core, to_zigzag, zigzag_order
from ._sequence import check_axis, varying


def ring_attention_with_lse(
    queries: Float[ArrayLike, "*#batch n d"],
    keys: Float[ArrayLike, "*#batch m d"],
    values: Float[ArrayLike, "*#batch m dv"] | None = None,
    *,
    mesh: Mesh,
    axis: str,
    beta: float | Float[ArrayLike, "*#batch"] = 1.0,
    mask: Bool[ArrayLike, "*#mask"] | None = None,
    causal: bool = False,
    chunk_size: int | None = None,
    tiling: Tiling | None = None,
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
      (`"xla"`, `"chunked"`, as for [`eqattn.attention_with_lse`][]) or its fused kernel
      (`"pallas"`: no block of logits is formed, forward or backward). `"auto"` (the default)
      runs the fused kernel on NVIDIA GPUs and TPUs where it can run the inputs (the
      memory-lean path, chosen by the platform compiled for) and the core elsewhere.

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
    options = dict(implementation=implementation, chunk_size=chunk_size, tiling=tiling)
    args, blocks = blockwise.check(queries, keys, values, beta, mask, **options)
    check_axis(mesh, axis)
    return _ring_attention_with_lse(*args[:5], mesh=mesh, axis=axis, causal=causal, blocks=blocks)


# Jitted: run eagerly, `shard_map` executes the ring's steps one operation at a time (a causal
# ring of 8 CPU devices took seconds per call instead of milliseconds once compiled).
@ft.partial(
    jax.jit,
    static_argnames=("mesh", "axis", "causal", "blocks"),
)
def _ring_attention_with_lse(queries, keys, values, beta, mask, *, mesh, axis, causal, blocks):
    # (the static arguments were checked by the caller, before `jit`)
    args, _ = blockwise.check(queries, keys, values, beta, mask)
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
    # Key padding is made inert here; per-query masks and causality on each device (make_inert_per_device).
    per_query = mask is not None and mask.ndim >= 2 and mask.shape[-2] > 1
    q, k, v, b, mask = blockwise.prepare(args, inert=not per_query)[:5]
    split_mask = mask is not None and mask.shape[1] == n
    seq = P(None, axis, None)
    in_specs = (seq, seq, seq, P(), seq if split_mask else P())
    ring = Ring(axis, size, causal, split_mask, blocks)

    def local(q, k, v, b, msk):
        # The custom VJP must see one kind of input: make the replicated ones device-varying
        # too (whose transpose sums their cotangents over `axis`).
        b = varying(b, axis)
        msk = msk if msk is None or split_mask else varying(msk, axis)
        poison = None
        if causal or split_mask:
            q, k, v, poison = make_inert_per_device(ring, q, k, v, msk, m)
        if causal:  # contiguous blocks -> zig-zag chunks, by two collective permutes
            q, k, v = (to_zigzag(ring, x) for x in (q, k, v))
            if msk is not None:
                msk = (to_zigzag(ring, msk) if split_mask else msk)[..., zigzag_order(m, size)]
        out, lse = ring_core(ring, q, k, v, b, msk)
        if causal:
            out, lse = from_zigzag(ring, out), from_zigzag(ring, lse)
        out, lse = blockwise.apply_poison(out, lse, poison)
        return out.astype(v.dtype), lse.astype(v.dtype)

    args = (q, k, v, b, mask)
    args = tuple(
        None if x is None else jax.device_put(x, NamedSharding(mesh, spec))
        for x, spec in zip(args, in_specs)
    )
    # Pallas calls carry no varying-manual-axes types: a program with the kernel runs unchecked.
    fn = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=(seq, P(None, axis)),
        check_vma=not blocks.traces_kernel,
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
    mask: Bool[ArrayLike, "*#mask"] | None = None,
    causal: bool = False,
    chunk_size: int | None = None,
    tiling: Tiling | None = None,
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
