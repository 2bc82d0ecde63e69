r"""What every step of attention over a graph's incoming edges shares: its state, a pytree of the
nodes' values and their reach flag, and the contract of an `AbstractGraphStep` (its width, its
edge features, each edge's score, whether a node's choice is decisive, its own default
temperature and solver tolerance).

A step maps a state to the next: node $i$ hears the edges $j \to i$ from flagged senders (a
flag is 1 where a node holds something: an anchor, or a node a flagged node sends to), scores
them, and takes what its best scores say; a node that hears nothing keeps the state 0 and the
flag 0. Reachability is therefore exact by construction. The sender of a node's best-scoring
edge is its *choice* (a parent, in the graph task), and `resolved` says where that choice is
decisive: where the step's soft minimum separated it from the rest, or it ties with an equal
candidate.
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from .._errors import GraphError
from .._graph import Graph, check_graph

MARGIN = 16.0
"""Nats by which a node's best score must beat the next candidate's for its choice to be
decisive (the next candidate's softmax weight below $e^{-16} \approx 10^{-7}$, what float32
resolves)."""

TIE = 2.0**-22
"""Messages within this relative distance of each other (about 2.4e-7, two float32 roundings)
are equal: a tie, either choice right. A graph task that scores answers to a relative 1e-6
leaves the rest of that margin to the rounding of the states."""


class GraphState(eqx.Module):
    """The state of a graph step: each node's `values [n, width]` and its reach `flag [n]`
    (1.0 where the node holds something, 0.0 elsewhere; a float, so that a solver's residual
    counts a flag that flips).

    **Example:**

    ```python
    import jax.numpy as jnp
    from eqattn.nn import GraphState

    state = GraphState.zeros(3, 2, jnp.float32)
    assert state.values.shape == (3, 2) and not state.reached.any()
    ```
    """

    values: Float[Array, "n width"]
    flag: Float[Array, " n"]

    def __init__(self, values: Float[ArrayLike, "n width"], flag: Float[ArrayLike, " n"]):
        self.values, self.flag = jnp.asarray(values), jnp.asarray(flag)

    @property
    def reached(self) -> Bool[Array, " n"]:
        """Which nodes hold something: the flag, as booleans."""
        return self.flag > 0.5

    @staticmethod
    def zeros(n: int, width: int, dtype) -> GraphState:
        """Every node's values 0, nothing reached."""
        return GraphState(jnp.zeros((n, width), dtype), jnp.zeros((n,), dtype))


def live_edges(state: GraphState, graph: Graph) -> Bool[Array, " E"]:
    """The real edges whose sender is flagged."""
    s = jnp.clip(jnp.asarray(graph.senders), 0, graph.num_nodes - 1)
    return graph.real & state.reached[s]


def heard(live: Bool[Array, " E"], graph: Graph) -> Bool[Array, " n"]:
    """The nodes that at least one `live` edge reaches."""
    count = jax.ops.segment_max(
        live.astype(jnp.int32), jnp.asarray(graph.receivers), graph.num_nodes
    )
    return count > 0


def best_edge(scores: Float[Array, " E"], graph: Graph) -> tuple[Array, Array]:
    """Per node: its best incoming score (-inf with none) and the first edge that has it (`E`
    with none)."""
    r, n, count = jnp.asarray(graph.receivers), graph.num_nodes, scores.shape[0]
    top = jax.ops.segment_max(scores, r, num_segments=n)
    at = top.at[r].get(mode="fill", fill_value=jnp.inf)
    first = jax.ops.segment_min(
        jnp.where((scores >= at) & (scores > -jnp.inf), jnp.arange(count), count),
        r,
        num_segments=n,
    )
    return top, jnp.minimum(first, count)


def decisive(scores: Float[Array, " E"], best: Bool[Array, " E"], graph: Graph) -> Array:
    """Per node: no scored edge other than its `best` ones comes within `MARGIN` nats of its
    best score (True for a node without a scored edge)."""
    r, n = jnp.asarray(graph.receivers), graph.num_nodes
    top = jax.ops.segment_max(scores, r, num_segments=n)
    at = top.at[r].get(mode="fill", fill_value=jnp.inf)
    close = jnp.isfinite(scores) & ~best & (scores > at - MARGIN)
    return ~(jax.ops.segment_max(close.astype(jnp.int32), r, num_segments=n) > 0)


class AbstractGraphStep(eqx.Module):
    r"""One step of attention over a graph's incoming edges (module docstring). A final step
    class defines `width` and `edge_features`, `__call__(state, graph) -> state`,
    `scores(state, graph) -> [E]` (each edge's score, $-\infty$ from an unflagged sender or a
    padding edge), `best(state, graph) -> [E]` (the edges that tie for their receiver's best
    score, in the step's own sense of a tie: equal messages), and its defaults `default_beta`
    (the inverse temperature it starts at) and `default_rtol` (the relative tolerance a solve
    of it stops at). `resolved(state, graph)` says per node whether its choice is decisive: no
    other candidate within `MARGIN` nats of its best (where one is, the soft minimum blended
    them); a step with more to say overrides it.

    [`ImplicitGraphAttention`][eqattn.nn.ImplicitGraphAttention] solves one to its fixed point;
    [`ExplicitGraphAttention`][eqattn.nn.ExplicitGraphAttention] stacks untied ones.
    """

    default_beta: eqx.AbstractClassVar[float]
    default_rtol: eqx.AbstractClassVar[float]

    @property
    @abc.abstractmethod
    def width(self) -> int:
        """The channels of a node's values."""

    @property
    @abc.abstractmethod
    def edge_features(self) -> int:
        """The features each edge carries."""

    @abc.abstractmethod
    def __call__(self, state: GraphState, graph: Graph) -> GraphState:
        """The next state."""

    @abc.abstractmethod
    def scores(self, state: GraphState, graph: Graph) -> Float[Array, " E"]:
        """Each edge's score at `state` (-inf from an unflagged sender or on padding)."""

    @abc.abstractmethod
    def best(self, state: GraphState, graph: Graph) -> Bool[Array, " E"]:
        """The edges that tie for their receiver's best score (class docstring)."""

    def resolved(self, state: GraphState, graph: Graph) -> Bool[Array, " n"]:
        """Per node, whether its choice is decisive (class docstring); True for a node without
        a scored edge (it has no choice to make)."""
        return decisive(self.scores(state, graph), self.best(state, graph), graph)

    def check(self, graph: Graph) -> Graph:
        """`graph`, checked for this step: one graph (`[E]` edges) with `edge_features`
        features per edge."""
        check_graph(graph, edge_features=self.edge_features)
        if jnp.ndim(graph.senders) != 1:
            raise GraphError(
                f"a graph step acts on one graph, edges [E]; got senders of shape "
                f"{list(jnp.shape(graph.senders))} (jax.vmap over a batch)"
            )
        return graph
