"""Predictions of a trained graph model on any graphs, and loading one from a run."""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._errors import ConfigError
from ._bfs import check_graphs
from ._model import IDENTITY_DIM


def budget_for(n: int) -> int:
    """The solver's step budget for graphs of `n` nodes: `2 n + 8`. A node's state changes in
    the step after its parent's did, so a solve from zero states takes the source's
    eccentricity (at most `n - 1`) plus a step or two to see nothing move; twice that keeps a
    margin.

    **Example:**

    ```python
    from eqattn import graphs

    assert graphs.budget_for(16) == 40 and graphs.budget_for(256) == 520
    ```
    """
    return 2 * int(n) + 8


class GraphPrediction(NamedTuple):
    """`reachable [B, n]` (bool), each node's `parent [B, n]` (int: itself for the source and
    the unreachable), and each graph's solve: `steps [B]` and `converged [B]` (an explicit
    model's are 0 and True).

    **Example:**

    ```python
    from eqattn import graphs

    assert graphs.GraphPrediction._fields == ("reachable", "parent", "steps", "converged")
    ```
    """

    reachable: np.ndarray
    parent: np.ndarray
    steps: np.ndarray
    converged: np.ndarray


def features(source: np.ndarray, n: int, key) -> jax.Array:
    """Every node's input `[B, n, IDENTITY_DIM + 1]`: a random identity vector drawn with `key`
    (normal, one per node and graph), then the source flag.

    **Example:**

    ```python
    import jax, numpy as np
    from eqattn import graphs

    x = graphs.features(np.array([2, 0]), 5, jax.random.key(0))
    assert x.shape == (2, 5, graphs.IDENTITY_DIM + 1) and x[0, 2, -1] == 1 and x[:, :, -1].sum() == 2
    ```
    """
    ids = jax.random.normal(key, (len(source), n, IDENTITY_DIM))
    flag = jax.nn.one_hot(jnp.asarray(source), n)[..., None]
    return jnp.concatenate([ids, flag.astype(ids.dtype)], axis=-1)


@eqx.filter_jit
def _solve(model, features, adjacency, budget):
    p = jax.vmap(lambda f, a: model.predict((f, a), budget=budget))(features, adjacency)
    reach, scores = p.logits
    return reach > 0, jnp.argmax(scores, -1), p.steps, p.converged


def _bucket(size: int) -> int:
    """`size` rounded up to a power of two (at least 8): a few shapes, a few compilations."""
    return max(8, 1 << (int(size) - 1).bit_length())


def predict(model, adjacency, source, *, budget=None, key=None) -> GraphPrediction:
    """Reachability and a BFS parent for every node of each graph (`adjacency [B, n, n]` bool,
    `source [B]` int, numpy or JAX arrays; any n and batch: padded inside with isolated nodes and
    empty graphs, which change nothing), from a model of `eqattn train --task graphs`
    ([`load_model`][eqattn.graphs.load_model]). A DEQ's solve gets `budget` steps (default the
    rule [`budget_for`][eqattn.graphs.budget_for] of n; at least 1); `key` draws the nodes'
    identity vectors (default `jax.random.key(0)`). Bad input is a `ValueError` naming the
    argument.

    **Example:**

    ```python
    import jax
    from eqattn import graphs

    model = graphs.GraphDEQ(16, key=jax.random.key(0))  # untrained: shapes only
    g = graphs.sample("tree", 10, 3, seed=0)
    out = graphs.predict(model, g.adjacency, g.source)
    assert out.reachable.shape == out.parent.shape == (3, 10) and out.steps.shape == (3,)
    ```
    """
    adjacency, source = check_graphs(adjacency, source)
    if budget is not None and not (isinstance(budget, int | np.integer) and budget >= 1):
        raise ConfigError(f"`budget` must be an integer >= 1 (solver steps); got {budget!r}")
    count, n = adjacency.shape[:2]
    rows, size = _bucket(count), _bucket(n)
    padded = np.zeros((rows, size, size), bool)
    padded[:count, :n, :n] = adjacency
    src = np.zeros(rows, np.int64)
    src[:count] = source
    key = jax.random.key(0) if key is None else key
    x = features(src, size, key).at[count:].set(0.0)  # no source in the padding's graphs
    steps = jnp.asarray(budget_for(n) if budget is None else budget)
    reach, parent, used, converged = jax.device_get(_solve(model, x, padded, steps))
    return GraphPrediction(reach[:count, :n], parent[:count, :n], used[:count], converged[:count])
