r"""`ImplicitGraphAttention`: attention over a graph's incoming edges, with edge features in the
messages and the scores, solved to its fixed point.

Node $j$ sends node $i$ along the edge $e = j \to i$ (features $f_e$, e.g. its weight) the message

$$m_e = \max\big(z_j + A f_e + a,\; B f_e + b\big) \quad\text{(per channel)}:$$

its state shifted by the edge (a channel of the $(\min, +)$ semiring: path lengths) or floored by
it (of $(\min, \max)$: bottlenecks). Node $i$ attends over its messages with the scores
$\beta\, q \cdot m_e$ and takes their attention-weighted mean: the values are the keys, so the new
state is the gradient in $q$ of the log-normalizer $\frac1\beta \log \sum_{e \to i}
e^{\beta q \cdot m_e}$, and at a large $\beta$ it is the message that maximizes $q \cdot m_e$
(a soft minimum of path lengths where $q$ points against the shift). Only nodes that hold
something send: a flag, 1 at the anchors (whose states are pinned to a code of their inputs) and
at every node a flagged node sends to, 0 elsewhere; a node that no flagged node reaches keeps the
state 0. From zero states the fixed point is reached after as many steps as the farthest reached
node is edges from the anchors along the paths the scores prefer (plus a few for the soft minimum
to settle).

With one shift channel, no bottleneck channel, $A = 1$ and $q = -1$ the map is the soft
Bellman-Ford iteration, $d_i \leftarrow \mathrm{softmin}_{j \to i}(d_j + w_{ji})$ (tested against
Dijkstra); learned, the same layer is trained on BFS and shortest paths (`eqattn.graphs`). With
`records=True` its step is a [`GraphRecordsStep`][eqattn.nn.GraphRecordsStep] instead: lists of
records in the lexicographic order that names a minimum spanning tree's parents.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray

from .._attention import graph_attention
from .._solve import AbstractAdjoint, Equilibrium, JacobianFree, Picard, Solver
from ._graph_records import RECORDS_BETA, GraphRecordsStep
from ._layer import AbstractEquilibriumLayer

BETA = 3000.0
"""The default initial inverse temperature: near the tropical limit, where the soft minimum is
the minimum. Trained on graphs of 8-16 nodes, shortest-path parents at 1024 nodes of random
geometric graphs were 92.4% right from 10, 97.4% from 3000 (the findings page)."""


class GraphAttentionStep(eqx.Module):
    r"""One step of attention over incoming edges (module docstring): messages
    $m_e = z_j + A f_e$ on the shift channels and $\max(z_j, B f_e + b)$ on the bottleneck
    channels, scores $\beta q \cdot m_e$ from flagged senders, the new state their
    attention-weighted mean. [`ImplicitGraphAttention`][eqattn.nn.ImplicitGraphAttention] solves
    one to its fixed point; a stack of untied ones is its explicit twin.

    **Arguments:** `width` (state channels), `edge_features` (features per edge), `key`, and
    `bottlenecks`, how many of the channels are bottleneck channels (default `width // 2`);
    `beta`, the initial inverse temperature (learned; default `BETA`).

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    step = eqattn.nn.GraphAttentionStep(2, 1, key=jax.random.key(0))
    senders, receivers = jnp.array([0, 1, 1, 2]), jnp.array([1, 0, 2, 1])  # a path 0 - 1 - 2
    weights = jnp.array([[0.5], [0.5], [2.0], [2.0]])
    z = jnp.zeros((3, 2))
    flag = jnp.array([1.0, 0.0, 0.0])  # only node 0 holds something yet
    new, reached = step(z, flag, senders, receivers, weights)
    assert reached.tolist() == [0.0, 1.0, 0.0]  # node 0 has no flagged sender; 2 is two edges on
    assert jnp.allclose(new[1], step.messages(z, senders, weights)[0])  # node 1's one message
    ```
    """

    shift: Float[Array, "shifts f"]
    floor: eqx.nn.Linear
    query: Float[Array, " width"]
    log_beta: Float[Array, ""]

    def __init__(
        self,
        width: int,
        edge_features: int,
        *,
        key: PRNGKeyArray,
        bottlenecks: int | None = None,
        beta: float = BETA,
        dtype=None,
    ):
        _check_sizes(width=width, edge_features=edge_features)
        bottlenecks = width // 2 if bottlenecks is None else bottlenecks
        if isinstance(bottlenecks, bool) or not 0 <= bottlenecks <= width:
            raise ValueError(f"`bottlenecks` must be in 0 .. width ({width}); got {bottlenecks!r}")
        ks, kf, kq = jax.random.split(key, 3)
        dtype = dtype or jnp.result_type(float)
        scale = 1.0 / jnp.sqrt(edge_features)
        self.shift = scale * jax.random.normal(ks, (width - bottlenecks, edge_features), dtype)
        self.floor = eqx.nn.Linear(edge_features, bottlenecks, key=kf, dtype=dtype)
        self.query = jax.random.normal(kq, (width,), dtype) / jnp.sqrt(width)
        if not beta > 0:
            raise ValueError(f"`beta` must be > 0; got {beta!r}")
        self.log_beta = jnp.asarray(jnp.log(beta), dtype)

    def messages(
        self,
        z: Float[ArrayLike, "n width"],
        senders: Int[ArrayLike, " E"],
        edges: Float[ArrayLike, "E f"],
    ) -> Float[Array, "E width"]:
        r"""Each edge's message: $z_j + A f_e$ (shift channels first), $\max(z_j, B f_e + b)$."""
        z, edges = jnp.asarray(z), jnp.asarray(edges)
        zj = z[jnp.asarray(senders)]
        shifts = self.shift.shape[0]
        floor = jax.vmap(self.floor)(edges)
        return jnp.concatenate(
            [zj[:, :shifts] + edges @ self.shift.T, jnp.maximum(zj[:, shifts:], floor)], axis=-1
        )

    def scores(
        self,
        z: Float[ArrayLike, "n width"],
        flag: Float[ArrayLike, " n"],
        senders: Int[ArrayLike, " E"],
        receivers: Int[ArrayLike, " E"],
        edges: Float[ArrayLike, "E f"],
    ) -> Float[Array, " E"]:
        r"""Each edge's score $\beta q \cdot m_e$; $-\infty$ from a sender not flagged
        (`receivers`, unused, as in [`GraphRecordsStep`][eqattn.nn.GraphRecordsStep])."""
        del receivers
        s = jnp.exp(self.log_beta) * (self.messages(z, senders, edges) @ self.query)
        return jnp.where(jnp.asarray(flag)[jnp.asarray(senders)] > 0.5, s, -jnp.inf)

    @property
    def edge_features(self) -> int:
        """The features per edge."""
        return self.shift.shape[1]

    @property
    def width(self) -> int:
        """The state's channels."""
        return self.query.shape[0]

    def __call__(
        self,
        z: Float[ArrayLike, "n width"],
        flag: Float[ArrayLike, " n"],
        senders: Int[ArrayLike, " E"],
        receivers: Int[ArrayLike, " E"],
        edges: Float[ArrayLike, "E f"],
    ) -> tuple[Float[Array, "n width"], Float[Array, " n"]]:
        """`(states, flag)` after one step: the attention-weighted mean of each node's messages
        from flagged senders, and 1 where there is one (0 and 0 where none)."""
        m = self.messages(z, senders, edges)
        flag = jnp.asarray(flag)
        s = jnp.where(flag[jnp.asarray(senders)] > 0.5, 0.0, -jnp.inf).astype(m.dtype)
        values = jnp.concatenate([m, jnp.ones_like(m[:, :1])], axis=-1)
        queries = jnp.broadcast_to(self.query, (flag.shape[0], self.query.shape[0]))
        out = graph_attention(queries, m, values, receivers, beta=jnp.exp(self.log_beta), bias=s)
        return out[:, :-1], out[:, -1]


def _check_sizes(**sizes: int) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"`{name}` must be an int >= 1; got {value!r}")


def check_graph(
    features, anchors, senders, receivers, edges, width_in: int, edge_width: int
) -> None:
    """A `ValueError` naming the argument and the shapes, at trace time."""
    shapes = (
        f"node_features {tuple(features.shape)}, anchors {tuple(anchors.shape)}, senders "
        f"{tuple(senders.shape)}, receivers {tuple(receivers.shape)}, edge_features "
        f"{tuple(edges.shape)}"
    )
    if features.ndim != 2 or features.shape[1] != width_in:
        raise ValueError(f"`node_features` must be [n, {width_in}]; got {shapes}")
    if anchors.shape != features.shape[:1] or anchors.dtype != jnp.bool_:
        raise ValueError(f"`anchors` must be boolean [n] (one per node); got {shapes}")
    if senders.ndim != 1 or senders.shape != receivers.shape:
        raise ValueError(f"`senders` and `receivers` must be [E] (one per edge); got {shapes}")
    if edges.shape != (senders.shape[0], edge_width):
        raise ValueError(f"`edge_features` must be [E, {edge_width}]; got {shapes}")


class ImplicitGraphAttention(AbstractEquilibriumLayer):
    r"""A [`GraphAttentionStep`][eqattn.nn.GraphAttentionStep] (or, with `records`, a
    [`GraphRecordsStep`][eqattn.nn.GraphRecordsStep]) solved to its fixed point, the anchors'
    states pinned to $\mathrm{code}(x_i) = C x_i + c$ (module docstring; with `records`, to the
    empty list).

    **Arguments:**

    - `width`: state channels (with `records`, the list's length); `node_features`,
      `edge_features`: input widths (with `records`, one edge feature: the weight).
    - `bottlenecks`, `beta`: as in [`GraphAttentionStep`][eqattn.nn.GraphAttentionStep]
      (`beta` default: the step's).
    - `records`: solve a [`GraphRecordsStep`][eqattn.nn.GraphRecordsStep] of `units` weight-map
      units instead (the minimum spanning tree's order); the node features are then unused.
    - `key`: a JAX PRNG key for the initialization.
    - `solver`, `adjoint`: as in [`eqattn.fixed_point`][] (default Picard iteration to `rtol`
      1e-4 within 4096 steps, and the Jacobian-free gradient).
    - `throw`: raise (inside `jit` too) when the solve does not converge.

    Acts on one graph: `node_features [n, node_features]`, `anchors [n]` (bool), the directed
    edges `senders [E]`, `receivers [E]` (a receiver `n` marks padding) and
    `edge_features [E, edge_features]`. `layer.forward(...)` returns `((states [n, width],
    reached [n] bool), equilibrium)`; `layer.scores(states, reached, senders, receivers,
    edge_features)` the edges' scores at the fixed point (a node's best incoming edge names its
    parent).

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    layer = eqattn.nn.ImplicitGraphAttention(4, 1, 1, key=jax.random.key(0))
    x, anchors = jnp.ones((3, 1)), jnp.array([True, False, False])  # node 0 the anchor
    senders, receivers = jnp.array([0, 1, 1, 2]), jnp.array([1, 0, 2, 1])  # 0 - 1 - 2
    weights = jnp.array([[0.5], [0.5], [2.0], [2.0]])
    (states, reached), eq = layer.forward(x, anchors, senders, receivers, weights)
    assert states.shape == (3, 4) and reached.all() and eq.converged
    assert int(eq.steps) <= 6  # two edges deep

    tree = eqattn.nn.ImplicitGraphAttention(4, 1, 1, records=True, key=jax.random.key(0))
    (lists, reached), eq = tree.forward(x, anchors, senders, receivers, weights)
    scores = tree.scores(lists, reached, senders, receivers, weights)
    assert scores[2] == 0.0 and scores[3] < 0.0  # 1 is 2's parent; 0 is 1's, not 2
    ```
    """

    code: eqx.nn.Linear | None
    cell: GraphAttentionStep | GraphRecordsStep
    solver: Any
    adjoint: AbstractAdjoint
    throw: bool = eqx.field(static=True)
    node_features: int = eqx.field(static=True)

    def __init__(
        self,
        width: int,
        node_features: int,
        edge_features: int,
        *,
        key: PRNGKeyArray,
        bottlenecks: int | None = None,
        beta: float | None = None,
        records: bool = False,
        units: int = 1,
        solver: Solver | None = None,
        adjoint: AbstractAdjoint | None = None,
        throw: bool = False,
        dtype=None,
    ):
        _check_sizes(width=width, node_features=node_features, edge_features=edge_features)
        kc, ks = jax.random.split(key)
        self.cell: GraphAttentionStep | GraphRecordsStep
        if records:
            if edge_features != 1 or bottlenecks is not None:
                raise ValueError(
                    "with `records`, `edge_features` must be 1 (the weight) and `bottlenecks` "
                    f"None; got {edge_features} and {bottlenecks!r}"
                )
            self.code = None
            beta = RECORDS_BETA if beta is None else beta
            self.cell = GraphRecordsStep(width, key=ks, units=units, beta=beta, dtype=dtype)
        else:
            self.code = eqx.nn.Linear(node_features, width, key=kc, dtype=dtype)
            self.cell = GraphAttentionStep(
                width,
                edge_features,
                key=ks,
                bottlenecks=bottlenecks,
                beta=BETA if beta is None else beta,
                dtype=dtype,
            )
        self.node_features = node_features
        # a records solve moves a front whose change can be small against the whole state
        default = Picard(rtol=1e-7 if records else 1e-4, atol=1e-6, max_steps=4096)
        self.solver, self.adjoint = self.solving(solver, adjoint or JacobianFree(), default, dtype)
        self.throw = throw

    def step(self, state: Float[Array, "n w1"], code, anchors, senders, receivers, edges):
        """One step on the state with its flag as the last channel, the anchors pinned."""
        z, flag = self.cell(state[:, :-1], state[:, -1], senders, receivers, edges)
        new = jnp.concatenate([z, flag[:, None]], axis=-1)
        return jnp.where(anchors[:, None], code, new)

    def equilibrium(
        self,
        node_features: Float[ArrayLike, "n fn"],
        anchors: Bool[ArrayLike, " n"],
        senders: Int[ArrayLike, " E"],
        receivers: Int[ArrayLike, " E"],
        edge_features: Float[ArrayLike, "E fe"],
        *,
        z0: Float[Array, "n w1"] | None = None,
        budget: int | Int[ArrayLike, ""] | None = None,
    ) -> Equilibrium:
        """The fixed point of `step` from zero states (or `z0`, flag last); its `value` is
        `[n, width + 1]`, the flag last."""
        x, a = jnp.asarray(node_features), jnp.asarray(anchors)
        s, r, e = jnp.asarray(senders), jnp.asarray(receivers), jnp.asarray(edge_features)
        check_graph(x, a, s, r, e, self.node_features, self.cell.edge_features)
        if self.code is None:  # records: the anchors hold the empty list
            dtype = jnp.result_type(e.dtype, self.cell.log_beta.dtype)
            code = jnp.zeros((x.shape[0], self.cell.width), dtype)
        else:
            code = jax.vmap(self.code)(x)
        code = jnp.concatenate([code, jnp.ones_like(code[:, :1])], axis=-1)
        z0 = jnp.zeros_like(code) if z0 is None else z0
        return self.solve(ImplicitGraphAttention.step, z0, code, a, s, r, e, budget=budget)

    def forward(
        self, node_features, anchors, senders, receivers, edge_features, *, z0=None, budget=None
    ) -> tuple[tuple[Float[Array, "n width"], Bool[Array, " n"]], Equilibrium]:
        """`((states, reached), equilibrium)` at the fixed point."""
        eq = self.equilibrium(
            node_features, anchors, senders, receivers, edge_features, z0=z0, budget=budget
        )
        return (eq.value[:, :-1], eq.value[:, -1] > 0.5), eq

    def scores(self, states, reached, senders, receivers, edge_features) -> Float[Array, " E"]:
        """Each edge's score at `states` ($-\\infty$ from an unreached sender)."""
        flag = reached.astype(states.dtype)
        return self.cell.scores(states, flag, senders, receivers, edge_features)
