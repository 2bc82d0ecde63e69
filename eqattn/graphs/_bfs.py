"""Breadth-first search in numpy on dense adjacencies, and the parents it allows."""

from __future__ import annotations

import numpy as np

from ._weighted import check_adjacency, check_source


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
    a = check_adjacency(adjacency)
    s = check_source(source, a.shape[0], a.shape[1])
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
