"""The graph task's examples: graphs drawn at random sizes and families, the nodes' inputs, the
targets the numpy BFS defines, and each node's loss and answers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ._bfs import bfs, valid_parents
from ._edges import DENSE_UP_TO, EDGES_PER_NODE, edge_list, parent_loss_and_right, parent_targets
from ._families import sample
from ._model import IDENTITY_DIM


def draw(
    rng: np.random.Generator, count: int, sizes: tuple[int, int], families, pad: int | None = None
):
    """`count` graphs of random families and sizes in `sizes` (both ends included), padded to
    `pad` nodes (default the largest size): `(adjacency, source, real)`. Above `DENSE_UP_TO`
    nodes a graph of more than `EDGES_PER_NODE * pad` directed edges is drawn again (the
    families come nowhere near it)."""
    low, high = sizes
    pad = pad or high
    adjacency = np.zeros((count, pad, pad), bool)
    source = np.zeros(count, np.int64)
    real = np.zeros((count, pad), bool)
    for b in range(count):
        family = families[rng.integers(len(families))]
        n = int(rng.integers(low, high + 1))
        g = sample(family, n, 1, seed=int(rng.integers(1 << 31)))
        while pad > DENSE_UP_TO and g.adjacency.sum() > EDGES_PER_NODE * pad:
            g = sample(family, n, 1, seed=int(rng.integers(1 << 31)))
        adjacency[b, :n, :n], source[b], real[b, :n] = g.adjacency[0], g.source[0], True
    return adjacency, source, real


def examples(adjacency, source, real, rng: np.random.Generator, edges: int | None = None):
    """A step's data: `((features, *graph), (reach, parents, real))`, the nodes' identity vectors
    drawn from `rng`. Up to `DENSE_UP_TO` nodes the graph is its adjacency and `parents [B, n, n]`
    the valid BFS parents; above, the graph is `(senders, receivers)` padded to `edges` per graph
    (default `EDGES_PER_NODE` per node) and `parents` is `(edge_ok [B, E], self_ok [B, n])`: which
    edges' senders, and which nodes themselves, are valid parents."""
    count, n = real.shape
    ids = rng.standard_normal((count, n, IDENTITY_DIM)).astype(np.float32)
    flag = np.zeros((count, n, 1), np.float32)
    flag[np.arange(count), source, 0] = 1.0
    reach, distance = bfs(adjacency, source)
    x = np.concatenate([ids * real[..., None], flag], -1)
    if n <= DENSE_UP_TO:
        return (x, adjacency), (reach & real, valid_parents(adjacency, distance), real)
    g = edge_list(adjacency, EDGES_PER_NODE * n if edges is None else edges)
    targets = parent_targets(g.senders, g.receivers, distance)
    return (x, g.senders, g.receivers), (reach & real, targets, real)


def node_scores(logits, inputs, targets):
    """Per node: the loss (binary cross-entropy of reachability, and minus the log-probability of
    the valid parents), and whether reachability and the parent are right (a batch, either form
    of `examples`)."""
    reach_logits = logits[0]
    reach, parents, _ = targets
    bce = optax.sigmoid_binary_cross_entropy(reach_logits, reach.astype(reach_logits.dtype))
    if len(inputs) == 3:  # edge lists
        lost, right_parent = jax.vmap(parent_loss_and_right)(*logits[1:], *inputs[1:], *parents)
        return bce + lost, (reach_logits > 0) == reach, right_parent
    scores = logits[1]
    logp = jax.nn.log_softmax(scores, -1)
    chosen = jnp.where(parents, logp, -jnp.inf)
    loss = bce - jax.scipy.special.logsumexp(chosen, -1)
    right_reach = (reach_logits > 0) == reach
    right_parent = jnp.take_along_axis(parents, jnp.argmax(scores, -1)[..., None], -1)[..., 0]
    return loss, right_reach, right_parent
