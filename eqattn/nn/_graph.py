r"""Graph steps composed into layers: `ImplicitGraphAttention` solves one step to its fixed point,
`ExplicitGraphAttention` applies untied steps once each (its explicit twin).

Both pin the anchors: an anchor's values are its code, `encoder(node_features)` (the zero state
without an encoder: the empty list of records, a distance 0), and its flag is 1. From zero
states the other nodes hear of the anchors one edge a step, so a solve takes about as many
steps as the farthest reached node is edges from them (plus a few to settle), and the explicit
stack of $L$ steps answers only within $L$ edges.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from .._errors import GraphError
from .._graph import Graph
from .._solve import RESULTS, AbstractAdjoint, Equilibrium, JacobianFree, Picard, Solver, choose
from ._graph_step import AbstractGraphStep, GraphState
from ._layer import AbstractEquilibriumLayer

MAX_STEPS = 4096
"""The default step limit of a graph layer's solver (`budget` overrides it per call)."""

SETTLED_ULPS = 16
"""A node has settled when one more step moves its values by no more than the solver's
relative tolerance, or this many roundings of their size, whichever is larger."""


def _anchor_values(encoder, anchors, node_features, width: int, dtype):
    """The anchors' code `[n, width]` from the node features (zeros without an encoder)."""
    a = jnp.asarray(anchors)
    if a.ndim != 1 or a.dtype != jnp.bool_:
        raise GraphError(
            f"`anchors` must be boolean [n] (one per node); got {a.dtype}{list(a.shape)}"
        )
    if encoder is None:
        if node_features is not None:
            raise GraphError("`node_features` are read by an encoder; this layer has none")
        return a, jnp.zeros((a.shape[0], width), dtype)
    x = jnp.asarray(node_features) if node_features is not None else None
    if x is None or x.ndim != 2 or x.shape[0] != a.shape[0]:
        shape = None if x is None else list(x.shape)
        raise GraphError(
            f"`node_features` must be [n, features] with n = {a.shape[0]}; got {shape}"
        )
    code = jax.vmap(encoder)(x)
    if code.shape != (a.shape[0], width):
        raise GraphError(
            f"the encoder must map a node's features to {width} values; got {code.shape}"
        )
    return a, code.astype(dtype)


def pin(state: GraphState, anchors: Bool[Array, " n"], code: Float[Array, "n w"]) -> GraphState:
    """`state` with the anchors' values their code and their flag 1."""
    values = jnp.where(anchors[:, None], code, state.values)
    return GraphState(values, jnp.where(anchors, 1.0, state.flag).astype(state.flag.dtype))


def _dtype(step: AbstractGraphStep, graph: Graph):
    leaves = [x for x in jax.tree.leaves(step) if eqx.is_inexact_array(x)]
    return jnp.result_type(*leaves, jnp.asarray(graph.edge_features).dtype)


class ImplicitGraphAttention(AbstractEquilibriumLayer):
    r"""A graph step ([`AbstractGraphStep`][eqattn.nn.AbstractGraphStep]: a
    [`GraphAttentionStep`][eqattn.nn.GraphAttentionStep], a
    [`GraphRecordsStep`][eqattn.nn.GraphRecordsStep]) solved to its fixed point, the anchors
    pinned to their code (module docstring).

    **Arguments:**

    - `step`: the step solved.
    - `encoder`: a module mapping one node's features to its `step.width` code (e.g.
      `eqx.nn.Linear`); None: the anchors hold the zero state and no node features are read.
    - `solver`, `adjoint`: as in [`eqattn.fixed_point`][] (default Picard iteration within
      `MAX_STEPS` steps until every entry of the state moves by at most the step's
      `default_rtol` of its size, `elementwise`, and the Jacobian-free gradient).
    - `throw`: raise (inside `jit` too) when the solve does not converge.

    Acts on one graph: `layer.forward(graph, anchors, node_features=None, *, z0=None,
    budget=None)` returns `(state, equilibrium)`, the [`GraphState`][eqattn.nn.GraphState] at
    the fixed point. A solve converges when the solver's test passes on the whole state *and*
    one more step moves no node's values by more than the tolerance of their own size, nor any
    flag (a front still moving far from the anchors is small against the whole state):
    `equilibrium.stats["settled"]` says per node, and a solve the second test fails ends with
    `RESULTS.unsettled`. `layer.scores(state, graph)` gives each edge's score (a node's best
    incoming edge names its choice, e.g. a parent) and `layer.resolved(state, graph)` whether
    that choice is decisive.

    **Example:**

    ```python
    import equinox as eqx, jax, jax.numpy as jnp, eqattn
    from eqattn import nn

    kc, ks = jax.random.split(jax.random.key(0))
    layer = nn.ImplicitGraphAttention(
        nn.GraphAttentionStep(4, 1, key=ks), encoder=eqx.nn.Linear(1, 4, key=kc)
    )
    g = eqattn.Graph(jnp.array([0, 1, 1, 2]), jnp.array([1, 0, 2, 1]), num_nodes=3,
                     edge_features=jnp.array([[0.5], [0.5], [2.0], [2.0]]))  # a path 0 - 1 - 2
    anchors = jnp.array([True, False, False])
    state, eq = layer.forward(g, anchors, jnp.ones((3, 1)))
    assert state.values.shape == (3, 4) and state.reached.all() and eq.converged
    assert int(eq.steps) <= 6  # two edges deep

    tree = nn.ImplicitGraphAttention(nn.GraphRecordsStep(4, key=ks))  # no encoder: empty lists
    lists, eq = tree.forward(g, anchors)
    scores = tree.scores(lists, g)
    assert scores[2] == 0.0 and scores[3] < 0.0  # 1 is 2's parent; 0 is 1's, not 2
    ```
    """

    step: AbstractGraphStep
    encoder: eqx.Module | Callable | None
    solver: Any
    adjoint: AbstractAdjoint
    throw: bool = eqx.field(static=True)

    def __init__(
        self,
        step: AbstractGraphStep,
        *,
        encoder: eqx.Module | Callable | None = None,
        solver: Solver | None = None,
        adjoint: AbstractAdjoint | None = None,
        throw: bool = False,
        dtype=None,
    ):
        if not isinstance(step, AbstractGraphStep):
            raise TypeError(f"`step` must be a graph step; got {type(step).__name__}")
        self.step, self.encoder = step, encoder
        default = Picard(rtol=step.default_rtol, atol=0.0, max_steps=MAX_STEPS, elementwise=True)
        self.solver, self.adjoint = self.solving(solver, adjoint or JacobianFree(), default, dtype)
        self.throw = throw

    def update(self, state: GraphState, code, anchors, graph: Graph) -> GraphState:
        """One step, the anchors pinned."""
        return pin(self.step(state, graph), anchors, code)

    def _settled(self, state: GraphState, code, anchors, graph: Graph) -> Bool[Array, " n"]:
        """Per node: one more step moves its values by at most the solver's tolerance of their
        size (at least `SETTLED_ULPS` roundings: a soft minimum of equal messages may round
        either way), and not its flag."""
        after = self.update(state, code, anchors, graph)
        eps = float(jnp.finfo(after.values.dtype).eps)
        rtol = max(getattr(self.solver, "rtol", 0.0), SETTLED_ULPS * eps)
        atol = getattr(self.solver, "atol", 0.0)
        moved = jnp.linalg.norm(after.values - state.values, axis=-1)
        size = jnp.linalg.norm(after.values, axis=-1)
        return (moved <= atol + rtol * size) & (after.flag == state.flag)

    def equilibrium(
        self,
        graph: Graph,
        anchors: Bool[ArrayLike, " n"],
        node_features: Float[ArrayLike, "n fn"] | None = None,
        *,
        z0: GraphState | None = None,
        budget: int | Int[ArrayLike, ""] | None = None,
    ) -> Equilibrium:
        """The fixed point of `update` from zero states (or `z0`); its `value` is a
        [`GraphState`][eqattn.nn.GraphState], its `stats["settled"]` per node (class
        docstring). Compiled as one program; the graph's values are checked before it."""
        graph = self.step.check(graph)  # values too, where they are concrete
        return self._equilibrium(graph, anchors, node_features, z0, self._run_budget(budget))

    @eqx.filter_jit
    def _equilibrium(self, graph: Graph, anchors, node_features, z0, budget) -> Equilibrium:
        dtype = _dtype(self.step, graph)
        a, code = _anchor_values(self.encoder, anchors, node_features, self.step.width, dtype)
        if a.shape[0] != graph.num_nodes:
            raise GraphError(
                f"`anchors` must be [{graph.num_nodes}] (one per node); got {list(a.shape)}"
            )
        start = GraphState.zeros(graph.num_nodes, self.step.width, dtype) if z0 is None else z0
        eq = self.solve(ImplicitGraphAttention.update, start, code, a, graph, budget=budget)
        settled = self._settled(eq.value, code, a, graph)
        moving = eq.converged & ~jnp.all(settled)
        result = choose(moving, RESULTS.unsettled, eq.result)
        value = result.error_if(eq.value, moving) if self.throw else eq.value
        return eqx.tree_at(
            lambda e: (e.value, e.result, e.stats),
            eq,
            (value, result, {**eq.stats, "settled": settled}),
        )

    def forward(
        self, graph: Graph, anchors, node_features=None, *, z0=None, budget=None
    ) -> tuple[GraphState, Equilibrium]:
        """`(state, equilibrium)` at the fixed point."""
        eq = self.equilibrium(graph, anchors, node_features, z0=z0, budget=budget)
        return eq.value, eq

    def scores(self, state: GraphState, graph: Graph) -> Float[Array, " E"]:
        """Each edge's score at `state` ($-\\infty$ from an unreached sender)."""
        return self.step.scores(state, graph)

    def resolved(self, state: GraphState, graph: Graph) -> Bool[Array, " n"]:
        """Per node, whether its best-scoring edge is decisive at `state` (the step's test)."""
        return self.step.resolved(state, graph)


class ExplicitGraphAttention(eqx.Module):
    """`steps`, untied graph steps of one width, applied once each from zero states, the anchors
    pinned to their code before and after every step (module docstring): what a node hears of
    the anchors comes within `len(steps)` edges. The explicit twin of an
    [`ImplicitGraphAttention`][eqattn.nn.ImplicitGraphAttention]; `scores` and `resolved` are
    the last step's.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn
    from eqattn import nn

    keys = jax.random.split(jax.random.key(0), 3)
    stack = nn.ExplicitGraphAttention([nn.GraphRecordsStep(2, key=k) for k in keys])
    g = eqattn.Graph(jnp.arange(5), jnp.arange(1, 6), num_nodes=6,
                     edge_features=jnp.ones((5, 1)))  # a directed path of 6 nodes
    state = stack(g, jnp.arange(6) == 0)
    assert state.reached.tolist() == [True] * 4 + [False] * 2  # three steps: three edges
    ```
    """

    steps: tuple[AbstractGraphStep, ...]
    encoder: eqx.Module | Callable | None

    def __init__(self, steps, *, encoder: eqx.Module | Callable | None = None):
        steps = tuple(steps)
        if not steps or not all(isinstance(s, AbstractGraphStep) for s in steps):
            raise TypeError("`steps` must be one or more graph steps")
        if len({(s.width, s.edge_features) for s in steps}) > 1:
            raise ValueError("`steps` must share one width and one count of edge features")
        self.steps, self.encoder = steps, encoder

    def __call__(
        self,
        graph: Graph,
        anchors: Bool[ArrayLike, " n"],
        node_features: Float[ArrayLike, "n fn"] | None = None,
    ) -> GraphState:
        """The state after the last step."""
        last = self.steps[-1]
        graph = last.check(graph)
        dtype = _dtype(last, graph)
        a, code = _anchor_values(self.encoder, anchors, node_features, last.width, dtype)
        state = pin(GraphState.zeros(graph.num_nodes, last.width, dtype), a, code)
        for step in self.steps:
            state = pin(step(state, graph), a, code)
        return state

    def scores(self, state: GraphState, graph: Graph) -> Float[Array, " E"]:
        """Each edge's score by the last step."""
        return self.steps[-1].scores(state, graph)

    def resolved(self, state: GraphState, graph: Graph) -> Bool[Array, " n"]:
        """Per node, whether the last step's choice is decisive."""
        return self.steps[-1].resolved(state, graph)
