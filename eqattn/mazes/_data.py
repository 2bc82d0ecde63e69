r"""Mazes' data: perfect mazes of $k \times k$ cells drawn by randomised depth-first search, a
start and a goal, the cells on the path between them, and the graph a maze is read as (each
cell hears the cells its passages open onto, and itself; an edge's feature says from which
side).

Cell $(r, c)$ is node $r k + c$. A perfect maze's passages form a spanning tree of the grid
($k^2 - 1$ passages), so one path joins any two cells, and every maze of a size has as many
edges: a batch stacks along a leading axis with no padding.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

import numpy as np
from jaxtyping import Int

from .._graph import Graph

EDGE_KINDS = ("from the north", "from the south", "from the west", "from the east", "self")
"""A maze graph's edge kinds, in the order of their one-hot features."""


def _size(value, name: str = "size") -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 2:
        raise ValueError(f"`{name}` must be an int >= 2 (cells a side); got {value!r}")
    return int(value)


def draw_passages(rng: np.random.Generator, size: int) -> Int[np.ndarray, "m 2"]:
    """The passages of one perfect maze of `size` x `size` cells, by randomised depth-first
    search from a random cell (the recursive backtracker): `[size**2 - 1, 2]` cell pairs, in
    the order they were cut.

    **Example:**

    ```python
    import numpy as np
    from eqattn import mazes

    passages = mazes.draw_passages(np.random.default_rng(0), 4)
    assert passages.shape == (15, 2)  # a spanning tree of the 4 x 4 grid
    ```
    """
    k = _size(size)
    seen = np.zeros(k * k, bool)
    cell = int(rng.integers(k * k))
    seen[cell], stack, cut = True, [cell], []
    while stack:
        cell = stack[-1]
        r, c = divmod(cell, k)
        around = (
            (cell - k, r > 0),
            (cell + k, r < k - 1),
            (cell - 1, c > 0),
            (cell + 1, c < k - 1),
        )
        fresh = [x for x, inside in around if inside and not seen[x]]
        if not fresh:
            stack.pop()
            continue
        nxt = fresh[int(rng.integers(len(fresh)))]
        seen[nxt] = True
        cut.append((cell, nxt))
        stack.append(nxt)
    return np.array(cut, np.int32).reshape(k * k - 1, 2)


def path_between(
    passages: Int[np.ndarray, "m 2"], size: int, start: int, goal: int
) -> Int[np.ndarray, " n"]:
    """1 on each cell of the path from `start` to `goal` (both included), 0 elsewhere: a
    breadth-first search from `start` over `passages`, then the parents back from `goal`.

    **Example:**

    ```python
    import numpy as np
    from eqattn import mazes

    corridor = np.array([[0, 1], [1, 3], [3, 2]])  # 2 x 2 cells: 0 1 / 2 3, joined 0-1-3-2
    assert mazes.path_between(corridor, 2, 0, 3).tolist() == [1, 1, 0, 1]
    ```
    """
    n = _size(size) ** 2
    around: list[list[int]] = [[] for _ in range(n)]
    for a, b in np.asarray(passages):
        around[a].append(int(b))
        around[b].append(int(a))
    parent = np.full(n, -1)
    parent[start], queue = start, deque([start])
    while queue:
        cell = queue.popleft()
        for x in around[cell]:
            if parent[x] < 0:
                parent[x] = cell
                queue.append(x)
    if parent[goal] < 0:
        raise ValueError(f"no path joins cells {start} and {goal}: `passages` is not a maze")
    on = np.zeros(n, np.int32)
    cell = goal
    while cell != start:
        on[cell], cell = 1, parent[cell]
    on[start] = 1
    return on


def maze_graph(passages: Int[np.ndarray, "*batch m 2"], size: int) -> Graph:
    """The graph of mazes of `size` x `size` cells (`passages` of one, or a batch along leading
    axes): each passage both ways and a self-loop per cell, each edge's side one-hot in its
    features (`EDGE_KINDS`, seen from the receiver); `2 (k^2 - 1) + k^2` edges a maze.

    **Example:**

    ```python
    import numpy as np
    from eqattn import mazes

    g = mazes.maze_graph(np.array([[0, 1], [0, 2], [2, 3]]), 2)
    assert g.num_nodes == 4 and g.num_edges == 10 and g.edge_features.shape == (10, 5)
    ```
    """
    k = _size(size)
    passages = np.asarray(passages)
    if passages.ndim < 2 or passages.shape[-2:] != (k * k - 1, 2):
        raise ValueError(
            f"`passages` must be [*batch, {k * k - 1}, 2] (a perfect maze of {k} x {k} cells); "
            f"got {list(passages.shape)}"
        )
    cells = np.broadcast_to(np.arange(k * k), (*passages.shape[:-2], k * k))
    a, b = passages[..., 0], passages[..., 1]
    senders = np.concatenate([a, b, cells], -1).astype(np.int32)
    receivers = np.concatenate([b, a, cells], -1).astype(np.int32)
    side = senders - receivers  # the sender's place seen from the receiver
    kind = np.select([side == -k, side == k, side == -1, side == 1], [0, 1, 2, 3], 4)
    features = np.eye(len(EDGE_KINDS), dtype=np.float32)[kind]
    return Graph(senders, receivers, num_nodes=k * k, edge_features=features)


class Mazes(NamedTuple):
    """A batch of mazes of one size: `inputs` `[b, n]` (1 on the start and the goal, 0
    elsewhere), `graph` (their [`maze_graph`][eqattn.mazes.maze_graph], one leading axis),
    `targets` `[b, n]` (1 on the path) and `passages` `[b, n - 1, 2]`.

    **Example:**

    ```python
    import numpy as np
    from eqattn import mazes

    batch = mazes.draw_mazes(np.random.default_rng(0), 2, 3)
    assert isinstance(batch, mazes.Mazes) and batch.graph.senders.shape == (2, 2 * 8 + 9)
    ```
    """

    inputs: np.ndarray
    graph: Graph
    targets: np.ndarray
    passages: np.ndarray

    @property
    def size(self) -> int:
        """Cells a side."""
        return int(round(np.sqrt(self.inputs.shape[1])))


def draw_mazes(rng: np.random.Generator, count: int, size: int) -> Mazes:
    """`count` perfect mazes of `size` x `size` cells ([`draw_passages`][eqattn.mazes.draw_passages]),
    each with a start and a goal drawn uniformly among distinct cells, and their paths.

    **Example:**

    ```python
    import numpy as np
    from eqattn import mazes

    batch = mazes.draw_mazes(np.random.default_rng(0), 3, 5)
    assert batch.inputs.shape == batch.targets.shape == (3, 25) and batch.size == 5
    assert (batch.inputs.sum(1) == 2).all() and (batch.targets >= batch.inputs).all()
    ```
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"`count` must be an int >= 1; got {count!r}")
    k = _size(size)
    passages = np.stack([draw_passages(rng, k) for _ in range(count)])
    ends = np.stack([rng.choice(k * k, 2, replace=False) for _ in range(count)])
    inputs = np.zeros((count, k * k), np.int32)
    np.put_along_axis(inputs, ends, 1, axis=1)
    targets = np.stack([path_between(p, k, int(s), int(g)) for p, (s, g) in zip(passages, ends)])
    return Mazes(inputs, maze_graph(passages, k), targets, passages)
