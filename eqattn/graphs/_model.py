r"""The graph models: a DEQ whose one propagation block is solved to its fixed point (an
[`eqattn.nn.AbstractEquilibriumLayer`][] like the library's other layers), and its explicit twin,
a stack of untied blocks of the same kind; every node reads only its neighbours, so both are
permutation-equivariant. A graph is given as its dense adjacency (attention masked by it) or as an
edge list (attention over each node's incoming edges, [`eqattn.graph_attention`][]: O(E) a step);
the two compute the same maps (tested).

The **propagation block** is attention that preserves norms. A node's state $z_i$ attends over its neighbours with scores $\beta\, z_i \cdot R z_j$ and
values $R z_j$, $R = \exp(S - S^\top)$ orthogonal ($S = AB^\top$ learned), and the result is
normalized to unit length; the source's state is pinned to a code of its input,
$c = \mathrm{normalize}(W x_s + b)$. A node no neighbour of which is reached gets a zero value
and stays at zero. So reached states have norm 1 at every distance (nothing decays along a
path), and a node one edge further holds $R$ times its parent's state: the scores tell a parent
($z_i \cdot R z_p = 1$) from a child or a sibling. The fixed point from zero states is reached
after as many steps as the source's eccentricity. Reachability is read from the norm
($\gamma(\lVert z_i\rVert - \tfrac12)$) and the parent from the same scores, a node's own
score being a learned constant (the source and the unreached choose themselves).

Only this block is kept: a transformer block masked by the adjacency ([`eqattn.nn.DEQBlock`][])
learned the training sizes but its fixed point decays with distance (15.3% of the nodes of a
256-node path; the findings page)."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray

from .. import nn
from .._attention import attention, graph_attention
from .._solve import Equilibrium, JacobianFree, Picard
from ..nn import Prediction

IDENTITY_DIM = 16
"""The width of each node's random identity vector (its input beside the source flag)."""

Inputs = (
    tuple[Float[Array, "n f"], Bool[ArrayLike, "n n"]]
    | tuple[Float[Array, "n f"], Int[ArrayLike, " E"], Int[ArrayLike, " E"]]
)
"""One graph: its nodes' inputs (identity vector, then the source flag), then its adjacency or
its edges' senders and receivers (both directions of each undirected edge; a receiver `n` is
padding)."""


def per_token(linear: eqx.nn.Linear, x: Float[Array, "n f"]) -> Float[Array, "n out"]:
    """`linear` applied to each row of `x`, as one matmul."""
    y = x @ linear.weight.T
    return y if linear.bias is None else y + linear.bias


def norm(z: Float[Array, "*batch d"]) -> Float[Array, "*batch"]:
    """Each row's length, with a finite gradient at zero."""
    return jnp.sqrt(jnp.sum(z * z, axis=-1) + 1e-12)


def normalize(z: Float[Array, "*batch d"]) -> Float[Array, "*batch d"]:
    """Each row at unit length; a (numerically) zero row stays zero, with a zero gradient (not
    `1 / sqrt(eps)`: through a stack of blocks that would overflow)."""
    squared = jnp.sum(z * z, axis=-1, keepdims=True)
    live = squared > 1e-12
    return jnp.where(live, z * jax.lax.rsqrt(jnp.where(live, squared, 1.0)), 0.0)


class Propagation(eqx.Module):
    r"""One propagation step: $z_i \leftarrow \mathrm{normalize}(\sum_{j \in N(i)}
    \mathrm{softmax}_j(\beta z_i \cdot R z_j)\, R z_j)$ (module docstring).

    **Example:**

    ```python
    import jax, jax.numpy as jnp
    from eqattn import graphs

    block = graphs.Propagation(4, 4, key=jax.random.key(0))
    rotation = block.rotation()
    assert jnp.allclose(rotation @ rotation.T, jnp.eye(4), atol=1e-5)  # orthogonal
    z = jnp.zeros((3, 4)).at[0].set(jnp.array([1.0, 0, 0, 0]))
    adjacency = jnp.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], bool)  # a path 0 - 1 - 2
    step = block(z, adjacency)
    assert jnp.allclose(step[1], rotation @ z[0], atol=1e-5)  # node 1 holds R z_0
    assert jnp.allclose(step[2], 0.0)  # node 2's neighbour holds nothing yet
    senders, receivers = jnp.array([0, 1, 1, 2]), jnp.array([1, 0, 2, 1])  # the same path
    assert jnp.allclose(block(z, senders, receivers), step, atol=1e-6)
    ```
    """

    first: Float[Array, "width rank"]
    second: Float[Array, "width rank"]
    log_beta: Float[Array, ""]

    def __init__(self, width: int, rank: int, *, key: PRNGKeyArray, dtype=None):
        ka, kb = jax.random.split(key)
        dtype = dtype or jnp.result_type(float)
        scale = 0.3 / jnp.sqrt(rank)
        self.first = scale * jax.random.normal(ka, (width, rank), dtype)
        self.second = scale * jax.random.normal(kb, (width, rank), dtype)
        self.log_beta = jnp.asarray(jnp.log(4.0), dtype)

    def rotation(self) -> Float[Array, "width width"]:
        generator = self.first @ self.second.T
        return jax.scipy.linalg.expm(generator - generator.T)

    def __call__(self, z: Float[Array, "n width"], *graph) -> Float[Array, "n width"]:
        """One step over `graph`: `(adjacency,)` or `(senders, receivers)`."""
        rz, beta = z @ self.rotation().T, jnp.exp(self.log_beta)
        if len(graph) == 1:
            return normalize(attention(z, rz, rz, beta=beta, mask=graph[0]))
        senders, receivers = graph
        return normalize(graph_attention(z, rz[senders], rz[senders], receivers, beta=beta))

    def scores(self, z: Float[Array, "n width"], *graph):
        """$\\beta\\, z_i \\cdot R z_j$: for every pair `[n, n]` (`graph` dense or not
        given), or for each edge $j \\to i$ `[E]` (`graph = (senders, receivers)`)."""
        rz = z @ self.rotation().T
        if len(graph) < 2:
            return jnp.exp(self.log_beta) * (z @ rz.T)
        senders, receivers = graph
        zi = z.at[receivers].get(mode="fill", fill_value=0.0)
        return jnp.exp(self.log_beta) * jnp.sum(zi * rz[senders], axis=-1)


class PropagationHead(eqx.Module):
    """The models' ends: the source's code, and the read-out (reachability from a state's norm,
    parents from the last block's scores)."""

    code: eqx.nn.Linear
    log_gain: Float[Array, ""]
    self_score: Float[Array, ""]

    def __init__(self, width: int, *, key: PRNGKeyArray, dtype=None):
        self.code = eqx.nn.Linear(IDENTITY_DIM + 1, width, key=key, dtype=dtype)
        dtype = dtype or jnp.result_type(float)
        self.log_gain = jnp.asarray(jnp.log(10.0), dtype)
        self.self_score = jnp.asarray(0.0, dtype)

    def pin(self, z: Float[Array, "n w"], features: Float[Array, "n f"]) -> Float[Array, "n w"]:
        """`z` with the source's row held at its code."""
        code = normalize(per_token(self.code, features))
        return jnp.where(features[:, -1:] > 0, code, z)

    def __call__(self, z, graph: tuple, block: Propagation):
        """Dense `graph`: `(reachability logits [n], parent scores [n, n])`; an edge list:
        `(reachability logits [n], each edge's parent score [E], each node's own [n])`."""
        reach = jnp.exp(self.log_gain) * (norm(z) - 0.5)
        if len(graph) == 1:
            return reach, _parent_scores(block.scores(z), graph[0], self.self_score)
        own = jnp.broadcast_to(self.self_score, reach.shape)
        return reach, block.scores(z, *graph), own


def _parent_scores(scores, adjacency, self_score) -> Float[Array, "n n"]:
    """`scores` over each node's neighbours, its own set to `self_score`, -inf elsewhere."""
    eye = jnp.eye(scores.shape[0], dtype=bool)
    return jnp.where(eye, self_score, jnp.where(adjacency, scores, -jnp.inf))


class GraphDEQ(nn.AbstractEquilibriumLayer):
    """One weight-tied propagation block solved to its fixed point (module docstring):
    `model.predict((features, adjacency), budget=...)` gives reachability logits and parent
    scores (`(features, senders, receivers)`: the edges' and each node's own). An equilibrium layer like the library's others: its `solver` (default Picard
    iteration to `rtol` 1e-4, 4096 steps: a step moves what a node knows one edge), `adjoint`
    (default Jacobian-free) and `throw`.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn
    from eqattn import graphs

    model = graphs.GraphDEQ(16, key=jax.random.key(0))
    assert isinstance(model, eqattn.nn.AbstractEquilibriumLayer)
    adjacency = jnp.asarray(graphs.sample("path", 6, 1, seed=0).adjacency[0])
    features = jnp.zeros((6, graphs.IDENTITY_DIM + 1)).at[0, -1].set(1.0)  # node 0: source
    p = model.predict((features, adjacency), budget=20)
    reach, scores = p.logits
    assert reach.shape == (6,) and scores.shape == (6, 6) and int(p.steps) <= 20
    ```
    """

    head: PropagationHead
    block: Propagation
    solver: Any
    adjoint: Any
    throw: bool = eqx.field(static=True)

    def __init__(
        self,
        width: int,
        *,
        key: PRNGKeyArray,
        mlp_ratio: float = 2.0,
        solver=None,
        adjoint=None,
        throw: bool = False,
        dtype=None,
    ):
        kh, kb = jax.random.split(key)
        self.head = PropagationHead(width, key=kh, dtype=dtype)
        self.block = _propagation(width, mlp_ratio, kb, dtype)
        default = Picard(rtol=1e-4, atol=1e-6, max_steps=4096)
        self.solver, self.adjoint = self.solving(solver, adjoint or JacobianFree(), default, dtype)
        self.throw = throw

    def step(self, z: Float[Array, "n width"], features, *graph) -> Float[Array, "n width"]:
        """One propagation step, the source's state pinned to its code: the map solved."""
        return self.head.pin(self.block(z, *graph), features)

    def equilibrium(self, x: Inputs, *, z0=None, budget=None) -> Equilibrium:
        """The nodes' states at the fixed point of `step` (from zeros, or `z0`)."""
        features, *graph = x
        width = self.block.first.shape[0]
        z0 = jnp.zeros((features.shape[0], width), self.block.first.dtype) if z0 is None else z0
        return self.solve(GraphDEQ.step, z0, features, *graph, budget=budget)

    def forward(self, x: Inputs, *, z0=None, budget=None) -> tuple[Any, Equilibrium]:
        """`(logits, Equilibrium)`: the reachability logits and the parent scores (dense: `[n, n]`;
        an edge list: each edge's `[E]` and each node's own `[n]`)."""
        eq = self.equilibrium(x, z0=z0, budget=budget)
        return self.head(eq.value, tuple(x[1:]), self.block), eq

    def predict(self, x: Inputs, *, budget=None, key=None, z0=None) -> Prediction:
        logits, eq = self.forward(x, z0=z0, budget=budget)
        return Prediction(logits, eq.steps, eq.relative_residual, eq.converged, eq.value)


class GraphStack(eqx.Module):
    """The explicit twin: `depth` untied propagation blocks, applied once each (a node reads at
    most `depth` edges away).

    **Example:**

    ```python
    import jax, jax.numpy as jnp
    from eqattn import graphs

    model = graphs.GraphStack(8, 4, key=jax.random.key(0))
    adjacency = jnp.asarray(graphs.sample("path", 6, 1, seed=0).adjacency[0])
    features = jnp.zeros((6, graphs.IDENTITY_DIM + 1)).at[0, -1].set(1.0)
    reach, scores = model.predict((features, adjacency)).logits
    assert reach.shape == (6,) and scores.shape == (6, 6)
    ```
    """

    head: PropagationHead
    blocks: tuple[Propagation, ...]

    def __init__(
        self,
        width: int,
        depth: int,
        *,
        key: PRNGKeyArray,
        mlp_ratio: float = 2.0,
        dtype=None,
    ):
        kh, kb = jax.random.split(key)
        self.head = PropagationHead(width, key=kh, dtype=dtype)
        self.blocks = tuple(
            _propagation(width, mlp_ratio, k, dtype) for k in jax.random.split(kb, depth)
        )

    def predict(self, x: Inputs, *, budget=None, key=None, z0=None) -> Prediction:
        features, *graph = x
        z = jnp.zeros((features.shape[0], self.blocks[0].first.shape[0]), features.dtype)
        for block in self.blocks:
            z = self.head.pin(block(z, *graph), features)
        logits = self.head(z, tuple(graph), self.blocks[-1])
        return Prediction(logits, jnp.array(0), jnp.array(0.0, z.dtype), jnp.array(True), None)


def _propagation(width: int, ratio: float, key, dtype) -> Propagation:
    """A propagation block whose generator has rank `ratio * width / 2` (its parameters,
    `width * rank` twice, are what the explicit baseline's width and ratio match)."""
    return Propagation(width, max(1, round(ratio * width / 2)), key=key, dtype=dtype)
