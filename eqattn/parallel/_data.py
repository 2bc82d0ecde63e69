r"""Data parallelism: shard the leading (batch) axis of every array over one mesh axis.

A function jitted over such inputs (e.g. an `eqx.filter_jit` training step of a vmapped implicit
layer, its solver's while loop and implicit backward included) is partitioned by XLA: each device
solves its examples' fixed points, and the gradient is summed across devices. Nothing here depends
on the number of processes: on several hosts (after `jax.distributed.initialize()`) each process
passes its own part of the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


def data_mesh(axis: str = "data", devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A one-axis mesh named `axis` over `devices` (default: every device of every process).

    **Example:**

    ```python
    import jax, eqattn

    mesh = eqattn.parallel.data_mesh()  # every device on one axis, "data"
    assert mesh.shape["data"] == jax.device_count()
    ```
    """
    devices = jax.devices() if devices is None else list(devices)
    return Mesh(np.asarray(devices), (axis,))


def _check_axis(mesh: Mesh, axis: str) -> int:
    if axis not in mesh.shape:
        raise ValueError(f"`axis` {axis!r} is not an axis of `mesh` (axes {dict(mesh.shape)}).")
    return mesh.shape[axis]


def shard_batch(tree: Any, mesh: Mesh, axis: str = "data") -> Any:
    """Every array leaf of `tree`, split along its leading axis over the mesh axis `axis` (other
    axes replicated); non-array leaves are left alone.

    Each process passes its own rows (on one process: the whole batch); the global batch is the
    processes' rows stacked, and must divide evenly over the devices of `axis`.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    mesh = eqattn.parallel.data_mesh()
    x = eqattn.parallel.shard_batch(jnp.zeros((8 * jax.device_count(), 3)), mesh)
    assert len(x.sharding.device_set) == jax.device_count()  # split along the batch axis
    ```
    """
    size = _check_axis(mesh, axis)
    sharding = NamedSharding(mesh, P(axis))
    processes = jax.process_count()

    def put(path, x):
        if not eqx.is_array_like(x) or isinstance(x, (bool, int, float, complex)):
            return x
        x = np.asarray(x) if not isinstance(x, jax.Array) else x
        if x.ndim == 0 or (x.shape[0] * processes) % size:
            raise ValueError(
                f"`tree` leaf {jax.tree_util.keystr(path) or '(root)'} with shape {x.shape}: the "
                f"leading (batch) axis, {processes} process(es) x its rows, must divide evenly "
                f"over the {size} devices of mesh axis {axis!r}."
            )
        return jax.make_array_from_process_local_data(sharding, x)

    return jax.tree_util.tree_map_with_path(put, tree)


def replicate(tree: Any, mesh: Mesh) -> Any:
    """Every array leaf of `tree` (e.g. a model's parameters and optimizer state) replicated over
    `mesh`; non-array leaves are left alone.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    mesh = eqattn.parallel.data_mesh()
    params = eqattn.parallel.replicate({"w": jnp.ones((3, 3)), "lr": 1e-3}, mesh)
    assert params["w"].sharding.is_fully_replicated and params["lr"] == 1e-3  # arrays only
    ```
    """
    sharding = NamedSharding(mesh, P())

    def put(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            # Typed PRNG keys: their data travels (device_put of a key array to devices of other
            # processes fails).
            data = jax.device_put(jax.random.key_data(x), sharding)
            return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
        return jax.device_put(x, sharding)

    arrays, rest = eqx.partition(tree, eqx.is_array)
    return eqx.combine(jax.tree.map(put, arrays), rest)
