r"""The graph task's algorithms, one object each: what it answers (its targets, from a numpy or
scipy reference), the step its models iterate, the rule that turns weights into the step's edge
features, its default training families, width and solver tolerance. Nothing outside these
objects branches on an algorithm's name.

Each is a differentiable algorithm with fitted parameters, not a learned one: its step is built
so that at the tropical limit (a large inverse temperature, where its soft minima are minima)
it *is* the algorithm.

- `BFS`: breadth-first search, parents one hop closer (Bellman-Ford on unit weights): a
  [`GraphAttentionStep`][eqattn.nn.GraphAttentionStep] with shift and bottleneck channels, the
  source's code learned.
- `ShortestPaths`: a parent on a shortest path (relative 1e-6): one shift channel, the
  distance, whose $q z$ obeys Bellman-Ford's recursion exactly, with each node's temperature
  relative to its own distance (weights from $10^{-6}$ to $10^6$, heavy tails and near ties
  alike), the source at distance 0.
- `SpanningTree`: the parent in the minimum spanning tree of the source's component rooted at
  the source (Prim's output): a [`GraphRecordsStep`][eqattn.nn.GraphRecordsStep] on each edge's
  rank under the tie rule, (weight, smaller end, larger end), which makes the tree unique.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .. import nn
from .._graph import Graph
from ._families import FAMILIES
from ._references import hops, mst_parents, shortest_distances
from ._weighted import WEIGHTED_FAMILIES, WeightedGraphs

TOLERANCE = 1e-6
"""Path lengths within this relative distance of each other tie: a parent whose path is that
close to the shortest is right (float32 resolves about 1e-7)."""


class AbstractAlgorithm(eqx.Module):
    """An algorithm of the graph task (module docstring): `name`, whether it reads `weights`,
    its default training `families`, model `dim` (and `explicit_width`) and solver `rtol`;
    `step(width)` and
    `encoder(width)` build its models' parts, `edge_features(graph)` its weight rule (one
    graph, in JAX), `targets(graphs)` the valid parents (numpy)."""

    name: eqx.AbstractClassVar[str]
    weighted: eqx.AbstractClassVar[bool]
    families: eqx.AbstractClassVar[tuple[str, ...]]
    dim: eqx.AbstractClassVar[int]
    rtol: eqx.AbstractClassVar[float]
    explicit_width: ClassVar[int | None] = None
    """The explicit twin's width; None: the one that gives it the DEQ's parameters."""

    @abc.abstractmethod
    def step(self, width: int, *, key, dtype=None) -> nn.AbstractGraphStep:
        """The step its models iterate, of `width` (the DEQ's `dim`, or the explicit width)."""

    def encoder(self, width: int, *, key, dtype=None) -> eqx.Module | None:
        """The source's code from its node feature (a 1): None, the step's zero state."""
        return None

    def refined(self, step: nn.AbstractGraphStep) -> nn.AbstractGraphStep | None:
        """A step of more capacity with the same parameters, for a solve that converged with
        nodes unresolved for want of it; None where capacity is not what leaves them so."""
        return None

    @abc.abstractmethod
    def edge_features(self, graph: Graph) -> Float[Array, "E 1"]:
        """The weight rule: each edge's feature from the graph's weights (padding: 0)."""

    @abc.abstractmethod
    def reference(self, g: WeightedGraphs) -> np.ndarray:
        """Per graph and node `[B, n]`: the reference's distance (hops, or the shortest
        distance; -1 or inf where unreachable), or the spanning tree's parent."""

    def targets(self, g: WeightedGraphs) -> tuple[np.ndarray, np.ndarray]:
        """Per edge whether its sender is a valid parent of its receiver `[B, E]`, per node
        whether it is its own `[B, n]` (the source, and a node the source does not reach)."""
        d = np.asarray(self.reference(g), np.float64)
        d = np.where(d < 0, np.inf, d)  # hops: -1 where unreachable
        s, r, n = np.asarray(g.graph.senders), np.asarray(g.graph.receivers), g.graph.num_nodes
        real, rc = r < n, np.minimum(r, n - 1)
        dr, ds = np.take_along_axis(d, rc, 1), np.take_along_axis(d, np.minimum(s, n - 1), 1)
        source = np.arange(n) == g.source[:, None]
        into_source = np.take_along_axis(source, rc, 1)
        with np.errstate(invalid="ignore"):  # inf - inf: an edge nothing reaches, not tight
            tight = np.abs(ds + self._lengths(g) - dr) <= TOLERANCE * dr
        return real & np.isfinite(dr) & ~into_source & tight, ~np.isfinite(d) | source

    def _lengths(self, g: WeightedGraphs) -> np.ndarray:
        return g.weights.astype(np.float64)

    @property
    def folder(self) -> str:
        """Its runs' folder under `runs/`."""
        return f"graphs/{self.name}"


def relative_weights(graph: Graph) -> Float[Array, "E 1"]:
    """Each edge's weight over its graph's mean edge weight: shortest paths and spanning trees
    do not change when every weight is scaled, and so the models' answers do not either.
    Padding, and a graph whose weights are all 0, stay 0."""
    real = graph.real
    w = jnp.asarray(graph.edge_features)[:, 0]
    mean = jnp.sum(jnp.where(real, w, 0.0)) / jnp.maximum(jnp.sum(real), 1)
    return jnp.where(real, w / jnp.where(mean > 0, mean, 1.0), 0.0)[:, None]


def ranks(graph: Graph) -> Float[Array, "E 1"]:
    """Each real edge's rank `1 .. m` among the graph's `m` undirected edges in the tie rule's
    order (weight, smaller end, larger end; `references.tie_ranks` in numpy); padding 0."""
    s, r = jnp.asarray(graph.senders), jnp.asarray(graph.receivers)
    real = graph.real
    w = jnp.where(real, jnp.asarray(graph.edge_features)[:, 0], 0.0)
    lo, hi = jnp.minimum(s, r), jnp.maximum(s, r)
    order = jnp.lexsort((hi, lo, w, ~real))  # the last key first: padding last
    key = jnp.stack([w[order], lo[order].astype(w.dtype), hi[order].astype(w.dtype)], 1)
    new = jnp.concatenate([jnp.ones(1, bool), jnp.any(key[1:] != key[:-1], axis=1)])
    rank = jnp.zeros(order.shape, w.dtype).at[order].set(jnp.cumsum(new).astype(w.dtype))
    return jnp.where(real, rank, 0.0)[:, None]


class BFS(AbstractAlgorithm):
    """Breadth-first search: reachability and a parent one hop closer to the source (any one),
    every weight read as 1.

    **Example:**

    ```python
    from eqattn import graphs

    g = graphs.from_edges(3, [[(0, 1), (1, 2), (0, 2)]], [0], weights=[[1.0, 1.0, 5.0]])
    edge_ok, self_ok = graphs.BFS().targets(g)  # hops, whatever the weights
    assert graphs.BFS().reference(g).tolist() == [[0, 1, 1]] and self_ok[0].tolist() == [True, False, False]
    ```
    """

    name: ClassVar[str] = "bfs"
    weighted: ClassVar[bool] = False
    families: ClassVar[tuple[str, ...]] = FAMILIES
    dim: ClassVar[int] = 22
    rtol: ClassVar[float] = nn.GraphAttentionStep.default_rtol

    def step(self, width, *, key, dtype=None):
        return nn.GraphAttentionStep(width, 1, key=key, dtype=dtype)

    def encoder(self, width, *, key, dtype=None):
        return eqx.nn.Linear(1, width, key=key, dtype=dtype)

    def edge_features(self, graph):
        return graph.real.astype(jnp.result_type(float))[:, None]

    def reference(self, g):
        return hops(g.graph, g.source)

    def _lengths(self, g):
        return np.ones(g.weights.shape)

    @property
    def folder(self):
        return "graphs"


class ShortestPaths(AbstractAlgorithm):
    """A parent on a shortest path (any one, within the relative `TOLERANCE`: Bellman-Ford's
    and Dijkstra's output), weights read over their mean.

    **Example:**

    ```python
    from eqattn import graphs

    g = graphs.from_edges(3, [[(0, 1), (1, 2), (0, 2)]], [0], weights=[[1.0, 1.0, 5.0]])
    assert graphs.ShortestPaths().reference(g).tolist() == [[0.0, 1.0, 2.0]]  # Dijkstra
    step = graphs.ShortestPaths().step(4, key=__import__("jax").random.key(0))
    assert step.relative and step.shift.shape == (4, 1)  # shift channels only
    ```
    """

    name: ClassVar[str] = "shortest-paths"
    weighted: ClassVar[bool] = True
    families: ClassVar[tuple[str, ...]] = WEIGHTED_FAMILIES
    dim: ClassVar[int] = 1  # the distance; wider, q . z sums channels and cancels (findings)
    rtol: ClassVar[float] = nn.GraphAttentionStep.default_rtol
    explicit_width: ClassVar[int | None] = 1  # no narrower twin: 16 steps, 16x the parameters

    def step(self, width, *, key, dtype=None):
        return nn.GraphAttentionStep(width, 1, key=key, bottlenecks=0, relative=True, dtype=dtype)

    def edge_features(self, graph):
        return relative_weights(graph)

    def reference(self, g):
        return shortest_distances(g.graph, g.source)


RECORDS = 32
"""The spanning-tree models' records per node: a path's records number about the log of its
length, but a node whose list is cut ties with its child and is left unresolved, so what counts
is the most over a graph's nodes (the `spanning` benchmark and the findings page: 16 cut the
lists of 4096-node paths; 32 leave a margin on random weights). A graded mesh's paths, their
edges shorter and shorter, hold many more: a prediction solves again with twice the records
where a list was cut (`SpanningTree.refined`), up to `MAX_RECORDS`."""

MAX_RECORDS = 512
"""The most records a spanning-tree prediction carries (four doublings of `RECORDS`)."""


class SpanningTree(AbstractAlgorithm):
    """The parent in the minimum spanning tree of the source's component, rooted at the source
    (Prim's output), under the tie rule: each edge's rank by (weight, smaller end, larger end).
    Its step holds `records` records (default `RECORDS`) and a weight map of `width` units.

    **Example:**

    ```python
    from eqattn import graphs

    square = graphs.from_edges(4, [[(0, 1), (1, 2), (2, 3), (3, 0)]], [2])  # every weight 1
    # the tie rule ranks 0-1, 0-3, 1-2 before 2-3: those three are the tree
    assert graphs.SpanningTree().reference(square).tolist() == [[1, 2, 2, 0]]
    ```
    """

    records: int = eqx.field(static=True, default=RECORDS)

    name: ClassVar[str] = "mst"
    weighted: ClassVar[bool] = True
    families: ClassVar[tuple[str, ...]] = WEIGHTED_FAMILIES
    dim: ClassVar[int] = 22
    rtol: ClassVar[float] = nn.GraphRecordsStep.default_rtol

    def step(self, width, *, key, dtype=None):
        return nn.GraphRecordsStep(self.records, key=key, units=width, dtype=dtype)

    def refined(self, step):
        """Twice the records (up to `MAX_RECORDS`): with distinct ranks, lists tie only where
        they were cut."""
        if not isinstance(step, nn.GraphRecordsStep) or step.records >= MAX_RECORDS:
            return None
        return step.with_records(min(2 * step.records, MAX_RECORDS))

    def edge_features(self, graph):
        return ranks(graph)

    def reference(self, g):
        return mst_parents(g.graph, g.source)

    def targets(self, g):
        parent = self.reference(g)
        s, r, n = np.asarray(g.graph.senders), np.asarray(g.graph.receivers), g.graph.num_nodes
        rc = np.minimum(r, n - 1)
        own = parent == np.arange(n)
        return (r < n) & (np.take_along_axis(parent, rc, 1) == s), own


ALGORITHMS: dict[str, AbstractAlgorithm] = {
    a.name: a for a in (BFS(), ShortestPaths(), SpanningTree())
}
"""The graph task's algorithms by name: `bfs`, `shortest-paths`, `mst`."""


def algorithm_of(name_or_algorithm) -> AbstractAlgorithm:
    """The algorithm named (or given), or a `ValueError` naming the choices."""
    if isinstance(name_or_algorithm, AbstractAlgorithm):
        return name_or_algorithm
    if name_or_algorithm not in ALGORITHMS:
        from .._errors import ConfigError

        raise ConfigError(
            f"`algorithm` must be one of {', '.join(ALGORITHMS)}; got {name_or_algorithm!r}"
        )
    return ALGORITHMS[name_or_algorithm]
