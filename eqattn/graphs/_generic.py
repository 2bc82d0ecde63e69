r"""The graph task's generic models: the library's generic graph transformer
([`eqattn.nn.ImplicitGraphTransformer`][], the block the reasoning tasks solve) with nothing of
the algorithm in its step, learning BFS, shortest paths or spanning trees from the parents alone.

Only the ends are the task's: each node's code is a learned vector of whether it is the source,
$x_i = W_e\,\mathrm{onehot}(i = s)$; each edge's feature is 1 for BFS and its weight over the
graph's mean weight otherwise (the scale an algorithm's answer does not depend on); an edge
$j \to i$ scores $\mathrm{MLP}([z_j, z_i, f_e])$ as $i$'s parent and a node $w^\top z_i$ as its
own (the source's is fixed, 0: it is its own parent and its incoming edges never are). A node's
parent is its best-scoring candidate; it counts as reached if an edge beats its own score, and
as unresolved if two candidates tie for its best. What
[`graphs.predict`][eqattn.graphs.predict] answers from these: the parents along best edges
from the source, -1 where they lead nowhere, where the node is unresolved or the solve did not
converge. (Ties are never broken: the graph task's tie rule, the breadth-first order of tied
edges from the source, would itself be BFS; a model whose states collapse, every score tied,
would answer it exactly.)
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from .. import nn
from .._graph import Graph
from .._solve import AbstractAdjoint, Picard, Solver
from ..nn import Prediction
from ._algorithms import AbstractAlgorithm, algorithm_of, relative_weights
from ._model import Inputs, ParentScores, read_out

Core = nn.ImplicitGraphTransformer | nn.ExplicitGraphTransformer


class ParentHead(eqx.Module):
    r"""Parent scores from the states $z$ `[n, dim]`: each edge $j \to i$'s
    $\mathrm{MLP}([z_j, z_i, f_e])$ (one hidden layer of `dim` units) and each node's own
    $w^\top z_i + b$.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn
    from eqattn import graphs

    head = graphs.ParentHead(8, 1, key=jax.random.key(0))
    g = eqattn.Graph(jnp.array([0, 1]), jnp.array([1, 0]), num_nodes=2,
                     edge_features=jnp.ones((2, 1)))
    edges, own = head(jnp.ones((2, 8)), g)
    assert edges.shape == (2,) and own.shape == (2,)
    ```
    """

    edge: eqx.nn.MLP
    own: eqx.nn.Linear

    def __init__(self, dim: int, edge_features: int, *, key: PRNGKeyArray, dtype=None):
        ke, ko = jax.random.split(key)
        self.edge = eqx.nn.MLP(
            2 * dim + edge_features, "scalar", dim, 1, activation=jax.nn.gelu, key=ke, dtype=dtype
        )
        self.own = eqx.nn.Linear(dim, "scalar", key=ko, dtype=dtype)

    def __call__(self, z: Float[Array, "n dim"], graph: Graph) -> tuple[Array, Array]:
        """`(edge scores [E], own scores [n])`."""
        n = z.shape[0]
        senders = jnp.clip(jnp.asarray(graph.senders), 0, n - 1)
        receivers = jnp.clip(jnp.asarray(graph.receivers), 0, n - 1)
        pairs = [z[senders], z[receivers], jnp.asarray(graph.edge_features, z.dtype)]
        return jax.vmap(self.edge)(jnp.concatenate(pairs, 1)), jax.vmap(self.own)(z)


def _features(algorithm: AbstractAlgorithm, graph: Graph) -> Graph:
    """The graph with one edge feature: 1 for an unweighted algorithm, the relative weight
    otherwise (padding 0)."""
    if algorithm.weighted:
        f = relative_weights(graph)
    else:
        f = graph.real.astype(jnp.result_type(float))[:, None]
    return Graph(graph.senders, graph.receivers, num_nodes=graph.num_nodes, edge_features=f)


class GenericGraphModel(eqx.Module):
    """A generic model of the graph task (module docstring): an encoder of the source, the
    generic graph transformer (`core`: solved to its fixed point, or `depth` untied steps) and
    a [`ParentHead`][eqattn.graphs.ParentHead]. Build it with
    [`deq`][eqattn.graphs.GenericGraphModel.deq],
    [`explicit`][eqattn.graphs.GenericGraphModel.explicit] or
    [`matched`][eqattn.graphs.GenericGraphModel.matched] (the DEQ's twin of equal
    parameters). `model.predict((graph, anchors), budget=)` gives its
    [`ParentScores`][eqattn.graphs.ParentScores] as the graph task's models do, so
    [`graphs.predict`][eqattn.graphs.predict] and the task's loss and scores read it;
    `model.unrolled(x, steps, z0=)` runs a DEQ's step a fixed number of times instead.

    **Example:**

    ```python
    import jax, jax.numpy as jnp
    from eqattn import graphs

    model = graphs.GenericGraphModel.deq(16, 2, "bfs", key=jax.random.key(0))
    g = graphs.sample_weighted("path", 6, 2, seed=0)
    out = graphs.predict(model, g.graph, g.source)  # untrained: parents not yet BFS's
    assert out.parent.shape == (2, 6) and graphs.is_forest(out.parent, g.source)
    twin = graphs.GenericGraphModel.matched(model, depth=4, key=jax.random.key(1))
    assert len(twin.core.steps) == 4
    ```
    """

    encoder: eqx.nn.Linear
    core: Core
    head: ParentHead
    algorithm: AbstractAlgorithm = eqx.field(static=True)

    def __init__(self, core: Core, algorithm: str | AbstractAlgorithm, *, key: PRNGKeyArray):
        step = core.step if isinstance(core, nn.ImplicitGraphTransformer) else core.steps[0]
        if step.edge_features != 1:
            raise ValueError(f"the core's steps must read 1 edge feature; got {step.edge_features}")
        ke, kh = jax.random.split(key)
        dtype = step.log_gamma.dtype
        self.algorithm = algorithm_of(algorithm)
        self.encoder = eqx.nn.Linear(2, step.dim, key=ke, dtype=dtype)
        self.core = core
        self.head = ParentHead(step.dim, 1, key=kh, dtype=dtype)

    @classmethod
    def deq(
        cls,
        dim: int,
        heads: int,
        algorithm: str | AbstractAlgorithm,
        *,
        key: PRNGKeyArray,
        solver: Solver | None = None,
        adjoint: AbstractAdjoint | None = None,
        dtype=None,
    ) -> GenericGraphModel:
        """The DEQ: one [`nn.GraphTransformerStep`][eqattn.nn.GraphTransformerStep] of `dim`
        channels and `heads` heads, solved by `solver` (default Picard iteration to a relative
        residual of 1e-4 within 4096 steps) and differentiated by `adjoint` (default the
        implicit adjoint)."""
        kc, km = jax.random.split(key)
        step = nn.GraphTransformerStep(dim, heads, key=kc, edge_features=1, dtype=dtype)
        solver = Picard(rtol=1e-4, max_steps=4096) if solver is None else solver
        core = nn.ImplicitGraphTransformer(step, solver=solver, adjoint=adjoint)
        return cls(core, algorithm, key=km)

    @classmethod
    def explicit(
        cls,
        dim: int,
        heads: int,
        algorithm: str | AbstractAlgorithm,
        *,
        depth: int,
        key: PRNGKeyArray,
        hidden: int | None = None,
        dtype=None,
    ) -> GenericGraphModel:
        """The explicit model: `depth` untied steps of `dim` channels, `heads` heads and an
        MLP of `hidden` units (default `2 * dim`); a node hears of the source within `depth`
        edges only."""
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"`depth` must be an int >= 1; got {depth!r}")
        kc, km = jax.random.split(key)
        steps = (
            nn.GraphTransformerStep(dim, heads, key=k, edge_features=1, hidden=hidden, dtype=dtype)
            for k in jax.random.split(kc, depth)
        )
        return cls(nn.ExplicitGraphTransformer(steps), algorithm, key=km)

    @classmethod
    def matched(cls, deq: GenericGraphModel, *, depth: int, key: PRNGKeyArray) -> GenericGraphModel:
        """The explicit twin of `deq`: `depth` untied steps, its encoder and head included
        within 5% of `deq`'s parameters
        ([`twin_shape`][eqattn.graphs.GenericGraphModel.twin_shape])."""
        dim, heads, hidden = deq.twin_shape(depth)
        return cls.explicit(dim, heads, deq.algorithm, depth=depth, key=key, hidden=hidden)

    def twin_shape(self, depth: int) -> tuple[int, int, int]:
        """`(dim, heads, hidden)` of [`matched`][eqattn.graphs.GenericGraphModel.matched]'s twin
        of `depth` steps ([`nn.twin_shape`][eqattn.nn.twin_shape]'s rule; what a run records, so
        that its checkpoint rebuilds the same model). A `ValueError` if no shape is within 5%."""
        if not isinstance(self.core, nn.ImplicitGraphTransformer):
            raise TypeError("`matched` takes a DEQ's parameters; this model is explicit")
        algorithm, explicit = self.algorithm, type(self).explicit

        def build(dim: int, heads: int, hidden: int, d: int) -> GenericGraphModel:
            return explicit(dim, heads, algorithm, depth=d, key=jax.random.key(0), hidden=hidden)

        arrays = (
            x for x in jax.tree.leaves(self) if isinstance(x, jax.Array | jax.ShapeDtypeStruct)
        )
        return nn.twin_shape(sum(x.size for x in arrays), self.core.step, depth, build)

    @property
    def is_deq(self) -> bool:
        """Whether the core is solved to its fixed point."""
        return isinstance(self.core, nn.ImplicitGraphTransformer)

    def _read(self, x: Inputs) -> tuple[Graph, Array, Array]:
        graph, anchors = x
        anchors = jnp.asarray(anchors)
        code = jax.vmap(self.encoder)(
            jax.nn.one_hot(anchors.astype(jnp.int32), 2, dtype=self.encoder.weight.dtype)
        )
        return _features(self.algorithm, graph), anchors, code

    def scores(self, z: Float[Array, "n dim"], graph: Graph, anchors) -> ParentScores:
        """The parent scores of the states `z` (module docstring)."""
        edges, own = self.head(z, graph)
        edges, _ = read_out(edges, anchors, graph)
        own = jnp.where(anchors, 0.0, own).astype(edges.dtype)
        n = own.shape[0]
        receivers = jnp.asarray(graph.receivers)
        top = jax.ops.segment_max(edges, receivers, num_segments=n)
        best = jnp.isfinite(edges) & (edges >= top.at[receivers].get(mode="fill", fill_value=0))
        best = best & (edges > own.at[receivers].get(mode="fill", fill_value=jnp.inf))
        ties = jax.ops.segment_sum(best.astype(jnp.int32), receivers, num_segments=n)
        resolved = anchors | ((ties <= 1) & (top != own))
        return ParentScores(edges, own, best, resolved, anchors | (top > own))

    @eqx.filter_jit
    def predict(self, x: Inputs, *, budget=None, key=None, z0=None) -> Prediction:
        """One graph's [`ParentScores`][eqattn.graphs.ParentScores] and the solve's
        statistics (an explicit model's: 0 steps, converged)."""
        graph, anchors, code = self._read(x)
        if isinstance(self.core, nn.ImplicitGraphTransformer):
            z, eq = self.core.forward(code, graph, z0=z0, budget=budget)
            scores = self.scores(z, graph, anchors)
            return Prediction(scores, eq.steps, eq.relative_residual, eq.converged, z)
        z = self.core(code, graph)
        return Prediction(
            self.scores(z, graph, anchors), jnp.array(0), jnp.array(0.0), jnp.array(True), None
        )

    def unrolled(self, x: Inputs, steps, *, z0=None) -> tuple[ParentScores, Array]:
        """The DEQ's step run `steps` times from zeros (or `z0`): `(scores, state)`."""
        if not isinstance(self.core, nn.ImplicitGraphTransformer):
            raise TypeError("`unrolled` runs a DEQ's step; this model is explicit")
        graph, anchors, code = self._read(x)
        z = self.core.iterate(code, graph, steps, z0=z0)
        return self.scores(z, graph, anchors), z
