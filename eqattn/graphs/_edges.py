"""Graphs as edge lists, the form the models read: a step costs O(E), not O(n^2).

An undirected edge is two directed ones; the edge `j -> i` carries node j's message to node i
(`adjacency[i, j]`). A batch is padded to one edge count with edges whose receiver is `n`, out
of range: `eqattn.graph_attention` and the segment sums drop them.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from .._attention import graph_attention_with_lse
from .._errors import ConfigError


class EdgeList(NamedTuple):
    """A batch of undirected graphs as edge lists: `senders [B, E]` and `receivers [B, E]`
    (integers; both directions of each undirected edge; a receiver equal to `num_nodes` marks
    padding), on `num_nodes` nodes each.

    **Example:**

    ```python
    import numpy as np
    from eqattn import graphs

    g = graphs.sample("path", 3, 1, seed=0)
    edges = graphs.edge_list(g.adjacency)
    assert edges.num_nodes == 3 and edges.senders.shape == (1, 8)  # 2 edges both ways, padded
    ```
    """

    senders: np.ndarray
    receivers: np.ndarray
    num_nodes: int


EDGES_PER_NODE = 8
"""Training graphs are padded to this many directed edges per node (one shape for every batch:
the step traces once); a drawn graph with more is drawn again."""


def bucket(size: int) -> int:
    """`size` rounded up to a power of two (at least 8): a few shapes, a few compilations."""
    return max(8, 1 << (int(size) - 1).bit_length())


def edge_list(adjacency, edges: int | None = None) -> EdgeList:
    """The edge list of dense adjacencies `[B, n, n]` (bool), padded to `edges` per graph
    (default: the largest graph's count rounded up to a power of two).

    **Example:**

    ```python
    import numpy as np
    from eqattn import graphs

    adjacency = np.zeros((1, 3, 3), bool)
    adjacency[0, [0, 1], [1, 0]] = True  # 0 - 1, node 2 alone
    e = graphs.edge_list(adjacency, edges=4)
    assert e.senders[0, :2].tolist() == [1, 0] and e.receivers[0].tolist() == [0, 1, 3, 3]
    ```
    """
    a = np.asarray(adjacency, bool)
    count, n = a.shape[:2]
    width = bucket(int(a.sum((1, 2)).max(initial=0))) if edges is None else int(edges)
    senders = np.zeros((count, width), np.int32)
    receivers = np.full((count, width), n, np.int32)
    for b in range(count):
        r, s = np.nonzero(a[b])
        if len(r) > width:
            raise ConfigError(f"`edges` ({width}) is fewer than graph {b}'s {len(r)} edges")
        senders[b, : len(r)], receivers[b, : len(r)] = s, r
    return EdgeList(senders, receivers, n)


def check_edges(graph: EdgeList, source) -> tuple[EdgeList, np.ndarray]:
    """`graph` and `source` checked, or a one-line `ValueError` naming the argument: integer
    `[B, E]` arrays of one shape, ends in range (a receiver may be `num_nodes`: padding), no
    self-loop, each edge's reverse present (undirected graphs), and a source per graph."""
    s, r, n = np.asarray(graph.senders), np.asarray(graph.receivers), graph.num_nodes
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ConfigError(f"`num_nodes` must be an int >= 1; got {n!r}")
    if (
        s.ndim != 2
        or s.shape != r.shape
        or not (np.issubdtype(s.dtype, np.integer) and np.issubdtype(r.dtype, np.integer))
    ):
        raise ConfigError(
            f"`senders` and `receivers` must be integers of one shape [B, E]; got "
            f"{s.dtype}{list(s.shape)} and {r.dtype}{list(r.shape)}"
        )
    real = r != n
    if np.any((r < 0) | (r > n)) or np.any(real & ((s < 0) | (s >= n))):
        raise ConfigError(f"edge ends must be nodes in 0 .. {n - 1} (receiver {n}: padding)")
    if np.any(real & (s == r)):
        raise ConfigError("`senders` and `receivers` must have no self-loops")
    for b in range(s.shape[0]):
        pairs = set(zip(s[b][real[b]].tolist(), r[b][real[b]].tolist(), strict=True))
        if any((j, i) not in pairs for i, j in pairs):
            raise ConfigError("each edge's reverse must be listed too (undirected graphs)")
    src = np.asarray(source)
    if src.shape != s.shape[:1] or not np.issubdtype(src.dtype, np.integer):
        raise ConfigError(
            f"`source` must be integers of shape [{s.shape[0]}] (one per graph); got "
            f"{src.dtype}{list(src.shape)}"
        )
    if np.any((src < 0) | (src >= n)):
        raise ConfigError(f"`source` must be in 0 .. {n - 1}; got {src.tolist()}")
    return EdgeList(s.astype(np.int32), r.astype(np.int32), int(n)), src.astype(np.int64)


def _with_self(scores, own, senders, receivers):
    """Every candidate parent of every node: its incoming edges, then the node itself."""
    nodes = jnp.arange(own.shape[0], dtype=receivers.dtype)
    return (
        jnp.concatenate([scores, own]),
        jnp.concatenate([senders, nodes]),
        jnp.concatenate([receivers, nodes]),
    )


def _segment_lse(scores: Float[Array, " E"], receivers: Int[Array, " E"], n: int):
    """Each node's log-sum-exp of its edges' `scores` (-inf where none), by the engine's graph
    attention (stable; zero gradients for a node without edges)."""
    ones = jnp.ones((n, 1), scores.dtype)
    zeros = jnp.zeros((scores.shape[0], 1), scores.dtype)
    return graph_attention_with_lse(ones, zeros, zeros, receivers, beta=0.0, bias=scores)[1]


def parent_loss_and_right(
    scores, own, senders, receivers, edge_ok: Bool[Array, " E"], self_ok: Bool[Array, " n"]
):
    """Per node: minus the log-probability of its valid parents (a softmax over its candidate
    parents: its incoming edges' senders and itself), and whether the chosen parent is valid."""
    n = own.shape[0]
    s, snd, rcv = _with_self(scores, own, senders, receivers)
    ok = jnp.concatenate([edge_ok, self_ok])
    loss = _segment_lse(s, rcv, n) - _segment_lse(jnp.where(ok, s, -jnp.inf), rcv, n)
    parent = choose_parent(scores, own, senders, receivers)
    chosen = snd == parent.at[rcv].get(mode="fill", fill_value=-1)
    right = jax.ops.segment_max((chosen & ok).astype(jnp.int32), rcv, num_segments=n) > 0
    return loss, right


def choose_parent(scores, own, senders, receivers) -> Int[Array, " n"]:
    """Each node's highest-scoring candidate parent `[n]` from a graph model's parent scores
    (each edge's `scores [E]`, the senders being the candidates, and each node's `own [n]` for
    itself); a tie goes to the smallest index, as `argmax` over a dense row would.

    **Example:**

    ```python
    import jax.numpy as jnp
    from eqattn import graphs

    senders, receivers = jnp.array([1, 0, 2, 1]), jnp.array([0, 1, 1, 2])  # a path 0 - 1 - 2
    scores, own = jnp.array([0.5, 2.0, 1.0, -1.0]), jnp.zeros(3)
    assert graphs.choose_parent(scores, own, senders, receivers).tolist() == [1, 0, 2]
    ```
    """
    n = own.shape[0]
    s, snd, rcv = _with_self(scores, own, senders, receivers)
    top = jax.ops.segment_max(s, rcv, num_segments=n)
    best = s >= top.at[rcv].get(mode="fill", fill_value=jnp.inf)
    return jax.ops.segment_min(jnp.where(best, snd, n), rcv, num_segments=n)
