r"""A reasoning model over graphs: categorical node inputs one-hot -> a linear code per node ->
the generic graph transformer (solved to its fixed point, or stacked untied) -> a linear
read-out of logits per node. The encoder and decoder are a task's only parts: bit strings
(`eqattn.prefix_sums`) and mazes (`eqattn.mazes`) are both a graph of such nodes."""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray

from .._graph import Graph
from .._solve import AbstractAdjoint, Picard, Solver
from ._graph_transformer import (
    ExplicitGraphTransformer,
    GraphTransformerStep,
    ImplicitGraphTransformer,
)
from ._model import Prediction

Core = ImplicitGraphTransformer | ExplicitGraphTransformer


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be an int >= 1; got {value!r}")
    return value


class GraphReasoner(eqx.Module):
    r"""Logits per node of a graph whose nodes carry one of `categories` inputs:
    $x = W_e\,\mathrm{onehot}(c)$, $z$ = the core's answer over the graph, logits $= W_d z$.
    The DEQ's core is an [`ImplicitGraphTransformer`][eqattn.nn.ImplicitGraphTransformer]
    (a larger graph is answered by iterating longer); its explicit twin's an
    [`ExplicitGraphTransformer`][eqattn.nn.ExplicitGraphTransformer].

    Build it with [`deq`][eqattn.nn.GraphReasoner.deq],
    [`explicit`][eqattn.nn.GraphReasoner.explicit] or
    [`matched`][eqattn.nn.GraphReasoner.matched] (the DEQ's explicit twin of equal
    parameters). `model.predict(inputs, graph, budget=, z0=)` answers one graph
    ([`Prediction`][eqattn.nn.Prediction]: logits `[n, classes]`, the solve's steps and
    convergence); `model.unrolled(inputs, graph, steps, z0=)` runs the DEQ's step a fixed
    number of times instead (the tied control, and training).

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn
    from eqattn import nn

    model = nn.GraphReasoner.deq(16, 2, categories=2, classes=2, edge_features=1,
                                 key=jax.random.key(0))
    g = eqattn.Graph(jnp.array([0, 1, 1, 2]), jnp.array([1, 0, 2, 1]), num_nodes=3,
                     edge_features=jnp.ones((4, 1)))  # a path 0 - 1 - 2
    p = model.predict(jnp.array([1, 0, 0]), g)
    assert p.logits.shape == (3, 2) and p.converged
    twin = nn.GraphReasoner.matched(model, depth=3, key=jax.random.key(1))
    assert twin.predict(jnp.array([1, 0, 0]), g).logits.shape == (3, 2)
    ```
    """

    encoder: eqx.nn.Linear
    core: Core
    decoder: eqx.nn.Linear

    def __init__(self, core: Core, *, categories: int, classes: int, key: PRNGKeyArray):
        step = _first_step(core)
        ke, kd = jax.random.split(key)
        dtype = step.log_gamma.dtype
        categories, classes = _positive("categories", categories), _positive("classes", classes)
        self.encoder = eqx.nn.Linear(categories, step.dim, key=ke, dtype=dtype)
        self.core = core
        self.decoder = eqx.nn.Linear(step.dim, classes, key=kd, dtype=dtype)

    @classmethod
    def deq(
        cls,
        dim: int,
        heads: int,
        *,
        categories: int,
        classes: int,
        edge_features: int,
        key: PRNGKeyArray,
        solver: Solver | None = None,
        adjoint: AbstractAdjoint | None = None,
        dtype=None,
    ) -> GraphReasoner:
        """The DEQ: one step of `dim` channels and `heads` heads reading `edge_features`
        features per edge, solved by `solver` (default Picard iteration to a relative residual
        of 1e-4 within 4096 steps), differentiated by `adjoint` (default the implicit
        adjoint)."""
        kc, km = jax.random.split(key)
        step = GraphTransformerStep(dim, heads, key=kc, edge_features=edge_features, dtype=dtype)
        solver = Picard(rtol=1e-4, max_steps=4096) if solver is None else solver
        core = ImplicitGraphTransformer(step, solver=solver, adjoint=adjoint)
        return cls(core, categories=categories, classes=classes, key=km)

    @classmethod
    def explicit(
        cls,
        dim: int,
        heads: int,
        *,
        depth: int,
        categories: int,
        classes: int,
        edge_features: int,
        key: PRNGKeyArray,
        hidden: int | None = None,
        dtype=None,
    ) -> GraphReasoner:
        """The explicit model: `depth` untied steps of `dim` channels, `heads` heads and an MLP
        of `hidden` units (default `2 * dim`); it sees `depth` edges from a node at most.
        [`matched`][eqattn.nn.GraphReasoner.matched] gives the DEQ's twin."""
        depth = _positive("depth", depth)
        kc, km = jax.random.split(key)
        steps = (
            GraphTransformerStep(
                dim, heads, key=k, edge_features=edge_features, hidden=hidden, dtype=dtype
            )
            for k in jax.random.split(kc, depth)
        )
        core = ExplicitGraphTransformer(steps)
        return cls(core, categories=categories, classes=classes, key=km)

    @classmethod
    def matched(
        cls, deq: GraphReasoner, *, depth: int, key: PRNGKeyArray, dtype=None
    ) -> GraphReasoner:
        """The explicit twin of `deq`: `depth` untied steps with `deq`'s parameters, within 5%
        (of the shapes that are, the one whose MLP is nearest the usual `2 * dim` units; heads:
        the most, at most `deq`'s, that divide its `dim`). A `ValueError` if no shape is."""
        dim, heads, hidden = deq.twin_shape(depth)
        return cls.explicit(dim, heads, depth=depth, key=key, hidden=hidden, dtype=dtype,
                            **deq.shape)  # fmt: skip

    def twin_shape(self, depth: int) -> tuple[int, int, int]:
        """`(dim, heads, hidden)` of [`matched`][eqattn.nn.GraphReasoner.matched]'s twin of
        `depth` steps (what a run records, so that its checkpoint rebuilds the same model)."""
        return _twin_shape(self, depth)

    @staticmethod
    def twin_heads(dim: int, at_most: int) -> int:
        """The heads of a twin step of `dim` channels: the most, at most `at_most`, that
        divide `dim`."""
        return max(h for h in range(1, at_most + 1) if dim % h == 0)

    @property
    def shape(self) -> dict[str, int]:
        """`categories`, `classes` and `edge_features`: what a twin must read and answer."""
        return dict(
            categories=int(self.encoder.weight.shape[1]),
            classes=int(self.decoder.weight.shape[0]),
            edge_features=_first_step(self.core).edge_features,
        )

    def with_solver(self, solver: Solver) -> GraphReasoner:
        """The DEQ with another solver (e.g. the overthinking control, Picard iteration whose
        stopping test only an exact fixed point passes: `Picard(rtol=1e-30, atol=0.0,
        max_steps=4 * budget)`)."""
        if not isinstance(self.core, ImplicitGraphTransformer):
            raise TypeError("`with_solver` sets a DEQ's solver; this model is explicit")
        return eqx.tree_at(lambda m: m.core.solver, self, solver)

    @property
    def is_deq(self) -> bool:
        """Whether the core is solved to its fixed point."""
        return isinstance(self.core, ImplicitGraphTransformer)

    def code(self, inputs: Int[ArrayLike, " n"]) -> Float[Array, "n dim"]:
        """Each node's input code (injected at every step)."""
        inputs = jnp.asarray(inputs)
        categories = self.encoder.weight.shape[1]
        if inputs.ndim != 1 or not jnp.issubdtype(inputs.dtype, jnp.integer):
            raise ValueError(
                f"`inputs` must be one graph's node categories, integers [n]; got "
                f"{inputs.dtype}{list(inputs.shape)}"
            )
        return jax.vmap(self.encoder)(
            jax.nn.one_hot(inputs, categories, dtype=self.encoder.weight.dtype)
        )

    @eqx.filter_jit
    def predict(
        self, inputs: Int[ArrayLike, " n"], graph: Graph, *, budget=None, z0=None
    ) -> Prediction:
        """The logits `[n, classes]` of one graph and the solve's statistics (class
        docstring); one compiled program, as the `eqattn.nn` models' calls are."""
        x = self.code(inputs)
        if isinstance(self.core, ImplicitGraphTransformer):
            z, eq = self.core.forward(x, graph, z0=z0, budget=budget)
            return Prediction(
                jax.vmap(self.decoder)(z), eq.steps, eq.relative_residual, eq.converged, z
            )
        z = self.core(x, graph)
        return Prediction(
            jax.vmap(self.decoder)(z), jnp.array(0), jnp.array(0.0), jnp.array(True), None
        )

    def unrolled(
        self, inputs: Int[ArrayLike, " n"], graph: Graph, steps, *, z0=None
    ) -> tuple[Float[Array, "n classes"], Float[Array, "n dim"]]:
        """The DEQ's step run `steps` times from zeros (or `z0`): `(logits, state)`."""
        if not isinstance(self.core, ImplicitGraphTransformer):
            raise TypeError("`unrolled` runs a DEQ's step; this model is explicit")
        z = self.core.iterate(self.code(inputs), graph, steps, z0=z0)
        return jax.vmap(self.decoder)(z), z


def _first_step(core) -> GraphTransformerStep:
    if isinstance(core, ImplicitGraphTransformer):
        return core.step
    if isinstance(core, ExplicitGraphTransformer):
        return core.steps[0]
    raise TypeError(
        "`core` must be an nn.ImplicitGraphTransformer or nn.ExplicitGraphTransformer; "
        f"got {type(core).__name__}"
    )


def _size(tree) -> int:
    """The entries of `tree`'s arrays (or shapes of arrays)."""
    leaves = jax.tree.leaves(tree)
    return sum(x.size for x in leaves if isinstance(x, jax.Array | jax.ShapeDtypeStruct))


def _twin_shape(deq: GraphReasoner, depth: int) -> tuple[int, int, int]:
    """`(dim, heads, hidden)` of `GraphReasoner.matched`."""
    if not deq.is_deq:
        raise TypeError("`matched` takes a DEQ's parameters; this model is explicit")
    shape = deq.shape

    def build(dim: int, heads: int, hidden: int, depth: int) -> GraphReasoner:
        return GraphReasoner.explicit(
            dim, heads, depth=depth, key=jax.random.key(0), hidden=hidden, **shape
        )

    return twin_shape(_size(deq), _first_step(deq.core), depth, build)


def twin_shape(
    target: int,
    step: GraphTransformerStep,
    depth: int,
    build: Callable[[int, int, int, int], eqx.Module],
) -> tuple[int, int, int]:
    """`(dim, heads, hidden)` of the explicit model of `depth` untied steps that has `target`
    parameters within 5% (of those that do, the one whose MLP is nearest `2 * dim` units;
    heads: the most, at most `step`'s, that divide `dim`); `build(dim, heads, hidden, depth)`
    builds one (only its shapes are evaluated). The count is affine in `hidden` and in the
    depth: four counts of one- and two-step models give a width's best `hidden`. A
    `ValueError` if no shape is within 5%. (A model with parts besides its steps, e.g. a
    decoder whose size follows the width, is matched whole: `build` builds all of it.)

    **Example:**

    ```python
    import equinox as eqx, jax
    from eqattn import nn

    deq = nn.GraphReasoner.deq(16, 2, categories=2, classes=2, edge_features=1,
                               key=jax.random.key(0))
    def build(dim, heads, hidden, depth):
        return nn.GraphReasoner.explicit(dim, heads, depth=depth, hidden=hidden, categories=2,
                                         classes=2, edge_features=1, key=jax.random.key(0))
    size = lambda m: sum(x.size for x in jax.tree.leaves(eqx.filter(m, eqx.is_array)))
    dim, heads, hidden = nn.twin_shape(size(deq), deq.core.step, 4, build)
    assert abs(size(build(dim, heads, hidden, 4)) / size(deq) - 1) <= 0.05
    ```
    """

    def count(dim: int, heads: int, hidden: int) -> int:
        """The parameters of `depth` steps (from those of one and two)."""
        one, two = (
            _size(eqx.filter_eval_shape(lambda d=d: build(dim, heads, hidden, d))) for d in (1, 2)
        )
        return one + (depth - 1) * (two - one)

    found = []
    for dim in range(1, step.dim + 1):
        heads = GraphReasoner.twin_heads(dim, step.num_heads)
        one, two = count(dim, heads, 1), count(dim, heads, 2)
        if one > 1.05 * target:  # wider only adds parameters
            break
        hidden = max(1, round(1 + (target - one) / (two - one)))
        off = abs(one + (hidden - 1) * (two - one) - target) / target
        if off <= 0.05:
            found.append((abs(hidden - 2 * dim), -dim, (dim, heads, hidden)))
    if not found:
        raise ValueError(
            f"no explicit model of {depth} steps comes within 5% of the DEQ's {target:,} "
            "parameters; choose another `depth`"
        )
    return min(found)[2]
