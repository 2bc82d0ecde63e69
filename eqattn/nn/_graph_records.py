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
$-\beta\, m_{e,l}$ ([`eqattn.graph_attention`][], the values the keys); an edge ties at a level
when its message is within a relative `TIE` of that minimum. The minimum spanning tree's path
from the anchor to every node is the lexicographically least list of records (every weight
distinct: Prim's tree), so with hard minima the fixed point names each node's tree parent: the
sender of its tying edge. From the anchor's empty list the solve takes about as many steps as
the tree is deep. A list holds $k$ records: a path with more (their number grows like the log of
its length) drops its lightest, and a node's children can then tie with its parent.

The edge weights enter through a learned increasing map $w \mapsto \sum_u a_u\,
\mathrm{softplus}(b_u w + c_u)$ ($a_u, b_u > 0$): positive, and any increasing map gives the
same tree, so what is learned is its scale against $\beta$.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray

from .._attention import graph_attention

RECORDS_BETA = 1e5
"""The default initial inverse temperature of the records' soft minima (on weights over their
mean, mapped to about their size): near the tropical limit, where they are the minima."""

TIE = 1e-6
"""Messages within this relative distance of a level's soft minimum tie at that level."""


def extend(r: Float[Array, "E k"], w: Float[Array, " E"]) -> Float[Array, "E k"]:
    """Each edge's list: the sender's records `r` heavier than `w`, then `w` (0 past the end,
    the lightest dropped past `k`)."""
    above = jnp.concatenate([jnp.full_like(r[:, :1], jnp.inf), r[:, :-1]], axis=1)
    return jnp.where(w[:, None] < above, jnp.maximum(r, w[:, None]), 0.0)


def lexicographic(m: Float[Array, "E k"], live: Array, receivers: Array, n: int, beta):
    """Per node the least list of its `live` edges' `m`, level by level by soft minima (a scan
    over the levels); each edge's tie after the last level; each edge's gap, its message above
    the level's minimum at the first level where it stops tying (0 for an edge that ties at
    every level)."""
    queries = -jnp.ones((n, 1), m.dtype)

    def level(carry, v):
        tie, gap = carry
        bias = jnp.where(tie, 0.0, -jnp.inf).astype(m.dtype)
        least = graph_attention(queries, v[:, None], v[:, None], receivers, beta=beta, bias=bias)
        at = least[:, 0].at[receivers].get(mode="fill", fill_value=0.0)
        keep = tie & (v <= at * (1 + TIE))
        return (keep, jnp.where(tie & ~keep, v - at, gap)), least[:, 0]

    (tie, gap), least = jax.lax.scan(level, (live, jnp.zeros_like(m[:, 0])), m.T)
    return least.T, tie, gap


class GraphRecordsStep(eqx.Module):
    r"""One step of attention over incoming edges on lists of `records` records (module
    docstring): each flagged sender's list extended by the edge's mapped weight, the least of
    them per node by soft minima level by level. [`ImplicitGraphAttention`][eqattn.nn.ImplicitGraphAttention]
    with `records=True` solves one to its fixed point; a stack of untied ones is its explicit
    twin.

    **Arguments:** `records` (the list's length, the state's channels), `key`; `units`, the
    weight map's units (default 1); `beta`, the initial inverse temperature (learned; default
    `RECORDS_BETA`). The edge features are one per edge: its weight.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    step = eqattn.nn.GraphRecordsStep(3, key=jax.random.key(0))
    senders, receivers = jnp.array([0, 1, 1, 2]), jnp.array([1, 0, 2, 1])  # a path 0 - 1 - 2
    weights = jnp.array([[2.0], [2.0], [0.5], [0.5]])
    z, flag = jnp.zeros((3, 3)), jnp.array([1.0, 0.0, 0.0])  # node 0's list empty
    for _ in range(3):
        z, flag = step(z, flag, senders, receivers, weights)
        z, flag = z.at[0].set(0.0), flag.at[0].set(1.0)  # node 0 the anchor
    heavy, light = step.weight_map(weights[[0, 2], 0])
    assert jnp.allclose(z[2], jnp.array([heavy, light, 0.0]))  # both edges are records
    ```
    """

    log_scale: Float[Array, " units"]
    log_slope: Float[Array, " units"]
    offset: Float[Array, " units"]
    log_beta: Float[Array, ""]
    records: int = eqx.field(static=True)

    def __init__(
        self,
        records: int,
        *,
        key: PRNGKeyArray,
        units: int = 1,
        beta: float = RECORDS_BETA,
        dtype=None,
    ):
        for name, value in (("records", records), ("units", units)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be an int >= 1; got {value!r}")
        if not beta > 0:
            raise ValueError(f"`beta` must be > 0; got {beta!r}")
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

    @property
    def edge_features(self) -> int:
        """The features per edge: one, the weight."""
        return 1

    def weight_map(self, w: Float[ArrayLike, "*shape"]) -> Float[Array, "*shape"]:
        r"""The increasing, positive map $\sum_u a_u \mathrm{softplus}(b_u w + c_u)$."""
        w = jnp.asarray(w)[..., None]
        units = jax.nn.softplus(jnp.exp(self.log_slope) * w + self.offset)
        return units @ jnp.exp(self.log_scale)

    def messages(
        self,
        z: Float[ArrayLike, "n k"],
        senders: Int[ArrayLike, " E"],
        edges: Float[ArrayLike, "E 1"],
    ) -> Float[Array, "E k"]:
        """Each edge's list: the sender's extended by the edge's mapped weight."""
        z = jnp.asarray(z)
        return extend(z[jnp.asarray(senders)], self.weight_map(jnp.asarray(edges)[:, 0]))

    def _select(self, z, flag, senders, receivers, edges):
        senders, receivers = jnp.asarray(senders), jnp.asarray(receivers)
        live = jnp.asarray(flag)[senders] > 0.5
        m = self.messages(z, senders, edges)
        n = jnp.shape(z)[0]
        return (*lexicographic(m, live, receivers, n, jnp.exp(self.log_beta)), live)

    def scores(
        self,
        z: Float[ArrayLike, "n k"],
        flag: Float[ArrayLike, " n"],
        senders: Int[ArrayLike, " E"],
        receivers: Int[ArrayLike, " E"],
        edges: Float[ArrayLike, "E 1"],
    ) -> Float[Array, " E"]:
        r"""Each edge's score: $-\beta$ times its gap (0 for the edges a node's least list
        comes from); $-\infty$ from a sender not flagged."""
        _, _, gap, live = self._select(z, flag, senders, receivers, edges)
        return jnp.where(live, -jnp.exp(self.log_beta) * gap, -jnp.inf)

    def __call__(
        self,
        z: Float[ArrayLike, "n k"],
        flag: Float[ArrayLike, " n"],
        senders: Int[ArrayLike, " E"],
        receivers: Int[ArrayLike, " E"],
        edges: Float[ArrayLike, "E 1"],
    ) -> tuple[Float[Array, "n k"], Float[Array, " n"]]:
        """`(lists, flag)` after one step: each node's least list from its flagged senders, and
        1 where there is one (an empty list and 0 where none)."""
        least, _, _, live = self._select(z, flag, senders, receivers, edges)
        n = least.shape[0]
        live_ = live.astype(jnp.int32)
        heard = jax.ops.segment_max(live_, jnp.asarray(receivers), num_segments=n) > 0
        return jnp.where(heard[:, None], least, 0.0), heard.astype(least.dtype)
