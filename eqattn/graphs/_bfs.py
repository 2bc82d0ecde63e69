"""The reference: breadth-first search in numpy, the targets it defines, and the checks of a
graph given to eqattn."""

from __future__ import annotations

import numpy as np

from .._errors import ConfigError


def check_graphs(adjacency, source) -> tuple[np.ndarray, np.ndarray]:
    """`(adjacency, source)` as numpy arrays `[B, n, n]` bool and `[B]` int, or a one-line
    `ValueError` naming the argument: a square, symmetric boolean adjacency with no self-loop, at
    least one node, and a source in range for each graph.

    **Example:**

    ```python
    import numpy as np
    from eqattn import graphs

    try:
        graphs.check_graphs(np.ones((1, 3, 3), bool), np.array([0]))
    except ValueError as error:
        assert str(error) == "`adjacency` must have no self-loops (a False diagonal)"
    ```
    """
    a, s = np.asarray(adjacency), np.asarray(source)
    if a.ndim != 3 or a.shape[1] != a.shape[2]:
        raise ConfigError(f"`adjacency` must have shape [B, n, n]; got {list(a.shape)}")
    if a.shape[1] == 0:
        raise ConfigError("`adjacency` must have at least one node (n >= 1); got n = 0")
    if a.dtype != np.bool_:
        raise ConfigError(f"`adjacency` must be boolean; got {a.dtype}")
    if not np.array_equal(a, np.swapaxes(a, 1, 2)):
        raise ConfigError("`adjacency` must be symmetric (undirected graphs)")
    if np.any(np.diagonal(a, axis1=1, axis2=2)):
        raise ConfigError("`adjacency` must have no self-loops (a False diagonal)")
    if s.shape != a.shape[:1] or not np.issubdtype(s.dtype, np.integer):
        raise ConfigError(
            f"`source` must be integers of shape [{a.shape[0]}] (one per graph); got "
            f"{s.dtype}{list(s.shape)}"
        )
    if np.any((s < 0) | (s >= a.shape[1])):
        raise ConfigError(f"`source` must be in 0 .. {a.shape[1] - 1}; got {s.tolist()}")
    return a, s.astype(np.int64)


def bfs(adjacency, source) -> tuple[np.ndarray, np.ndarray]:
    """Breadth-first search from each graph's source: `(reachable [B, n] bool, distance [B, n]
    int)`, the distance in edges (-1 where unreachable).

    **Example:**

    ```python
    import numpy as np
    from eqattn import graphs

    adjacency = np.zeros((1, 4, 4), bool)
    adjacency[0, [0, 1, 1, 2], [1, 0, 2, 1]] = True  # 0 - 1 - 2, and 3 apart
    reachable, distance = graphs.bfs(adjacency, np.array([0]))
    assert reachable.tolist() == [[True, True, True, False]]
    assert distance.tolist() == [[0, 1, 2, -1]]
    ```
    """
    a, s = check_graphs(adjacency, source)
    distance = np.full(a.shape[:2], -1, np.int64)
    for b in range(a.shape[0]):
        frontier, d = np.array([s[b]]), 0
        distance[b, s[b]] = 0
        while frontier.size:
            d += 1
            frontier = np.flatnonzero(a[b, frontier].any(0) & (distance[b] < 0))
            distance[b, frontier] = d
    return distance >= 0, distance


def valid_parents(adjacency, distance) -> np.ndarray:
    """`[B, n, n]`: `True` where node j is a valid BFS parent of node i: a neighbour one edge
    closer to the source; the source and the unreachable nodes have themselves alone.

    **Example:**

    ```python
    import numpy as np
    from eqattn import graphs

    g = graphs.sample("cycle", 4, 1, seed=0)
    _, distance = graphs.bfs(*g)
    parents = graphs.valid_parents(g.adjacency, distance)
    opposite = int(np.argmax(distance[0]))  # two edges away: both its neighbours are parents
    assert parents[0, opposite].sum() == 2 and parents[0, g.source[0], g.source[0]]
    ```
    """
    a, d = np.asarray(adjacency, bool), np.asarray(distance)
    closer = a & (d[:, None, :] == d[:, :, None] - 1) & (d[:, :, None] > 0)
    return closer | ((d <= 0)[:, :, None] & np.eye(a.shape[1], dtype=bool))
