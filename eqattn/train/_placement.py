"""Where a training run's arrays live: one process, or several processes' devices (data
parallel), and results brought back to the host from either."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from .._errors import ConfigError
from ..parallel import data_mesh, replicate, shard_batch


class Placement:
    """Several processes: a global batch split over every process's devices (each process
    passes its rows), the model and optimizer state replicated."""

    def __init__(self):
        self.mesh = data_mesh()

    def batch(self, x, y, idx):
        rows = np.asarray(idx).reshape(jax.process_count(), -1)[jax.process_index()]
        return shard_batch((np.asarray(x)[rows], np.asarray(y)[rows]), self.mesh)

    def replicate(self, tree):
        return replicate(tree, self.mesh)


def placement(warm: bool, batch: int) -> Placement | None:
    """None in one process; else how to place the data over all processes' devices."""
    if jax.process_count() == 1:
        return None
    if warm:
        raise ConfigError(
            "`warm_start` keeps every training example's fixed point in one process's memory: "
            "not with several processes"
        )
    if batch % jax.device_count():
        raise ConfigError(
            f"`batch_size` ({batch}) must be a multiple of the {jax.device_count()} devices of "
            f"the {jax.process_count()} processes"
        )
    return Placement()


def on_host(x) -> np.ndarray:
    """A result as a NumPy array, also when it spans several processes' devices."""
    if getattr(x, "is_fully_addressable", True) or x.is_fully_replicated:
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def saved_points(fixed_points):
    """The warm-start fixed points as a saved array (an empty one when not warm-starting)."""
    return jnp.zeros((0,)) if fixed_points is None else jnp.asarray(fixed_points)
