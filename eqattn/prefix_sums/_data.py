"""Prefix sums' data: bit strings, their running parity, and the chain graph a string is read
as (tokens are a graph: each bit hears its left and right neighbours and itself, the edge's
kind as its feature)."""

from __future__ import annotations

import numpy as np
from jaxtyping import ArrayLike, Int

from .._graph import Graph

EDGE_KINDS = ("from the left", "from the right", "self")
"""The chain's edge kinds, in the order of their one-hot features."""


def draw_bits(rng: np.random.Generator, count: int, length: int) -> Int[np.ndarray, "count n"]:
    """`count` uniformly random bit strings of `length` bits (int32 0/1).

    **Example:**

    ```python
    import numpy as np
    from eqattn import prefix_sums

    bits = prefix_sums.draw_bits(np.random.default_rng(0), 3, 8)
    assert bits.shape == (3, 8) and set(np.unique(bits)) <= {0, 1}
    ```
    """
    for name, value in (("count", count), ("length", length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"`{name}` must be an int >= 1; got {value!r}")
    return rng.integers(0, 2, (count, length)).astype(np.int32)


def draw_batch(
    rng: np.random.Generator, count: int, lengths: tuple[int, ...]
) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """One training step's strings: `count` fresh strings of each of `lengths` bits, and their
    running parities, as two tuples of `[count, n]` arrays (one per length).

    **Example:**

    ```python
    import numpy as np
    from eqattn import prefix_sums

    bits, targets = prefix_sums.draw_batch(np.random.default_rng(0), 2, (4, 8))
    assert [b.shape for b in bits] == [(2, 4), (2, 8)] and targets[1].shape == (2, 8)
    ```
    """
    if not lengths:
        raise ValueError("`lengths` must name at least one string length; got none")
    bits = tuple(draw_bits(rng, count, n) for n in lengths)
    return bits, tuple(prefix_parity(b) for b in bits)


def prefix_parity(bits: Int[ArrayLike, "*batch n"]) -> Int[np.ndarray, "*batch n"]:
    r"""The running parity $y_i = (\sum_{j \le i} b_j) \bmod 2$ of each string (the target).

    **Example:**

    ```python
    import numpy as np
    from eqattn import prefix_sums

    assert prefix_sums.prefix_parity(np.array([1, 0, 1, 1])).tolist() == [1, 1, 0, 1]
    ```
    """
    bits = np.asarray(bits)
    if bits.ndim < 1 or not np.isin(bits, (0, 1)).all():
        raise ValueError(f"`bits` must be an array of 0s and 1s; got shape {bits.shape}")
    return (np.cumsum(bits, axis=-1) % 2).astype(np.int32)


def chain(length: int) -> Graph:
    """The chain graph of a string of `length` bits: bit i hears bit i - 1 (`from the left`),
    bit i + 1 (`from the right`) and itself (`self`), each edge's kind one-hot in its features
    (`EDGE_KINDS`); 3 n - 2 edges.

    **Example:**

    ```python
    from eqattn import prefix_sums

    g = prefix_sums.chain(4)
    assert g.num_nodes == 4 and g.num_edges == 10 and g.edge_features.shape == (10, 3)
    ```
    """
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"`length` must be an int >= 1; got {length!r}")
    i = np.arange(length)
    senders = np.concatenate([i[:-1], i[1:], i])
    receivers = np.concatenate([i[1:], i[:-1], i])
    kinds = np.repeat([0, 1, 2], [length - 1, length - 1, length])
    features = np.eye(len(EDGE_KINDS), dtype=np.float32)[kinds]
    return Graph(senders, receivers, num_nodes=length, edge_features=features)
