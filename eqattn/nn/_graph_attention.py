r"""`GraphAttentionStep`: attention over a graph's incoming edges, with the edge's features in
the messages and the scores.

Node $j$ sends node $i$ along the edge $e = j \to i$ (features $f_e$, e.g. its weight) the
message

$$m_e = \big(z_j + A f_e,\; \max(z_j, B f_e + b)\big) \quad\text{(per channel)}:$$

its state shifted by the edge on the *shift* channels (the $(\min, +)$ semiring: path lengths)
or floored by it on the *bottleneck* channels ($(\min, \max)$: the largest weight on a path).
Node $i$ attends over its messages from flagged senders with the scores $s_e = \beta\, q \cdot
m_e$ and takes their attention-weighted mean (the values are the keys): at a large $\beta$, the
message that maximizes $q \cdot m_e$. With shift channels alone, $u_i = q \cdot z_i$ obeys $u_i
= \max_{j \to i} (u_j + (q \cdot A) f_e)$ at the tropical limit: Bellman-Ford's step on the
lengths $-(q \cdot A) f_e$, whatever the other parameters are.

With `relative=True` the temperature is each node's own: $s_e = \beta\, q \cdot m_e / |c_i|$,
$c_i$ the node's best $q \cdot m_e$, so that candidates are told apart by their relative
difference (path lengths from $10^{-6}$ to $10^{6}$ alike, at the precision float32 holds) rather
than an absolute one; $\beta$ is learned but kept at `RELATIVE_BETA` or above, so that two
candidates a relative `TIE` apart or more are `2 MARGIN` nats apart: a node ties or decides,
and never blends.
"""

from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, PRNGKeyArray

from .._graph import Graph, graph_attention
from ._graph_step import (
    MARGIN,
    TIE,
    AbstractGraphStep,
    GraphState,
    best_edge,
    live_edges,
)

BETA = 3000.0
"""The default initial inverse temperature: near the tropical limit, where the soft minimum is
the minimum (why not lower: the findings page)."""

RELATIVE_BETA = 2 * MARGIN / TIE
"""The default initial inverse temperature of relative scores: two candidates whose messages
differ by more than `TIE` (relative) are `2 MARGIN` nats apart or more, so a node either ties
or decides."""


def check_sizes(**sizes: int) -> None:
    """Each size an int >= 1, or a `ValueError` naming it."""
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"`{name}` must be an int >= 1; got {value!r}")


def check_beta(beta) -> float:
    """A constructor's `beta`: finite and > 0, or a `ValueError`."""
    if not (isinstance(beta, int | float) and 0 < beta < float("inf")):
        raise ValueError(f"`beta` must be finite and > 0; got {beta!r}")
    return float(beta)


class GraphAttentionStep(AbstractGraphStep):
    r"""One step of attention over incoming edges (module docstring): messages
    $m_e = z_j + A f_e$ on the shift channels and $\max(z_j, B f_e + b)$ on the bottleneck
    channels, scores $\beta q \cdot m_e$ (with `relative`, relative to the node's best) from
    flagged senders, the new state their attention-weighted mean.

    **Arguments:** `width` (state channels), `edge_features` (features per edge), `key`;
    `bottlenecks`, how many of the channels are bottleneck channels (default `width // 2`);
    `relative`, each node's temperature relative to its best score (module docstring);
    `beta`, the initial inverse temperature (learned; default `BETA`, relative `RELATIVE_BETA`).
    A solve of it stops when every entry moves by at most `default_rtol` (1e-6) of its size.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn
    from eqattn.nn import GraphAttentionStep, GraphState

    step = GraphAttentionStep(2, 1, key=jax.random.key(0))
    g = eqattn.Graph(jnp.array([0, 1, 1, 2]), jnp.array([1, 0, 2, 1]), num_nodes=3,
                     edge_features=jnp.array([[0.5], [0.5], [2.0], [2.0]]))  # a path 0 - 1 - 2
    state = GraphState(jnp.zeros((3, 2)), jnp.array([1.0, 0.0, 0.0]))  # only node 0 holds something
    new = step(state, g)
    assert new.flag.tolist() == [0.0, 1.0, 0.0]  # node 0 has no flagged sender; 2 is two edges on
    assert jnp.allclose(new.values[1], step.messages(state, g)[0])  # node 1's one message
    ```
    """

    shift: Float[Array, "shifts f"]
    floor: eqx.nn.Linear
    query: Float[Array, " width"]
    log_beta: Float[Array, ""]
    relative: bool = eqx.field(static=True)

    default_beta: ClassVar[float] = BETA
    default_rtol: ClassVar[float] = 1e-6

    def __init__(
        self,
        width: int,
        edge_features: int,
        *,
        key: PRNGKeyArray,
        bottlenecks: int | None = None,
        relative: bool = False,
        beta: float | None = None,
        dtype=None,
    ):
        check_sizes(width=width, edge_features=edge_features)
        bottlenecks = width // 2 if bottlenecks is None else bottlenecks
        if isinstance(bottlenecks, bool) or not 0 <= bottlenecks <= width:
            raise ValueError(f"`bottlenecks` must be in 0 .. width ({width}); got {bottlenecks!r}")
        beta = check_beta((RELATIVE_BETA if relative else BETA) if beta is None else beta)
        ks, kf, kq = jax.random.split(key, 3)
        dtype = dtype or jnp.result_type(float)
        scale = 1.0 / jnp.sqrt(edge_features)
        self.shift = scale * jax.random.normal(ks, (width - bottlenecks, edge_features), dtype)
        self.floor = eqx.nn.Linear(edge_features, bottlenecks, key=kf, dtype=dtype)
        self.query = jax.random.normal(kq, (width,), dtype) / jnp.sqrt(width)
        self.log_beta = jnp.asarray(jnp.log(beta), dtype)
        self.relative = bool(relative)

    @property
    def width(self) -> int:
        """The state's channels."""
        return self.query.shape[0]

    @property
    def edge_features(self) -> int:
        """The features per edge."""
        return self.shift.shape[1]

    def messages(self, state: GraphState, graph: Graph) -> Float[Array, "E width"]:
        r"""Each edge's message: $z_j + A f_e$ (shift channels first), $\max(z_j, B f_e + b)$."""
        z, edges = state.values, jnp.asarray(graph.edge_features)
        zj = z[jnp.clip(jnp.asarray(graph.senders), 0, graph.num_nodes - 1)]
        shifts = self.shift.shape[0]
        floor = jax.vmap(self.floor)(edges)
        return jnp.concatenate(
            [zj[:, :shifts] + edges @ self.shift.T, jnp.maximum(zj[:, shifts:], floor)], axis=-1
        )

    def _scores(self, m: Float[Array, "E width"], live, graph: Graph) -> Float[Array, " E"]:
        logits = m @ self.query
        beta = jnp.exp(self.log_beta)
        if self.relative:
            r = jnp.asarray(graph.receivers)
            best = jax.ops.segment_max(jnp.where(live, logits, -jnp.inf), r, graph.num_nodes)
            at = best.at[r].get(mode="fill", fill_value=1.0)
            at = jnp.where(jnp.isfinite(at), at, 1.0)
            scale = jnp.maximum(jnp.abs(at), jnp.finfo(logits.dtype).tiny)
            logits = (logits - at) / scale  # the best 0, the others below by their relative gap
            beta = jnp.maximum(beta, RELATIVE_BETA)  # resolution: candidates `TIE` apart decide
        return jnp.where(live, beta * logits, -jnp.inf)

    def scores(self, state: GraphState, graph: Graph) -> Float[Array, " E"]:
        r"""Each edge's score $\beta q \cdot m_e$ (relative: $\beta (q \cdot m_e - c_i) /
        |c_i|$, 0 for the best); $-\infty$ from a sender not flagged, and on padding."""
        return self._scores(self.messages(state, graph), live_edges(state, graph), graph)

    def best(self, state: GraphState, graph: Graph) -> Bool[Array, " E"]:
        """The edges whose message ties with their receiver's best: scores within `TIE` of the
        best's, relative to its size (relative scores: `TIE` times the temperature)."""
        s = self.scores(state, graph)
        r = jnp.asarray(graph.receivers)
        top = jax.ops.segment_max(s, r, num_segments=graph.num_nodes)
        at = top.at[r].get(mode="fill", fill_value=jnp.inf)
        if self.relative:
            tolerance = TIE * jnp.maximum(jnp.exp(self.log_beta), RELATIVE_BETA)
        else:
            tolerance = TIE * jnp.abs(at)
        return jnp.isfinite(s) & (s >= at - tolerance)

    def __call__(self, state: GraphState, graph: Graph) -> GraphState:
        """The next state: the attention-weighted mean of each node's messages from flagged
        senders, and the flag 1 where there is one (0 and 0 where none). The mean is taken as
        the best message plus the weighted mean of the others' differences from it (a message
        within a relative `TIE` of the best counting as no difference): the same gradient, and
        the best message exactly where the others' weights vanish or they tie with it (no
        rounding to drift on through the fixed point, no near ties averaging one another)."""
        m = self.messages(state, graph)
        live = live_edges(state, graph)
        s = self._scores(m, live, graph)
        n, r = graph.num_nodes, jnp.asarray(graph.receivers)
        top, first = best_edge(s, graph)
        padded = jnp.concatenate([m, jnp.zeros_like(m[:1])])
        center = jax.lax.stop_gradient(padded[first])  # [n, width]: 0 where no edge
        at = center.at[r].get(mode="fill", fill_value=0.0)
        deviation = m - at
        # a message within a relative `TIE` of the best is the best: its deviation counts 0 (its
        # gradient stays the mean's), so that near ties settle at once instead of averaging
        # one another over many steps
        near = jnp.linalg.norm(deviation, axis=-1) <= TIE * jnp.linalg.norm(at, axis=-1)
        deviation = deviation - jax.lax.stop_gradient(deviation) * near[:, None]
        zeros = jnp.zeros((m.shape[0], 1), m.dtype)
        out = graph_attention(jnp.ones((n, 1), m.dtype), zeros, deviation, graph, bias=s)
        reached = top > -jnp.inf  # a flagged sender's edge is scored (finite)
        return GraphState(jnp.where(reached[:, None], center + out, 0.0), reached.astype(m.dtype))
