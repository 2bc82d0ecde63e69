r"""The graph models, one for every algorithm (BFS, shortest paths, spanning trees): the
library's [`eqattn.nn.ImplicitGraphAttention`][] with the source as its anchor and each edge's
weight as its feature (over the graph's mean edge weight; BFS reads every weight as 1), and its
explicit twin, untied [`eqattn.nn.GraphAttentionStep`][]s. A node's parent is read from the
edges' scores at the solved states: its best incoming edge's sender, or itself for the source
and a node no reached node sends to (reachability is the solve's flag: exact by construction).
Each model carries the `algorithm` it learns, which [`predict`][eqattn.graphs.predict] reads.
Spanning trees (`mst`) take the layer's records (`records=True`: `RECORDS` of them, the width
setting the weight map's units); BFS and shortest paths its shift and bottleneck channels."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray

from .. import nn
from .._solve import JacobianFree, Picard
from ..nn import Prediction
from ._edges import choose_parent
from ._weighted import ALGORITHMS

Inputs = tuple[
    Bool[ArrayLike, " n"], Int[ArrayLike, " E"], Int[ArrayLike, " E"], Float[ArrayLike, " E"]
]
"""One graph: which node is the source `[n]`, then each directed edge's sender, receiver (`n`:
padding) and weight `[E]`."""


RECORDS = 16
"""The spanning-tree models' records per node: a path's records number about the log of its
length plus 0.58 (the `spanning` benchmark), so that 16 leave few nodes tied on graphs of
thousands of nodes."""


def read_out(scores: Float[Array, " E"], anchors, receivers) -> tuple[Array, Array]:
    """`(edge scores [E], own scores [n])`: a node's candidate parents are its incoming edges'
    senders (an edge into the source is never one) and itself, which wins (score 0 against
    -inf) for the source and a node without a scored incoming edge."""
    n = anchors.shape[0]
    into_anchor = anchors.at[receivers].get(mode="fill", fill_value=False)
    scores = jnp.where(into_anchor, -jnp.inf, scores)
    live = jnp.isfinite(scores).astype(jnp.int32)
    has = jax.ops.segment_max(live, receivers, num_segments=n) > 0
    return scores, jnp.where(has, -jnp.inf, 0.0).astype(scores.dtype)


def relative_weights(weights: Float[Array, " E"], receivers, n: int) -> Float[Array, "E 1"]:
    """Each edge's weight over its graph's mean edge weight, as the edge features: shortest
    paths and spanning trees do not change when every weight is scaled, and so the models'
    answers do not either (16-node training graphs in the unit square, and a road map in any
    unit, read alike). Padding, and a graph whose weights are all 0, stay 0."""
    real = receivers < n
    mean = jnp.sum(jnp.where(real, weights, 0.0)) / jnp.maximum(jnp.sum(real), 1)
    return jnp.where(real, weights / jnp.where(mean > 0, mean, 1.0), 0.0)[:, None]


def _node_features(anchors, dtype) -> Float[Array, "n 1"]:
    return jnp.ones((anchors.shape[0], 1), dtype)


def _check_algorithm(algorithm: str) -> None:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"`algorithm` must be one of {', '.join(ALGORITHMS)}; got {algorithm!r}")


class GraphDEQ(eqx.Module):
    """The graph task's DEQ: one [`eqattn.nn.ImplicitGraphAttention`][] (its state `width`
    channels, half of them bottleneck channels; for `mst`, `RECORDS` records and a weight map
    of `width` units), the source its anchor, the weights its edge
    features, learning `algorithm` (`ALGORITHMS`). `model.predict((anchors, senders,
    receivers, weights), budget=...)` gives the parent scores `(each edge's [E], each node's
    own [n])`; its `solver` defaults to Picard iteration to `rtol` 1e-4 within 4096 steps (a
    step moves what a node knows one edge), its `adjoint` to the Jacobian-free gradient.

    **Example:**

    ```python
    import jax, jax.numpy as jnp
    from eqattn import graphs

    model = graphs.GraphDEQ(4, "shortest-paths", key=jax.random.key(0))
    g = graphs.sample_weighted("delaunay", 8, 1, seed=0)
    anchors = jnp.arange(8) == g.source[0]
    x = (anchors, g.edges.senders[0], g.edges.receivers[0], g.weights[0])
    edge_scores, own = model.predict(x, budget=24).logits
    assert edge_scores.shape == g.weights[0].shape and own.shape == (8,)
    ```
    """

    layer: nn.ImplicitGraphAttention
    algorithm: str = eqx.field(static=True)

    def __init__(
        self,
        width: int,
        algorithm: str,
        *,
        key: PRNGKeyArray,
        solver=None,
        adjoint=None,
        dtype=None,
    ):
        _check_algorithm(algorithm)
        self.algorithm = algorithm
        rtol = 1e-7 if algorithm == "mst" else 1e-4  # as `GraphConfig`'s
        solver = solver or Picard(rtol=rtol, atol=1e-6, max_steps=4096)
        adjoint = adjoint or JacobianFree()
        if algorithm == "mst":
            self.layer = nn.ImplicitGraphAttention(
                RECORDS, 1, 1, key=key, records=True, units=width, solver=solver,
                adjoint=adjoint, dtype=dtype,
            )  # fmt: skip
        else:
            self.layer = nn.ImplicitGraphAttention(
                width, 1, 1, key=key, solver=solver, adjoint=adjoint, dtype=dtype
            )

    def predict(self, x: Inputs, *, budget=None, key=None, z0=None) -> Prediction:
        anchors, senders, receivers, weights = map(jnp.asarray, x)
        edges = relative_weights(weights, receivers, anchors.shape[0])
        features = _node_features(anchors, weights.dtype)
        (z, reached), eq = self.layer.forward(
            features, anchors, senders, receivers, edges, z0=z0, budget=budget
        )
        scores = self.layer.scores(z, reached, senders, receivers, edges)
        logits = read_out(scores, anchors, receivers)
        return Prediction(logits, eq.steps, eq.relative_residual, eq.converged, eq.value)


class GraphStack(eqx.Module):
    """The explicit twin: the source's code, then `depth` untied
    [`eqattn.nn.GraphAttentionStep`][]s applied once each (a node hears of the source only
    within `depth` edges), the parents read from the last one's scores; for `mst`,
    [`eqattn.nn.GraphRecordsStep`][]s of `RECORDS` records and `width` weight-map units, the
    source's list empty.

    **Example:**

    ```python
    import jax, jax.numpy as jnp
    from eqattn import graphs

    model = graphs.GraphStack(2, 16, "bfs", key=jax.random.key(0))
    g = graphs.sample_weighted("path", 8, 1, seed=0)
    x = (jnp.arange(8) == g.source[0], g.edges.senders[0], g.edges.receivers[0], g.weights[0])
    edge_scores, own = model.predict(x).logits
    assert own.shape == (8,)
    ```
    """

    code: eqx.nn.Linear | None
    blocks: tuple[nn.GraphAttentionStep | nn.GraphRecordsStep, ...]
    algorithm: str = eqx.field(static=True)

    def __init__(self, width: int, depth: int, algorithm: str, *, key: PRNGKeyArray, dtype=None):
        _check_algorithm(algorithm)
        self.algorithm = algorithm
        kc, kb = jax.random.split(key)
        keys = jax.random.split(kb, depth)
        self.blocks: tuple[nn.GraphAttentionStep | nn.GraphRecordsStep, ...]
        if algorithm == "mst":
            self.code = None
            self.blocks = tuple(
                nn.GraphRecordsStep(RECORDS, key=k, units=width, dtype=dtype) for k in keys
            )
        else:
            self.code = eqx.nn.Linear(1, width, key=kc, dtype=dtype)
            self.blocks = tuple(nn.GraphAttentionStep(width, 1, key=k, dtype=dtype) for k in keys)

    def predict(self, x: Inputs, *, budget=None, key=None, z0=None) -> Prediction:
        anchors, senders, receivers, weights = map(jnp.asarray, x)
        edges = relative_weights(weights, receivers, anchors.shape[0])
        if self.code is None:  # the records' source holds the empty list
            code = jnp.zeros((anchors.shape[0], RECORDS), weights.dtype)
        else:
            code = jax.vmap(self.code)(_node_features(anchors, weights.dtype))
        pin = anchors[:, None]
        z, flag = jnp.where(pin, code, 0.0), anchors.astype(weights.dtype)
        for block in self.blocks:
            z, flag = block(z, flag, senders, receivers, edges)
            z, flag = jnp.where(pin, code, z), jnp.where(anchors, 1.0, flag)
        scores = self.blocks[-1].scores(z, flag, senders, receivers, edges)
        logits = read_out(scores, anchors, receivers)
        return Prediction(logits, jnp.array(0), jnp.array(0.0, z.dtype), jnp.array(True), None)


@eqx.filter_jit
def solve_graphs(model, inputs, budget):
    """Each node's parent, each solve's steps and convergence, for a batch."""
    p = jax.vmap(lambda x: model.predict(x, budget=budget))(inputs)
    parent = jax.vmap(choose_parent)(*p.logits, *inputs[1:3])
    return parent, p.steps, p.converged
