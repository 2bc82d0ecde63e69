r"""Sequence parallelism: the keys and values of one attention call split over a mesh axis.

Each device holds a block of keys and computes its block's output and log-sum-exp with the one
core; the blocks combine exactly, as in the online softmax:

$$\mathrm{lse} = \log \sum_b e^{\mathrm{lse}_b}, \qquad
  \mathrm{out} = \sum_b e^{\mathrm{lse}_b - \mathrm{lse}}\, \mathrm{out}_b ,$$

computed with one `pmax` and two `psum`s over the axis, shifted by the maximum (which drops out of
both formulas, so it carries no gradient). Everything is differentiable.
"""

from __future__ import annotations

import functools as ft

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jaxtyping import Array, ArrayLike, Bool, Float

from .._attention import Tiling, attention_with_lse, blockwise


def varying(x, axis):
    if hasattr(lax, "pcast"):
        return lax.pcast(x, axis, to="varying")
    return lax.pvary(x, axis)  # jax < 0.8


def check_axis(mesh, axis) -> None:
    if not isinstance(mesh, Mesh):
        raise TypeError(f"`mesh` must be a jax.sharding.Mesh; got {type(mesh).__name__}.")
    if axis not in mesh.shape:
        raise ValueError(f"`axis` {axis!r} is not an axis of `mesh` (axes {dict(mesh.shape)}).")


def sharded_attention_with_lse(
    queries: Float[ArrayLike, "*#batch n d"],
    keys: Float[ArrayLike, "*#batch m d"],
    values: Float[ArrayLike, "*#batch m dv"] | None = None,
    *,
    mesh: Mesh,
    axis: str,
    beta: float | Float[ArrayLike, "*#batch"] = 1.0,
    mask: Bool[ArrayLike, "*#mask"] | None = None,
    chunk_size: int | None = None,
    tiling: Tiling | None = None,
) -> tuple[Float[Array, "*batch n dv"], Float[Array, "*batch n"]]:
    r"""[`eqattn.attention_with_lse`][] with the keys and values split along $m$ over the mesh axis
    `axis` (sequence parallelism, via `jax.shard_map`).

    Each of the $P$ devices of `axis` attends every query to its $m / P$ keys (so holds
    $n \times m/P$ logits, or less with `chunk_size`); the partial results are combined exactly
    with collectives over `axis`. Queries, `beta` and the outputs are replicated over the mesh; a
    mask with a key axis of size $m$ is split with the keys. Inputs may live anywhere: `shard_map`
    moves them to these shardings. Differentiable (reverse mode), like the one-device core.

    **Arguments:** as [`eqattn.attention_with_lse`][], and

    - `mesh`: a `jax.sharding.Mesh`.
    - `axis`: the name of the mesh axis the keys are split over; $m$ must be a multiple of its
      size.

    **Returns:** `(out, lse)` with shapes `[..., n, dv]` and `[..., n]`, equal to the one-device
    result up to round-off.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, numpy as np, eqattn
    from jax.sharding import Mesh

    mesh = Mesh(np.array(jax.devices()), ("seq",))
    q = jax.random.normal(jax.random.key(0), (16, 8))
    k = jax.random.normal(jax.random.key(1), (8 * jax.device_count(), 8))  # keys split over "seq"
    out, lse = eqattn.parallel.sharded_attention_with_lse(q, k, mesh=mesh, axis="seq")
    ref_out, ref_lse = eqattn.attention_with_lse(q, k)
    assert jnp.allclose(out, ref_out, atol=1e-5) and jnp.allclose(lse, ref_lse, atol=1e-5)
    ```
    """
    # Checked before `jit`: a concrete `beta`'s values, and the static arguments (hashable).
    options = dict(chunk_size=chunk_size, tiling=tiling)
    args, blocks = blockwise.check(queries, keys, values, beta, mask, **options)
    queries, keys, values, beta, mask, _ = args
    check_axis(mesh, axis)
    tiling = blocks.tiling
    return _sharded_attention_with_lse(
        queries,
        keys,
        values,
        beta,
        mask,
        mesh=mesh,
        axis=axis,
        chunk_size=chunk_size,
        tiling=tiling,
    )


# Jitted: run eagerly, `shard_map` would execute the body one operation at a time.
@ft.partial(jax.jit, static_argnames=("mesh", "axis", "chunk_size", "tiling"))
def _sharded_attention_with_lse(
    queries, keys, values, beta, mask, *, mesh, axis, chunk_size, tiling
):
    # (the static arguments were checked by the caller, before `jit`)
    queries, keys, values, beta, mask, _ = blockwise.check(queries, keys, values, beta, mask)[0]
    size, m = mesh.shape[axis], keys.shape[-2]
    if m % size:
        raise ValueError(
            f"the number of keys m = {m} (keys {keys.shape}) must be a multiple of the size "
            f"{size} of mesh axis {axis!r}."
        )

    def along_m(x, dim):  # split axis `dim` (counted from the end) over `axis`
        spec = [None] * x.ndim
        spec[x.ndim + dim] = axis
        return P(*spec)

    split_mask = mask is not None and mask.ndim >= 1 and mask.shape[-1] == m
    in_specs = (
        P(),
        along_m(keys, -2),
        along_m(values, -2),
        P(),
        along_m(mask, -1) if split_mask else P(),
    )

    def local(q, k, v, b, msk):
        # The core's custom VJP must see one kind of input: make the replicated ones
        # device-varying too (whose transpose sums their cotangents over `axis`).
        q, b = varying(q, axis), varying(b, axis)
        msk = msk if msk is None or split_mask else varying(msk, axis)
        out, lse = attention_with_lse(
            q, k, v, beta=b, mask=msk, chunk_size=chunk_size, tiling=tiling
        )
        # A query that a non-finite input reaches on one device (NaN there: see `make_masked_inert`)
        # is left out of the merge and set to NaN after it: merged, its NaN would come back to
        # every device's gradients (0 x NaN).
        code = jnp.where(jnp.isnan(lse), 2, jnp.any(jnp.isnan(out), axis=-1)).astype(jnp.int8)
        lse = jnp.where(code > 1, -jnp.inf, lse)
        out = jnp.where(code[..., None] > 0, jnp.zeros((), out.dtype), out)
        out, lse = blockwise.apply_poison(*blockwise.combine(out, lse, axis), lax.pmax(code, axis))
        return out.astype(values.dtype), lse.astype(values.dtype)

    args = (queries, keys, values, beta, mask)
    # Place the inputs as `in_specs` says (a no-op where they are already; under `jit`, a
    # sharding constraint). Needed on meshes with explicit axes, which `shard_map` never reshards.
    args = tuple(
        None if x is None else jax.device_put(x, NamedSharding(mesh, spec))
        for x, spec in zip(args, in_specs)
    )
    fn = jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=(P(), P()))
    return fn(*args)
