"""A graph model's parent scores, read as a loss and as choices: each node's candidate parents
are its incoming edges' senders and itself."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from .._graph import Graph, segment_logsumexp


def _with_self(scores, own, graph: Graph):
    """Every candidate parent of every node: its incoming edges, then the node itself."""
    receivers = jnp.asarray(graph.receivers)
    nodes = jnp.arange(own.shape[0], dtype=receivers.dtype)
    return (
        jnp.concatenate([scores, own]),
        jnp.concatenate([jnp.asarray(graph.senders), nodes]),
        jnp.concatenate([receivers, nodes]),
    )


def parent_loss_and_right(
    scores: Float[Array, " E"],
    own: Float[Array, " n"],
    graph: Graph,
    edge_ok: Bool[Array, " E"],
    self_ok: Bool[Array, " n"],
):
    """Per node: minus the log-probability of its valid parents (a softmax over its candidate
    parents: its incoming edges' senders and itself), and whether every candidate of the
    highest score is valid (so any choice among tied candidates is; a tie with an invalid one
    counts as wrong, whatever order would break it)."""
    n = own.shape[0]
    s, snd, rcv = _with_self(scores, own, graph)
    ok = jnp.concatenate([edge_ok, self_ok])
    loss = segment_logsumexp(s, rcv, n) - segment_logsumexp(jnp.where(ok, s, -jnp.inf), rcv, n)
    top = jax.ops.segment_max(s, rcv, num_segments=n)
    best = s >= top.at[rcv].get(mode="fill", fill_value=jnp.inf)
    wrong = jax.ops.segment_max((best & ~ok).astype(jnp.int32), rcv, num_segments=n) > 0
    named = jax.ops.segment_max(best.astype(jnp.int32), rcv, num_segments=n) > 0
    return loss, named & ~wrong


def choose_parent(
    scores: Float[Array, " E"], own: Float[Array, " n"], graph: Graph
) -> Int[Array, " n"]:
    """Each node's highest-scoring candidate parent `[n]` from a graph model's parent scores
    (each edge's `scores [E]`, the senders being the candidates, and each node's `own [n]` for
    itself); a tie goes to the smallest index, as `argmax` over a dense row would. (What
    `graphs.predict` answers adds the tie rule and the checks: see there.)

    **Example:**

    ```python
    import jax.numpy as jnp, eqattn
    from eqattn import graphs

    g = eqattn.Graph(jnp.array([1, 0, 2, 1]), jnp.array([0, 1, 1, 2]), num_nodes=3)  # 0 - 1 - 2
    scores, own = jnp.array([0.5, 2.0, 1.0, -1.0]), jnp.zeros(3)
    assert graphs.choose_parent(scores, own, g).tolist() == [1, 0, 2]
    ```
    """
    n = own.shape[0]
    s, snd, rcv = _with_self(scores, own, graph)
    top = jax.ops.segment_max(s, rcv, num_segments=n)
    best = s >= top.at[rcv].get(mode="fill", fill_value=jnp.inf)
    return jax.ops.segment_min(jnp.where(best, snd, n), rcv, num_segments=n)
