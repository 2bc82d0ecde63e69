r"""`Graph`: a directed graph as an edge list, the one form every graph operator, layer and task
of eqattn reads, and its one validator.

Edge $e$ runs from `senders[e]` to `receivers[e]`: it carries node $j$'s message to node $i$
(an undirected edge is two). A receiver equal to `num_nodes` marks a **padding edge**, which
nothing reads: graphs of different sizes batch by padding to one edge count (and one node
count: extra nodes without edges change nothing), along leading axes that `jax.vmap` maps
over; `num_nodes` is static (one compiled program per node count).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

from .._errors import GraphError


def is_concrete(x) -> bool:
    """Whether `x` holds values (not a tracer under `jit`), so that they can be checked."""
    return not isinstance(x, jax.core.Tracer)


class Graph(eqx.Module):
    r"""A directed graph: each edge's `senders` and `receivers` (`[*batch, E]` integers), its
    optional `edge_features` (`[*batch, E, f]`, e.g. a weight as $f = 1$) and the static
    `num_nodes`. A receiver equal to `num_nodes` marks a padding edge (module docstring): a
    batch is padded to one edge count, and `jax.vmap` maps over its leading axes.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    # a path 0 - 1 - 2, both directions, with weights; one padding edge
    g = eqattn.Graph(jnp.array([0, 1, 1, 2, 0]), jnp.array([1, 0, 2, 1, 3]), num_nodes=3,
                     edge_features=jnp.array([[0.5], [0.5], [2.0], [2.0], [0.0]]))
    assert g.check() is g and g.num_edges == 5 and g.real.tolist() == [True] * 4 + [False]
    batch = jax.tree.map(lambda x: jnp.stack([x, x]), g)  # two graphs, one leading axis
    assert jax.vmap(lambda g: g.in_degree())(batch).tolist() == [[1, 2, 1]] * 2
    ```
    """

    senders: Int[Array, "*batch E"]
    receivers: Int[Array, "*batch E"]
    edge_features: Float[Array, "*batch E f"] | None
    num_nodes: int = eqx.field(static=True)

    def __init__(
        self,
        senders: Int[ArrayLike, "*batch E"],
        receivers: Int[ArrayLike, "*batch E"],
        *,
        num_nodes: int,
        edge_features: Float[ArrayLike, "*batch E f"] | None = None,
    ):
        self.senders = _as_array(senders)
        self.receivers = _as_array(receivers)
        self.edge_features = None if edge_features is None else _as_array(edge_features)
        if isinstance(num_nodes, bool) or not isinstance(num_nodes, int | np.integer):
            raise GraphError(f"`num_nodes` must be an int >= 1; got {num_nodes!r}")
        self.num_nodes = int(num_nodes)

    @property
    def num_edges(self) -> int:
        """The edges per graph, padding included."""
        return int(np.shape(self.senders)[-1])

    @property
    def real(self) -> Array:
        """`[*batch, E]` bool: which edges are real (not padding)."""
        return jnp.asarray(self.receivers) < self.num_nodes

    def in_degree(self) -> Int[Array, "*batch n"]:
        """Each node's real incoming edges (one graph; `jax.vmap` over a batch)."""
        return jax.ops.segment_sum(
            self.real.astype(jnp.int32), jnp.asarray(self.receivers), self.num_nodes
        )

    def check(self, *, edge_features: int | None = None, undirected: bool = False) -> Graph:
        """`self`, checked by [`check_graph`][eqattn.check_graph] (see there)."""
        return check_graph(self, edge_features=edge_features, undirected=undirected)


def _as_array(x):
    """An array as given (numpy stays numpy, a tracer a tracer); anything else as numpy."""
    return x if isinstance(x, np.ndarray | jax.Array) else np.asarray(x)


def _shapes(graph: Graph) -> str:
    features = graph.edge_features
    f = "None" if features is None else f"{features.dtype}{list(np.shape(features))}"
    return (
        f"senders {graph.senders.dtype}{list(np.shape(graph.senders))}, receivers "
        f"{graph.receivers.dtype}{list(np.shape(graph.receivers))}, edge_features {f}"
    )


def check_graph(
    graph: Graph, *, edge_features: int | None = None, undirected: bool = False
) -> Graph:
    """`graph`, or a [`GraphError`][eqattn.GraphError] naming what is wrong in one line: the
    one validator of eqattn's graphs.

    At trace time (shapes): `senders` and `receivers` integers of one shape `[*batch, E]`;
    `edge_features` floating-point `[*batch, E, f]` (`f == edge_features` when that is given;
    present when it is given); `num_nodes` >= 1. Where the arrays hold values (not under
    `jit`): receivers in `0 .. num_nodes` (`num_nodes`: padding), real edges' senders in
    `0 .. num_nodes - 1`, finite edge features; with `undirected`, no self-loop and each real
    edge's reverse listed with the same features.

    **Example:**

    ```python
    import numpy as np, eqattn

    g = eqattn.Graph(np.array([0, 1]), np.array([1, 0]), num_nodes=2)
    assert eqattn.check_graph(g, undirected=True) is g
    try:
        eqattn.check_graph(eqattn.Graph(np.array([0]), np.array([1]), num_nodes=2), undirected=True)
    except eqattn.GraphError as error:
        assert "reverse" in str(error)
    ```
    """
    if not isinstance(graph, Graph):
        raise GraphError(f"`graph` must be an eqattn.Graph; got {type(graph).__name__}")
    n = graph.num_nodes
    if n < 1:
        raise GraphError(f"`num_nodes` must be an int >= 1; got {n}")
    s, r, features = graph.senders, graph.receivers, graph.edge_features
    if (
        np.ndim(s) < 1
        or np.shape(s) != np.shape(r)
        or not (jnp.issubdtype(s.dtype, jnp.integer) and jnp.issubdtype(r.dtype, jnp.integer))
    ):
        raise GraphError(
            f"`senders` and `receivers` must be integers of one shape [*batch, E]; got "
            f"{_shapes(graph)}"
        )
    if features is None and edge_features is not None:
        raise GraphError(f"`edge_features` must be [*batch, E, {edge_features}]; got None")
    if features is not None and (
        np.shape(features)[:-1] != np.shape(s)
        or np.ndim(features) != np.ndim(s) + 1
        or not jnp.issubdtype(features.dtype, jnp.floating)
        or (edge_features is not None and np.shape(features)[-1] != edge_features)
    ):
        f = "f" if edge_features is None else edge_features
        raise GraphError(
            f"`edge_features` must be floating-point [*batch, E, {f}]; got {_shapes(graph)}"
        )
    if all(map(is_concrete, (s, r))):
        _check_values(graph, np.asarray(s), np.asarray(r), undirected)
    return graph


def _check_values(graph: Graph, s: np.ndarray, r: np.ndarray, undirected: bool) -> None:
    n = graph.num_nodes
    if np.any((r < 0) | (r > n)):
        raise GraphError(
            f"`receivers` must be nodes in 0 .. {n - 1} ({n}: a padding edge); got values in "
            f"{r.min()} .. {r.max()}"
        )
    real = r < n
    if np.any(real & ((s < 0) | (s >= n))):
        raise GraphError(f"`senders` of real edges must be nodes in 0 .. {n - 1}")
    features = graph.edge_features
    values = None
    if features is not None and is_concrete(features):
        values = np.asarray(features)
        if not np.all(np.isfinite(values[real])):
            raise GraphError("`edge_features` must be finite on real edges")
    if not undirected:
        return
    if np.any(real & (s == r)):
        raise GraphError("an undirected graph's edges must have no self-loops")
    for b in np.ndindex(s.shape[:-1]):
        m = real[b]
        keys = s[b][m].astype(np.int64) * n + r[b][m]
        back = r[b][m].astype(np.int64) * n + s[b][m]
        order = np.argsort(keys, kind="stable")
        if len(np.unique(keys)) < len(keys):
            raise GraphError("an undirected graph must list each directed edge once")
        at = np.searchsorted(keys[order], back)
        found = (at < len(keys)) & (keys[order][np.minimum(at, len(keys) - 1)] == back)
        if not found.all():
            raise GraphError("each edge's reverse must be listed too (undirected graphs)")
        if values is not None:
            reverse = order[at]
            if not np.array_equal(values[b][m], values[b][m][reverse]):
                raise GraphError(
                    "`edge_features` must be equal both ways of each edge (undirected graphs)"
                )
