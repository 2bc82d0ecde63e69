"""Graphs generated on the fly, with fixed seeds: families whose diameter grows with the number
of nodes at different rates, each example's nodes in a random order and a random source."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .._errors import ConfigError

Edges = list[tuple[int, int]]


def _path(n: int, rng) -> Edges:
    return [(i, i + 1) for i in range(n - 1)]


def _cycle(n: int, rng) -> Edges:
    return _path(n, rng) + ([(n - 1, 0)] if n > 2 else [])


def _tree(n: int, rng) -> Edges:
    """A random recursive tree: each node joins one uniformly chosen earlier node."""
    return [(i, int(rng.integers(0, i))) for i in range(1, n)]


def _grid(n: int, rng) -> Edges:
    """The first `n` cells of a grid of `floor(sqrt(n))` rows, row by row (connected)."""
    cols = -(-n // max(1, int(np.sqrt(n))))
    right = [(i, i + 1) for i in range(n - 1) if (i + 1) % cols]
    return right + [(i, i + cols) for i in range(n - cols)]


def _ladder(n: int, rng) -> Edges:
    """Two rails of `n // 2` and `n - n // 2` nodes joined by rungs."""
    half = n // 2
    rails = [(i, i + 1) for i in range(half - 1)] + [(i, i + 1) for i in range(half, n - 1)]
    return rails + [(i, half + i) for i in range(half)]


def _erdos_renyi(n: int, rng) -> Edges:
    """Each pair joined with probability `3 / (n - 1)`: mean degree about 3, often with a few
    nodes or small groups apart from the rest."""
    p = min(1.0, 3.0 / max(n - 1, 1))
    i, j = np.nonzero(np.triu(rng.random((n, n)) < p, 1))
    return list(zip(i.tolist(), j.tolist()))


_FAMILIES: dict[str, Callable[[int, np.random.Generator], Edges]] = {
    "path": _path,
    "tree": _tree,
    "grid": _grid,
    "erdos-renyi": _erdos_renyi,
    "ladder": _ladder,
    "cycle": _cycle,
}
FAMILIES = tuple(_FAMILIES)
"""The graph families: paths, random trees, 2-D grids, sparse Erdős–Rényi graphs, ladders and
cycles. Their diameters grow with n like n (paths, ladders: n / 2, cycles: n / 2), sqrt(n)
(grids) and log n (trees, Erdős–Rényi)."""


class Graphs(NamedTuple):
    """A batch of undirected graphs: `adjacency [count, n, n]` (bool, symmetric, no self-loops)
    and each one's `source [count]` (int).

    **Example:**

    ```python
    from eqattn import graphs

    g = graphs.sample("grid", 9, 2, seed=0)  # two 3 x 3 grids, nodes in random orders
    assert g.adjacency.shape == (2, 9, 9) and g.adjacency.sum() == 2 * 2 * 12
    ```
    """

    adjacency: np.ndarray
    source: np.ndarray


def sample(family: str, n: int, count: int, *, seed: int) -> Graphs:
    """`count` graphs of `family` (`FAMILIES`) with `n` nodes each, the same for the same `seed`:
    each example's nodes in a random order (no index carries information) and its source a
    random node.

    **Example:**

    ```python
    from eqattn import graphs

    g = graphs.sample("path", 5, 3, seed=1)
    assert (g.adjacency.sum(axis=(1, 2)) == 8).all()  # 4 edges, both directions
    assert g.source.shape == (3,) and (0 <= g.source).all() and (g.source < 5).all()
    ```
    """
    if family not in _FAMILIES:
        raise ConfigError(f"`family` must be one of {', '.join(FAMILIES)}; got {family!r}")
    for name, value in (("n", n), ("count", count)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise ConfigError(f"`{name}` must be an int >= 1; got {value!r}")
    rng = np.random.default_rng(seed)
    adjacency = np.zeros((count, n, n), bool)
    source = np.zeros(count, np.int32)
    for b in range(count):
        order = rng.permutation(n)
        edges = np.array(_FAMILIES[family](n, rng), np.int64).reshape(-1, 2)
        i, j = order[edges[:, 0]], order[edges[:, 1]]
        adjacency[b, i, j] = adjacency[b, j, i] = True
        source[b] = rng.integers(0, n)
    return Graphs(adjacency, source)
