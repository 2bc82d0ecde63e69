r"""The graph models, one pair for every algorithm (`ALGORITHMS`): the DEQ, the library's
[`eqattn.nn.ImplicitGraphAttention`][] over the algorithm's step, and its explicit twin, untied
steps of the same kind ([`eqattn.nn.ExplicitGraphAttention`][]). The source is the anchor; each
edge's feature is its weight as the algorithm reads it (its weight rule). A node's parent
scores are its incoming edges' scores at the solved state; the source's and a node's with no
scored incoming edge are its own (reachability is the solve's flag: exact by construction).
Each model carries its `algorithm`, which [`predict`][eqattn.graphs.predict] reads."""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, PRNGKeyArray

from .. import nn
from .._graph import Graph
from .._solve import JacobianFree, Picard
from ..nn import Prediction
from ._algorithms import AbstractAlgorithm, algorithm_of

Inputs = tuple[Graph, Bool[ArrayLike, " n"]]
"""One graph as the models read it: an [`eqattn.Graph`][] (its one edge feature the weight;
padding: a receiver `n`) and which node is the source `[n]`."""


class ParentScores(NamedTuple):
    """A graph model's answer for one graph: each edge's score as its receiver's parent
    (`edges [E]`, $-\\infty$ for an edge into the source or from an unreached node), each
    node's score as its own parent (`own [n]`: 0 for the source and a node no scored edge
    reaches, $-\\infty$ otherwise), the edges that tie for their receiver's best (`best [E]`,
    in the step's sense), whether a node's choice is decisive and its state settled
    (`resolved [n]`), and which nodes the solve reached (`reached [n]`).

    **Example:**

    ```python
    from eqattn import graphs

    assert graphs.ParentScores._fields == ("edges", "own", "best", "resolved", "reached")
    ```
    """

    edges: Float[Array, " E"]
    own: Float[Array, " n"]
    best: Bool[Array, " E"]
    resolved: Bool[Array, " n"]
    reached: Bool[Array, " n"]


def read_out(scores: Float[Array, " E"], anchors, graph: Graph) -> tuple[Array, Array]:
    """`(edge scores [E], own scores [n])` (`ParentScores`)."""
    n = anchors.shape[0]
    receivers = jnp.asarray(graph.receivers)
    into_anchor = anchors.at[receivers].get(mode="fill", fill_value=False)
    scores = jnp.where(into_anchor, -jnp.inf, scores)
    live = jnp.isfinite(scores).astype(jnp.int32)
    has = jax.ops.segment_max(live, receivers, num_segments=n) > 0
    return scores, jnp.where(has, -jnp.inf, 0.0).astype(scores.dtype)


def _read(algorithm: AbstractAlgorithm, x: Inputs) -> tuple[Graph, Array, Array | None]:
    """The graph with the algorithm's edge features, the anchors, and the node features (a 1
    per node, for an algorithm whose source has a learned code)."""
    graph, anchors = x
    anchors = jnp.asarray(anchors)
    features = algorithm.edge_features(graph)
    g = Graph(graph.senders, graph.receivers, num_nodes=graph.num_nodes, edge_features=features)
    return g, anchors, jnp.ones((anchors.shape[0], 1), features.dtype)


class GraphDEQ(eqx.Module):
    """The graph task's DEQ: one [`eqattn.nn.ImplicitGraphAttention`][] over `algorithm`'s
    step of `width` (its `dim`), the source its anchor, learning `algorithm` (a name of
    `ALGORITHMS` or one of them). `model.predict((graph, anchors), budget=...)` gives its
    `ParentScores`; its `solver` defaults to Picard iteration within 4096 steps (a step moves
    what a node knows one edge) until every node's values move by at most the algorithm's `rtol`
    of their size, its `adjoint` to the Jacobian-free gradient.

    **Example:**

    ```python
    import jax, jax.numpy as jnp
    from eqattn import graphs

    model = graphs.GraphDEQ(4, "shortest-paths", key=jax.random.key(0))
    g = graphs.sample_weighted("delaunay", 8, 1, seed=0)
    one = jax.tree.map(lambda x: x[0], g.graph)
    scores = model.predict((one, jnp.arange(8) == g.source[0]), budget=24).logits
    assert scores.edges.shape == g.weights[0].shape and scores.own.shape == (8,)
    ```
    """

    layer: nn.ImplicitGraphAttention
    algorithm: AbstractAlgorithm = eqx.field(static=True)

    def __init__(
        self,
        width: int,
        algorithm: str | AbstractAlgorithm,
        *,
        key: PRNGKeyArray,
        solver=None,
        adjoint=None,
        dtype=None,
    ):
        self.algorithm = algorithm = algorithm_of(algorithm)
        kc, ks = jax.random.split(key)
        solver = solver or Picard(rtol=algorithm.rtol, atol=0.0, max_steps=4096, elementwise=True)
        self.layer = nn.ImplicitGraphAttention(
            algorithm.step(width, key=ks, dtype=dtype),
            encoder=algorithm.encoder(width, key=kc, dtype=dtype),
            solver=solver,
            adjoint=adjoint or JacobianFree(),
            dtype=dtype,
        )

    def refined(self) -> GraphDEQ | None:
        """The same model with a step of more capacity (the algorithm's `refined`), or None."""
        step = self.algorithm.refined(self.layer.step)
        return None if step is None else eqx.tree_at(lambda m: m.layer.step, self, step)

    @eqx.filter_jit  # one program: called eagerly, its solve's setup would compile op by op
    def predict(self, x: Inputs, *, budget=None, key=None, z0=None) -> Prediction:
        g, anchors, features = _read(self.algorithm, x)
        features = None if self.layer.encoder is None else features
        state, eq = self.layer.forward(g, anchors, features, z0=z0, budget=budget)
        resolved = self.layer.resolved(state, g) & eq.stats["settled"]
        edges, own = read_out(self.layer.scores(state, g), anchors, g)
        best = self.layer.step.best(state, g) & jnp.isfinite(edges)
        scores = ParentScores(edges, own, best, resolved, state.reached)
        return Prediction(scores, eq.steps, eq.relative_residual, eq.converged, state)


class GraphStack(eqx.Module):
    """The explicit twin: `depth` untied steps of `algorithm`'s kind and `width`
    ([`eqattn.nn.ExplicitGraphAttention`][]) applied once each (a node hears of the source only
    within `depth` edges), the parents read from the last one's scores.

    **Example:**

    ```python
    import jax, jax.numpy as jnp
    from eqattn import graphs

    model = graphs.GraphStack(2, 16, "bfs", key=jax.random.key(0))
    g = graphs.sample_weighted("path", 8, 1, seed=0)
    one = jax.tree.map(lambda x: x[0], g.graph)
    scores = model.predict((one, jnp.arange(8) == g.source[0])).logits
    assert scores.own.shape == (8,)
    ```
    """

    stack: nn.ExplicitGraphAttention
    algorithm: AbstractAlgorithm = eqx.field(static=True)

    def __init__(
        self,
        width: int,
        depth: int,
        algorithm: str | AbstractAlgorithm,
        *,
        key: PRNGKeyArray,
        dtype=None,
    ):
        self.algorithm = algorithm = algorithm_of(algorithm)
        kc, kb = jax.random.split(key)
        steps = [algorithm.step(width, key=k, dtype=dtype) for k in jax.random.split(kb, depth)]
        encoder = algorithm.encoder(width, key=kc, dtype=dtype)
        self.stack = nn.ExplicitGraphAttention(steps, encoder=encoder)

    def predict(self, x: Inputs, *, budget=None, key=None, z0=None) -> Prediction:
        g, anchors, features = _read(self.algorithm, x)
        features = None if self.stack.encoder is None else features
        state = self.stack(g, anchors, features)
        edges, own = read_out(self.stack.scores(state, g), anchors, g)
        best = self.stack.steps[-1].best(state, g) & jnp.isfinite(edges)
        scores = ParentScores(edges, own, best, self.stack.resolved(state, g), state.reached)
        return Prediction(scores, jnp.array(0), jnp.array(0.0), jnp.array(True), None)


def tied_twin(deq: GraphDEQ, depth: int) -> GraphStack:
    """The DEQ's own step, tied, applied `depth` times from zero states (its source code the
    DEQ's): what its trained step answers run as deep as the explicit twin, without being
    iterated to its fixed point; the fair control of the explicit twin.

    **Example:**

    ```python
    import equinox as eqx, jax
    from eqattn import graphs

    deq = graphs.GraphDEQ(4, "bfs", key=jax.random.key(0))
    twin = graphs.tied_twin(deq, 16)
    assert len(twin.stack.steps) == 16 and eqx.tree_equal(twin.stack.steps[5], deq.layer.step)
    ```
    """
    stack = nn.ExplicitGraphAttention([deq.layer.step] * depth, encoder=deq.layer.encoder)
    shell = GraphStack(1, 1, deq.algorithm, key=jax.random.key(0))
    return eqx.tree_at(lambda m: m.stack, shell, stack)


@eqx.filter_jit
def _solve(model, inputs, budget) -> tuple[ParentScores, Array, Array]:
    p = jax.vmap(lambda x: model.predict(x, budget=budget))(inputs)
    return p.logits, p.steps, p.converged


def solve_graphs(
    model, inputs, budget, *, refine: bool = True
) -> tuple[ParentScores, np.ndarray, np.ndarray]:
    """A batch's parent scores, each solve's steps and convergence (`inputs`: a batch of
    `Inputs`, a graph of `[B, E]` edges and the anchors `[B, n]`; numpy on the host). Where
    every solve converged but left a reached node unresolved and the model can carry more
    (`GraphDEQ.refined`: a spanning tree's lists cut short), it solves again with more, unless
    `refine` is False."""
    while True:
        scores, steps, converged = jax.device_get(_solve(model, inputs, budget))
        unresolved = np.any(np.asarray(scores.reached) & ~np.asarray(scores.resolved))
        better = getattr(model, "refined", lambda: None)() if unresolved and refine else None
        if better is None or not np.all(converged):
            return scores, steps, converged
        model = better
