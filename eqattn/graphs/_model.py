r"""The graph models: a DEQ whose one block is solved to its fixed point, and an explicit stack of
untied blocks of the same kind; every node reads only its neighbours (attention masked by the
adjacency), so both are permutation-equivariant.

The **propagation block** (`block="propagation"`, the default) is attention that preserves
norms. A node's state $z_i$ attends over its neighbours with scores $\beta\, z_i \cdot R z_j$ and
values $R z_j$, $R = \exp(S - S^\top)$ orthogonal ($S = AB^\top$ learned), and the result is
normalized to unit length; the source's state is pinned to a code of its input,
$c = \mathrm{normalize}(W x_s + b)$. A node no neighbour of which is reached gets a zero value
and stays at zero. So reached states have norm 1 at every distance (nothing decays along a
path), and a node one edge further holds $R$ times its parent's state: the scores tell a parent
($z_i \cdot R z_p = 1$) from a child or a sibling. The fixed point from zero states is reached
after as many steps as the source's eccentricity. Reachability is read from the norm
($\gamma(\lVert z_i\rVert - \tfrac12)$) and the parent from the same scores, a node's own
score being a learned constant (the source and the unreached choose themselves).

The **transformer block** (`block="transformer"`) is [`eqattn.nn.DEQBlock`][] (explicit:
[`eqattn.nn.TransformerBlock`][]) with the node inputs injected and the adjacency (with
self-loops) as its mask, read out by a layer norm, a linear reachability logit and bilinear
parent scores: the generic alternative, whose propagation decays with distance (the graphs
guide measures both)."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, PRNGKeyArray

from .. import nn
from .._attention import attention
from .._solve import JacobianFree, Picard, fixed_point
from ..nn import Prediction

IDENTITY_DIM = 16
"""The width of each node's random identity vector (its input beside the source flag)."""

Inputs = tuple[Float[Array, "n f"], Bool[Array, "n n"]]
"""One graph: its nodes' inputs (identity vector, then the source flag) and its adjacency."""


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

    def __call__(self, z: Float[Array, "n width"], adjacency: Bool[Array, "n n"]):
        rz = z @ self.rotation().T
        return normalize(attention(z, rz, rz, beta=jnp.exp(self.log_beta), mask=adjacency))

    def scores(self, z: Float[Array, "n width"]) -> Float[Array, "n n"]:
        """$\\beta\\, z_i \\cdot R z_j$ for every pair."""
        return jnp.exp(self.log_beta) * (z @ (z @ self.rotation().T).T)


class PropagationHead(eqx.Module):
    """The propagation models' ends: the source's code, and the read-out (reachability from a
    state's norm, parents from the last block's scores)."""

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

    def __call__(self, z, adjacency, block: Propagation):
        reach = jnp.exp(self.log_gain) * (norm(z) - 0.5)
        return reach, _parent_scores(block.scores(z), adjacency, self.self_score)


class TransformerHead(eqx.Module):
    """The transformer models' ends: the inputs' embedding, and a layer norm, a linear
    reachability logit and bilinear parent scores."""

    embed: eqx.nn.Linear
    norm: eqx.nn.LayerNorm
    reach: eqx.nn.Linear
    query: eqx.nn.Linear
    key_proj: eqx.nn.Linear
    self_score: Float[Array, ""]

    def __init__(self, width: int, *, key: PRNGKeyArray, dtype=None):
        ke, kr, kq, kk = jax.random.split(key, 4)
        self.embed = eqx.nn.Linear(IDENTITY_DIM + 1, width, key=ke, dtype=dtype)
        self.norm = eqx.nn.LayerNorm(width, dtype=dtype)
        self.reach = eqx.nn.Linear(width, 1, key=kr, dtype=dtype)
        self.query = eqx.nn.Linear(width, width, key=kq, dtype=dtype)
        self.key_proj = eqx.nn.Linear(width, width, key=kk, dtype=dtype)
        self.self_score = jnp.asarray(0.0, dtype or jnp.result_type(float))

    def __call__(self, z, adjacency, block=None):
        z = jax.vmap(self.norm)(z)
        q, k = per_token(self.query, z), per_token(self.key_proj, z)
        scores = q @ k.T / jnp.sqrt(z.shape[-1])
        return per_token(self.reach, z)[:, 0], _parent_scores(scores, adjacency, self.self_score)


def _parent_scores(scores, adjacency, self_score) -> Float[Array, "n n"]:
    """`scores` over each node's neighbours, its own set to `self_score`, -inf elsewhere."""
    eye = jnp.eye(scores.shape[0], dtype=bool)
    return jnp.where(eye, self_score, jnp.where(adjacency, scores, -jnp.inf))


def _unsolved(logits, z) -> Prediction:
    return Prediction(logits, jnp.array(0), jnp.array(0.0, z.dtype), jnp.array(True), None)


class GraphDEQ(eqx.Module):
    """One weight-tied block solved to its fixed point (module docstring): `model.predict((
    features, adjacency), budget=...)` gives reachability logits and parent scores.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn
    from eqattn import graphs

    model = graphs.GraphDEQ(16, key=jax.random.key(0))
    adjacency = jnp.asarray(graphs.sample("path", 6, 1, seed=0).adjacency[0])
    features = jnp.zeros((6, graphs.IDENTITY_DIM + 1)).at[0, -1].set(1.0)  # node 0: source
    p = model.predict((features, adjacency), budget=20)
    reach, scores = p.logits
    assert reach.shape == (6,) and scores.shape == (6, 6) and int(p.steps) <= 20
    ```
    """

    head: PropagationHead | TransformerHead
    block: Propagation | nn.DEQBlock
    solver: Any
    adjoint: Any

    def __init__(
        self,
        width: int,
        *,
        key: PRNGKeyArray,
        block: str = "propagation",
        heads: int = 1,
        mlp_ratio: float = 2.0,
        solver=None,
        adjoint=None,
        dtype=None,
    ):
        kh, kb = jax.random.split(key)
        solver = Picard(rtol=1e-4, atol=1e-6, max_steps=4096) if solver is None else solver
        adjoint = JacobianFree() if adjoint is None else adjoint
        if block == "propagation":
            self.head = PropagationHead(width, key=kh, dtype=dtype)
            self.block = _propagation(width, mlp_ratio, kb, dtype)
        else:
            self.head = TransformerHead(width, key=kh, dtype=dtype)
            self.block = nn.DEQBlock(
                width, heads, key=kb, mlp_ratio=mlp_ratio, solver=solver, adjoint=adjoint,
                dtype=dtype,
            )  # fmt: skip
        self.solver, self.adjoint = solver, adjoint

    def predict(self, x: Inputs, *, budget=None, key=None, z0=None) -> Prediction:
        features, adjacency = x
        head, block = self.head, self.block
        if isinstance(head, TransformerHead) and isinstance(block, nn.DEQBlock):
            h = per_token(head.embed, features)
            mask = adjacency | jnp.eye(adjacency.shape[0], dtype=bool)
            eq = block.equilibrium(h, mask=mask, z0=z0, budget=budget, inference=True)
            logits = head(eq.value, adjacency)
        else:
            assert isinstance(head, PropagationHead) and isinstance(block, Propagation)
            z0 = jnp.zeros((features.shape[0], block.first.shape[0])) if z0 is None else z0
            eq = fixed_point(
                lambda z, m: m[0].pin(m[1](z, adjacency), features),
                z0.astype(block.first.dtype),
                (head, block),
                solver=self.solver,
                adjoint=self.adjoint,
                budget=budget,
            )
            logits = head(eq.value, adjacency, block)
        return Prediction(logits, eq.steps, eq.relative_residual, eq.converged, eq.value)


class GraphStack(eqx.Module):
    """The explicit baseline: `depth` untied blocks of the same kind as the DEQ's, applied once
    each (a node reads at most `depth` edges away).

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

    head: PropagationHead | TransformerHead
    blocks: tuple

    def __init__(
        self,
        width: int,
        depth: int,
        *,
        key: PRNGKeyArray,
        block: str = "propagation",
        heads: int = 1,
        mlp_ratio: float = 2.0,
        dtype=None,
    ):
        kh, kb = jax.random.split(key)
        keys = jax.random.split(kb, depth)
        if block == "propagation":
            self.head = PropagationHead(width, key=kh, dtype=dtype)
            self.blocks = tuple(_propagation(width, mlp_ratio, k, dtype) for k in keys)
        else:
            self.head = TransformerHead(width, key=kh, dtype=dtype)
            self.blocks = tuple(
                nn.TransformerBlock(width, heads, key=k, mlp_ratio=mlp_ratio, dtype=dtype)
                for k in keys
            )

    def predict(self, x: Inputs, *, budget=None, key=None, z0=None) -> Prediction:
        features, adjacency = x
        if isinstance(self.head, TransformerHead):
            z = per_token(self.head.embed, features)
            mask = adjacency | jnp.eye(adjacency.shape[0], dtype=bool)
            for block in self.blocks:
                z = block(z, mask=mask, inference=True)
        else:
            z = jnp.zeros((features.shape[0], self.blocks[0].first.shape[0]), features.dtype)
            for block in self.blocks:
                z = self.head.pin(block(z, adjacency), features)
        return _unsolved(self.head(z, adjacency, self.blocks[-1]), z)


def _propagation(width: int, ratio: float, key, dtype) -> Propagation:
    """A propagation block whose generator has rank `ratio * width / 2` (its parameters,
    `width * rank` twice, are what the explicit baseline's width and ratio match)."""
    return Propagation(width, max(1, round(ratio * width / 2)), key=key, dtype=dtype)
