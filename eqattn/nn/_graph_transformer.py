r"""A generic graph-transformer block, solved to its fixed point or stacked untied.

One step maps the nodes' states $z$ `[n, d]` and their input code $x$ (injected at every step)
over a [`Graph`][eqattn.Graph] to

$$u = \mathrm{LN}(z + x), \qquad h = \mathrm{LN}\big(u + W_o\,\mathrm{MHA}(u)\big), \qquad
z' = \mathrm{LN}\big(h + \mathrm{MLP}(h)\big),$$

where node $i$'s head $k$ attends over its incoming edges $e = j \to i$ with query $W_q u_i$,
key $W_k u_j + E_k f_e$ and value $W_v u_j + E_v f_e$ ($f_e$ the edge's features, if any) at
the inverse temperature $\gamma_k / \sqrt{d_k}$, $\gamma_k$ learned from 1
([`eqattn.graph_attention`][]). Nothing in it knows a task: no semiring messages, no reach
flags, no temperature set near a hard limit. Tokens are a graph too (a chain, with edge
features saying left from right), so the same block reads bit strings, grids and graphs.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray

from .._errors import GraphError
from .._graph import Graph, graph_attention
from .._solve import AbstractAdjoint, Anderson, Equilibrium, Solver
from ._layer import AbstractEquilibriumLayer


def _linear(fan_in: int, fan_out: int, key, dtype, bias: bool = True) -> eqx.nn.Linear:
    return eqx.nn.Linear(fan_in, fan_out, use_bias=bias, key=key, dtype=dtype)


class GraphTransformerStep(eqx.Module):
    r"""One generic graph-transformer step $z' = f(z, x, G)$ (module docstring): multi-head
    attention over each node's incoming edges, with the edges' features in keys and values, an
    MLP, layer norms, and the input code $x$ added at the start.

    **Arguments:** `dim` (the state's width), `num_heads` (dividing `dim`), `key`;
    `edge_features`, the features per edge (0: none read); `hidden`, the MLP's width (default
    `2 * dim`).

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn
    from eqattn.nn import GraphTransformerStep

    step = GraphTransformerStep(8, 2, edge_features=1, key=jax.random.key(0))
    g = eqattn.Graph(jnp.array([0, 1, 1, 2]), jnp.array([1, 0, 2, 1]), num_nodes=3,
                     edge_features=jnp.ones((4, 1)))  # a path 0 - 1 - 2
    z, x = jnp.zeros((3, 8)), jax.random.normal(jax.random.key(1), (3, 8))
    new = step(z, x, g)
    assert new.shape == (3, 8) and jnp.allclose(new.mean(-1), 0, atol=1e-5)  # layer-normed
    ```
    """

    to_query: eqx.nn.Linear
    to_key: eqx.nn.Linear
    to_value: eqx.nn.Linear
    edge_to_key: eqx.nn.Linear | None
    edge_to_value: eqx.nn.Linear | None
    to_out: eqx.nn.Linear
    mlp: eqx.nn.MLP
    norms: tuple[eqx.nn.LayerNorm, eqx.nn.LayerNorm, eqx.nn.LayerNorm]
    log_gamma: Float[Array, " heads"]
    num_heads: int = eqx.field(static=True)

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        key: PRNGKeyArray,
        edge_features: int = 0,
        hidden: int | None = None,
        dtype=None,
    ):
        for name, value in (("dim", dim), ("num_heads", num_heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be an int >= 1; got {value!r}")
        if dim % num_heads:
            raise ValueError(f"`num_heads` ({num_heads}) must divide `dim` ({dim})")
        if isinstance(edge_features, bool) or not isinstance(edge_features, int):
            raise ValueError(f"`edge_features` must be an int >= 0; got {edge_features!r}")
        if edge_features < 0:
            raise ValueError(f"`edge_features` must be an int >= 0; got {edge_features!r}")
        hidden = 2 * dim if hidden is None else hidden
        dtype = dtype or jnp.result_type(float)
        kq, kk, kv, kek, kev, ko, km = jax.random.split(key, 7)
        self.to_query = _linear(dim, dim, kq, dtype)
        self.to_key = _linear(dim, dim, kk, dtype)
        self.to_value = _linear(dim, dim, kv, dtype)
        edges = edge_features > 0
        self.edge_to_key = _linear(edge_features, dim, kek, dtype, False) if edges else None
        self.edge_to_value = _linear(edge_features, dim, kev, dtype, False) if edges else None
        self.to_out = _linear(dim, dim, ko, dtype)
        self.mlp = eqx.nn.MLP(dim, dim, hidden, 1, activation=jax.nn.gelu, key=km, dtype=dtype)
        self.norms = tuple(eqx.nn.LayerNorm(dim, dtype=dtype) for _ in range(3))  # type: ignore[assignment]
        self.log_gamma = jnp.zeros((num_heads,), dtype)
        self.num_heads = num_heads

    @property
    def dim(self) -> int:
        """The state's width."""
        return int(self.to_out.weight.shape[0])

    @property
    def edge_features(self) -> int:
        """The features per edge read (0: none)."""
        return 0 if self.edge_to_key is None else int(self.edge_to_key.weight.shape[1])

    def check(self, graph: Graph) -> Graph:
        """`graph`, checked to carry `edge_features` features per edge (a `GraphError`
        otherwise)."""
        if not isinstance(graph, Graph):
            raise GraphError(f"`graph` must be an eqattn.Graph; got {type(graph).__name__}")
        if self.edge_features:
            return graph.check(edge_features=self.edge_features)
        return graph.check()

    def attention(self, u: Float[Array, "n dim"], graph: Graph) -> Float[Array, "n dim"]:
        """Multi-head attention of each node over its incoming edges (module docstring)."""
        n, d, heads = u.shape[0], self.dim, self.num_heads
        senders = jnp.clip(jnp.asarray(graph.senders), 0, n - 1)
        q = jax.vmap(self.to_query)(u)
        k = jax.vmap(self.to_key)(u)[senders]
        v = jax.vmap(self.to_value)(u)[senders]
        if self.edge_to_key is not None and self.edge_to_value is not None:
            f = jnp.asarray(graph.edge_features, u.dtype)
            k = k + jax.vmap(self.edge_to_key)(f)
            v = v + jax.vmap(self.edge_to_value)(f)
        split = lambda a: a.reshape(a.shape[0], heads, d // heads).swapaxes(0, 1)  # noqa: E731
        beta = jnp.exp(self.log_gamma) / jnp.sqrt(d // heads)
        per_head = jax.vmap(lambda q, k, v, b: graph_attention(q, k, v, graph, beta=b))
        out = per_head(split(q), split(k), split(v), beta)  # [heads, n, d / heads]
        return jax.vmap(self.to_out)(out.swapaxes(0, 1).reshape(n, d))

    def __call__(
        self, z: Float[ArrayLike, "n dim"], x: Float[ArrayLike, "n dim"], graph: Graph
    ) -> Float[Array, "n dim"]:
        """The next state (module docstring)."""
        z, x = jnp.asarray(z), jnp.asarray(x)
        norm = lambda k, a: jax.vmap(self.norms[k])(a)  # noqa: E731
        u = norm(0, z + x)
        h = norm(1, u + self.attention(u, graph))
        return norm(2, h + jax.vmap(self.mlp)(h))


def _check_inputs(step: GraphTransformerStep, x, graph: Graph) -> tuple[Array, Graph]:
    graph = step.check(graph)
    x = jnp.asarray(x)
    if x.shape != (graph.num_nodes, step.dim):
        raise GraphError(
            f"`x` must be [{graph.num_nodes}, {step.dim}] (one code per node); got {list(x.shape)}"
        )
    return x, graph


class ImplicitGraphTransformer(AbstractEquilibriumLayer):
    r"""A [`GraphTransformerStep`][eqattn.nn.GraphTransformerStep] solved to its fixed point,
    $z^* = f(z^*, x, G)$: a graph transformer of unbounded depth whose every step injects the
    input code $x$ (Bai et al. 2019; Anil et al. 2022), so that a larger graph is answered by
    iterating longer.

    **Arguments:** `step`, the step solved; `solver`, `adjoint`, `throw` as in
    [`eqattn.fixed_point`][] (default `Anderson(rtol=1e-4)` and the implicit adjoint).

    Acts on one graph: `layer.forward(x, graph, *, z0=None, budget=None)` returns $z^*$ `[n,
    dim]` and the solve's [`eqattn.Equilibrium`][]; `x` is the nodes' input code `[n, dim]`
    (an encoder's output). `layer.iterate(x, graph, steps)` runs the same step a fixed number
    of times from zeros (the tied, unrolled control).

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn
    from eqattn import nn

    step = nn.GraphTransformerStep(8, 2, edge_features=1, key=jax.random.key(0))
    layer = nn.ImplicitGraphTransformer(step)
    g = eqattn.Graph(jnp.array([0, 1, 1, 2]), jnp.array([1, 0, 2, 1]), num_nodes=3,
                     edge_features=jnp.ones((4, 1)))  # a path 0 - 1 - 2
    x = jax.random.normal(jax.random.key(1), (3, 8))
    z, eq = layer.forward(x, g)
    assert z.shape == (3, 8) and eq.converged
    assert jnp.allclose(layer.step(z, x, g), z, atol=1e-3)  # a fixed point of the step
    ```
    """

    step: GraphTransformerStep
    solver: Any
    adjoint: AbstractAdjoint
    throw: bool = eqx.field(static=True)

    def __init__(
        self,
        step: GraphTransformerStep,
        *,
        solver: Solver | None = None,
        adjoint: AbstractAdjoint | None = None,
        throw: bool = False,
    ):
        if not isinstance(step, GraphTransformerStep):
            raise TypeError(f"`step` must be a GraphTransformerStep; got {type(step).__name__}")
        self.step = step
        dtype = step.log_gamma.dtype
        self.solver, self.adjoint = self.solving(solver, adjoint, Anderson(rtol=1e-4), dtype)
        self.throw = throw

    def equilibrium(
        self,
        x: Float[ArrayLike, "n dim"],
        graph: Graph,
        *,
        z0: Float[ArrayLike, "n dim"] | None = None,
        budget: int | Int[ArrayLike, ""] | None = None,
    ) -> Equilibrium:
        """The fixed point $z^*$ from zeros (or `z0`); `budget` caps the solver's steps."""
        code, graph = _check_inputs(self.step, x, graph)
        start = jnp.zeros_like(code) if z0 is None else jnp.asarray(z0, code.dtype)
        return self.solve(_apply_step, start, code, graph, budget=budget)

    def forward(
        self, x, graph: Graph, *, z0=None, budget=None
    ) -> tuple[Float[Array, "n dim"], Equilibrium]:
        """$z^*$ and its [`eqattn.Equilibrium`][]."""
        eq = self.equilibrium(x, graph, z0=z0, budget=budget)
        return eq.value, eq

    def iterate(
        self,
        x: Float[ArrayLike, "n dim"],
        graph: Graph,
        steps: int | Int[ArrayLike, ""],
        *,
        z0: Float[ArrayLike, "n dim"] | None = None,
    ) -> Float[Array, "n dim"]:
        """The step applied `steps` times from zeros (or `z0`), with no stopping test: the tied
        twin run as deep as training ran it, or a partial solve to train from.

        `steps` is an int >= 0 (differentiable in reverse mode), or a traced integer (a loop of
        unknown length, forward mode only: hold what it reads under `jax.lax.stop_gradient`,
        as training from a random, partly solved start does (Anil et al. 2022))."""
        if isinstance(steps, bool) or (isinstance(steps, int) and steps < 0):
            raise ValueError(f"`steps` must be an int >= 0 or a traced integer; got {steps!r}")
        if not isinstance(steps, int):
            count = jnp.asarray(steps)
            if count.shape != () or not jnp.issubdtype(count.dtype, jnp.integer):
                raise ValueError(f"`steps` must be an int >= 0 or a traced integer; got {steps!r}")
        code, graph = _check_inputs(self.step, x, graph)
        z = jnp.zeros_like(code) if z0 is None else jnp.asarray(z0, code.dtype)
        if z.shape != code.shape:
            raise GraphError(
                f"`z0` must be [{code.shape[0]}, {code.shape[1]}]; got {list(z.shape)}"
            )
        return jax.lax.fori_loop(0, steps, lambda _, z: self.step(z, code, graph), z)


def _apply_step(layer: ImplicitGraphTransformer, z, x, graph):
    return layer.step(z, x, graph)


class ExplicitGraphTransformer(eqx.Module):
    r"""The explicit twin of [`ImplicitGraphTransformer`][eqattn.nn.ImplicitGraphTransformer]:
    `steps`, untied [`GraphTransformerStep`][eqattn.nn.GraphTransformerStep]s of one shape,
    each injecting $x$, from zeros: $z_{l+1} = f_l(z_l, x, G)$. It sees `len(steps)` edges from
    a node at most.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn
    from eqattn import nn

    keys = jax.random.split(jax.random.key(0), 3)
    stack = nn.ExplicitGraphTransformer(nn.GraphTransformerStep(8, 2, key=k) for k in keys)
    g = eqattn.Graph(jnp.array([0, 1]), jnp.array([1, 0]), num_nodes=2)
    assert stack(jnp.ones((2, 8)), g).shape == (2, 8) and len(stack.steps) == 3
    ```
    """

    steps: tuple[GraphTransformerStep, ...]

    def __init__(self, steps):
        steps = tuple(steps)
        if not steps or not all(isinstance(s, GraphTransformerStep) for s in steps):
            raise TypeError("`steps` must be one or more GraphTransformerSteps")
        if len({(s.dim, s.num_heads, s.edge_features) for s in steps}) > 1:
            raise ValueError("`steps` must share one width, head count and count of edge features")
        self.steps = steps

    def __call__(self, x: Float[ArrayLike, "n dim"], graph: Graph) -> Float[Array, "n dim"]:
        """$z_{\\mathrm{depth}}$ from $z_0 = 0$. Steps of one structure (the usual case) run
        as a `lax.scan` over their stacked parameters: one step is compiled, however deep."""
        code, graph = _check_inputs(self.steps[0], x, graph)
        z = jnp.zeros_like(code)
        parts = [eqx.partition(step, eqx.is_array) for step in self.steps]
        shapes = {
            (jax.tree.structure(p), tuple((a.shape, a.dtype) for a in jax.tree.leaves(p)))
            for p, _ in parts
        }
        if len(shapes) > 1 or any(not eqx.tree_equal(st, parts[0][1]) for _, st in parts):
            for step in self.steps:  # steps of different shapes (MLP widths): one by one
                z = step(z, code, graph)
            return z
        stacked = jax.tree.map(lambda *a: jnp.stack(a), *(p for p, _ in parts))
        static = parts[0][1]

        def body(z, params):
            return eqx.combine(params, static)(z, code, graph), None

        return jax.lax.scan(body, z, stacked)[0]
