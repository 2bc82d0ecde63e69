r"""`GraphRecordsStep`: attention over a graph's incoming edges on lists of records, the
$(\min, \max)$ semiring extended to the lexicographic order that names a minimum spanning tree.

A node's state is a list of $k$ *records* $r_1 > r_2 > \dots$ (0 past its end): the suffix
maxima of the weights along its path from the anchor, the largest first (the path's last edge
is always one). The edge $e = j \to i$ of (mapped) weight $w_e$ extends $j$'s list:

$$m_{e,l} = \begin{cases} \max(r_{j,l},\, w_e) & w_e < r_{j,l-1} \\ 0 & \text{else}
\end{cases} \qquad (r_{j,0} = +\infty),$$

the records heavier than $w_e$, then $w_e$ itself. Node $i$ takes the least of its messages in
the lexicographic order, one level at a time: level $l$'s soft minimum over the edges that tie
at the levels above, the attention-weighted mean of their $m_{e,l}$ with the scores
$-\beta\, m_{e,l}$ ([`eqattn.segment_softmin`][]); an edge ties at a level
when its message is within a relative `TIE` of that minimum. The minimum spanning tree's path
from the anchor to every node is the lexicographically least list of records (every weight
distinct: Prim's tree), so with hard minima the fixed point names each node's tree parent: the
sender of its tying edge. From the anchor's empty list the solve takes about as many steps as
the tree is deep. A list holds $k$ records: a path with more (their number grows like the log of
its length) drops its lightest, and a node's children can then tie with its parent.

The edge weights enter through a learned increasing map $w \mapsto \sum_u a_u\,
\mathrm{softplus}(b_u w + c_u)$ ($a_u, b_u > 0$): positive, and any increasing map gives the
same tree, so what is learned is its scale against $\beta$. Two edges of one weight can tie:
give distinct weights (the graph task gives each edge its rank under a tie rule), or a node
whose least lists tie is not `resolved`.
"""

from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, PRNGKeyArray

from .._graph import Graph, segment_softmin
from ._graph_attention import check_beta, check_sizes
from ._graph_step import AbstractGraphStep, GraphState, decisive, heard, live_edges

RECORDS_BETA = 1e5
"""The default initial inverse temperature of the records' soft minima: near the tropical
limit, where they are the minima."""

TIE = 1e-6
"""Messages within this relative distance of a level's soft minimum tie at that level."""


def extend(r: Float[Array, "E k"], w: Float[Array, " E"]) -> Float[Array, "E k"]:
    """Each edge's list: the sender's records `r` heavier than `w`, then `w` (0 past the end,
    the lightest dropped past `k`)."""
    above = jnp.concatenate([jnp.full_like(r[:, :1], jnp.inf), r[:, :-1]], axis=1)
    return jnp.where(w[:, None] < above, jnp.maximum(r, w[:, None]), 0.0)


def lexicographic(m: Float[Array, "E k"], live: Array, graph: Graph, beta):
    """Per node the least list of its `live` edges' `m`, level by level by soft minima (a scan
    over the levels); each edge's tie after the last level; each edge's gap, its message above
    the level's minimum at the first level where it stops tying (0 for an edge that ties at
    every level)."""
    receivers, n = jnp.asarray(graph.receivers), graph.num_nodes

    def level(carry, v):
        tie, gap = carry
        least = segment_softmin(v, receivers, n, beta=beta, where=tie)
        at = least.at[receivers].get(mode="fill", fill_value=0.0)
        keep = tie & (v <= at * (1 + TIE))
        return (keep, jnp.where(tie & ~keep, v - at, gap)), least

    (tie, gap), least = jax.lax.scan(level, (live, jnp.zeros_like(m[:, 0])), m.T)
    return least.T, tie, gap


class GraphRecordsStep(AbstractGraphStep):
    r"""One step of attention over incoming edges on lists of `records` records (module
    docstring): each flagged sender's list extended by the edge's mapped weight, the least of
    them per node by soft minima level by level.

    **Arguments:** `records` (the list's length, the state's channels), `key`; `units`, the
    weight map's units (default 1); `beta`, the initial inverse temperature (learned; default
    `RECORDS_BETA`). The edge features are one per edge: its weight. A solve of it stops when
    every record moves by at most `default_rtol` (1e-6) of its size.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn
    from eqattn.nn import GraphRecordsStep, GraphState

    step = GraphRecordsStep(3, key=jax.random.key(0))
    g = eqattn.Graph(jnp.array([0, 1, 1, 2]), jnp.array([1, 0, 2, 1]), num_nodes=3,
                     edge_features=jnp.array([[2.0], [2.0], [0.5], [0.5]]))  # a path 0 - 1 - 2
    state = GraphState(jnp.zeros((3, 3)), jnp.array([1.0, 0.0, 0.0]))  # node 0's list empty
    for _ in range(3):
        state = step(state, g)
        state = GraphState(state.values.at[0].set(0.0), state.flag.at[0].set(1.0))  # the anchor
    heavy, light = step.weight_map(jnp.array([2.0, 0.5]))
    assert jnp.allclose(state.values[2], jnp.array([heavy, light, 0.0]))  # both are records
    ```
    """

    log_scale: Float[Array, " units"]
    log_slope: Float[Array, " units"]
    offset: Float[Array, " units"]
    log_beta: Float[Array, ""]
    records: int = eqx.field(static=True)

    default_beta: ClassVar[float] = RECORDS_BETA
    default_rtol: ClassVar[float] = 1e-6

    def __init__(
        self,
        records: int,
        *,
        key: PRNGKeyArray,
        units: int = 1,
        beta: float = RECORDS_BETA,
        dtype=None,
    ):
        check_sizes(records=records, units=units)
        beta = check_beta(beta)
        dtype = dtype or jnp.result_type(float)
        self.log_scale = jnp.full((units,), -jnp.log(units), dtype)
        self.log_slope = jnp.zeros((units,), dtype)
        self.offset = jax.random.normal(key, (units,), dtype)
        self.log_beta = jnp.asarray(jnp.log(beta), dtype)
        self.records = records

    @property
    def width(self) -> int:
        """The state's channels: `records`."""
        return self.records

    def with_records(self, records: int) -> GraphRecordsStep:
        """The same step (its weight map and temperature) carrying `records` records: more
        where a list was cut short (the parameters do not depend on the count)."""
        check_sizes(records=records)
        units, dtype = self.log_scale.shape[0], self.log_scale.dtype
        wider = GraphRecordsStep(records, key=jax.random.key(0), units=units, dtype=dtype)
        return eqx.tree_at(
            lambda s: (s.log_scale, s.log_slope, s.offset, s.log_beta),
            wider,
            (self.log_scale, self.log_slope, self.offset, self.log_beta),
        )

    @property
    def edge_features(self) -> int:
        """The features per edge: one, the weight."""
        return 1

    def weight_map(self, w: Float[ArrayLike, "*shape"]) -> Float[Array, "*shape"]:
        r"""The increasing, positive map $\sum_u a_u \mathrm{softplus}(b_u w + c_u)$."""
        w = jnp.asarray(w)[..., None]
        units = jax.nn.softplus(jnp.exp(self.log_slope) * w + self.offset)
        return units @ jnp.exp(self.log_scale)

    def messages(self, state: GraphState, graph: Graph) -> Float[Array, "E k"]:
        """Each edge's list: the sender's extended by the edge's mapped weight."""
        s = jnp.clip(jnp.asarray(graph.senders), 0, graph.num_nodes - 1)
        w = self.weight_map(jnp.asarray(graph.edge_features)[:, 0])
        return extend(state.values[s], w)

    def _select(self, state: GraphState, graph: Graph):
        live = live_edges(state, graph)
        m = self.messages(state, graph)
        return (*lexicographic(m, live, graph, jnp.exp(self.log_beta)), live)

    def scores(self, state: GraphState, graph: Graph) -> Float[Array, " E"]:
        r"""Each edge's score: $-\beta$ times its gap (0 for the edges a node's least list
        comes from); $-\infty$ from a sender not flagged, and on padding."""
        _, _, gap, live = self._select(state, graph)
        return jnp.where(live, -jnp.exp(self.log_beta) * gap, -jnp.inf)

    def best(self, state: GraphState, graph: Graph) -> Bool[Array, " E"]:
        """The edges a node's least list comes from: those that tie at every level."""
        _, tie, _, live = self._select(state, graph)
        return tie & live

    def resolved(self, state: GraphState, graph: Graph) -> Bool[Array, " n"]:
        """Per node, whether one edge alone holds its least list (two that tie at every level
        are lists cut at `records`, or weights that tie: not resolved) and the next is `MARGIN`
        nats behind or more; True for a node without a flagged sender."""
        best = self.best(state, graph)
        r, n = jnp.asarray(graph.receivers), graph.num_nodes
        ties = jax.ops.segment_sum(best.astype(jnp.int32), r, num_segments=n)
        return (ties <= 1) & decisive(self.scores(state, graph), best, graph)

    def __call__(self, state: GraphState, graph: Graph) -> GraphState:
        """The next state: each node's least list from its flagged senders, and the flag 1 where
        there is one (an empty list and 0 where none)."""
        least, _, _, live = self._select(state, graph)
        reached = heard(live, graph)
        values = jnp.where(reached[:, None], least, 0.0)
        return GraphState(values, reached.astype(least.dtype))
