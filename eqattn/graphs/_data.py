"""The graph task's examples: graphs drawn at random sizes and families, the nodes' inputs, the
targets the numpy BFS defines, and each node's loss and answers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ._bfs import bfs, valid_parents
from ._families import sample
from ._model import IDENTITY_DIM


def draw(
    rng: np.random.Generator, count: int, sizes: tuple[int, int], families, pad: int | None = None
):
    """`count` graphs of random families and sizes in `sizes` (both ends included), padded to
    `pad` nodes (default the largest size): `(adjacency, source, real)`."""
    low, high = sizes
    pad = pad or high
    adjacency = np.zeros((count, pad, pad), bool)
    source = np.zeros(count, np.int64)
    real = np.zeros((count, pad), bool)
    for b in range(count):
        family = families[rng.integers(len(families))]
        n = int(rng.integers(low, high + 1))
        g = sample(family, n, 1, seed=int(rng.integers(1 << 31)))
        adjacency[b, :n, :n], source[b], real[b, :n] = g.adjacency[0], g.source[0], True
    return adjacency, source, real


def examples(adjacency, source, real, rng: np.random.Generator):
    """A step's data: `((features, adjacency), (reach, parents, real))`, the nodes' identity
    vectors drawn from `rng`."""
    count, n = real.shape
    ids = rng.standard_normal((count, n, IDENTITY_DIM)).astype(np.float32)
    flag = np.zeros((count, n, 1), np.float32)
    flag[np.arange(count), source, 0] = 1.0
    reach, distance = bfs(adjacency, source)
    parents = valid_parents(adjacency, distance)
    inputs = (np.concatenate([ids * real[..., None], flag], -1), adjacency)
    return inputs, (reach & real, parents, real)


def node_scores(logits, targets):
    """Per node: the loss (binary cross-entropy of reachability, and minus the log-probability of
    the valid parents), and whether reachability and the parent are right."""
    reach_logits, scores = logits
    reach, parents, _ = targets
    bce = optax.sigmoid_binary_cross_entropy(reach_logits, reach.astype(reach_logits.dtype))
    logp = jax.nn.log_softmax(scores, -1)
    chosen = jnp.where(parents, logp, -jnp.inf)
    loss = bce - jax.scipy.special.logsumexp(chosen, -1)
    right_reach = (reach_logits > 0) == reach
    right_parent = jnp.take_along_axis(parents, jnp.argmax(scores, -1)[..., None], -1)[..., 0]
    return loss, right_reach, right_parent
