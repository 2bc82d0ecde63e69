r"""Soft shortest paths: the fixed point of the log-normalizer over each node's incoming edges.

With edge weights $w_{ji} \ge 0$ and an inverse temperature $\beta$, the soft Bellman-Ford
operator is

$$d_i = -\frac{1}{\beta} \log\Big( [i = s] + \sum_{j \to i} e^{-\beta (d_j + w_{ji})} \Big),$$

the log-normalizer of node $i$'s incoming edges ([`eqattn.segment_logsumexp`][] of the scores
$-\beta(d_j + w_{ji})$) plus the source's own term. Its fixed point is
$d_i = -\frac{1}{\beta}\log \sum_{\text{walks } s \to i} e^{-\beta\,\mathrm{len}}$: with
$A_{ji} = e^{-\beta w_{ji}}$, $u = e^{-\beta d}$ solves $u = e_s + A^\top u$, the walk sum
$(I - A^\top)^{-1} e_s$, which converges when the spectral radius of $A$ is below 1. As $\beta$
grows, $d_i$ tends to the shortest distance from below, within $\log(\text{number of shortest
paths})/\beta$ and what longer walks add; its gradient with respect to $w_{ji}$ is the expected
use of the edge by those walks, the shortest-path tree's edges as $\beta \to \infty$
(A. Mensch, M. Blondel, *Differentiable Dynamic Programming for Structured Prediction and
Attention*, 2018).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

from .._errors import GraphError
from .._solve import Equilibrium, Picard, fixed_point
from ._attention import check_beta, segment_logsumexp
from ._graph import Graph, check_graph, is_concrete


def _check(graph: Graph, weights, source):
    """The graph, weights and source as arrays, checked (values where they are concrete)."""
    check_graph(graph)
    s, r, n = jnp.asarray(graph.senders), jnp.asarray(graph.receivers), graph.num_nodes
    w = jnp.asarray(weights)
    if s.ndim != 1:
        raise GraphError(f"`graph` must be one graph, [E] edges; got senders {list(s.shape)}")
    if w.shape != s.shape or not jnp.issubdtype(w.dtype, jnp.floating):
        raise GraphError(
            f"`weights` must be floating-point, one per edge [{s.shape[0]}]; got "
            f"{w.dtype}{list(w.shape)}"
        )
    if is_concrete(w) and is_concrete(r):
        real = np.asarray(r) < n
        if not np.all(np.isfinite(np.asarray(w)[real]) & (np.asarray(w)[real] >= 0)):
            raise GraphError(
                "`weights` must be finite and >= 0 (a shortest path needs no negative cycle)"
            )
    src = jnp.asarray(source)
    if src.ndim != 0 or not jnp.issubdtype(src.dtype, jnp.integer):
        raise GraphError(
            f"`source` must be one node (an integer); got {src.dtype}{list(src.shape)}"
        )
    if is_concrete(src) and not 0 <= int(src) < n:
        raise GraphError(f"`source` must be a node in 0 .. {n - 1}; got {int(src)}")
    return s, r, w, src.astype(jnp.int32)


def reachable(graph: Graph, source) -> Array:
    """The nodes a walk from `source` reaches (`[num_nodes]` bool), by propagation along the
    real edges until nothing changes (at most `num_nodes` rounds)."""
    n = graph.num_nodes
    s, r = jnp.asarray(graph.senders), jnp.asarray(graph.receivers)
    start = jnp.zeros(n, bool).at[source].set(True)

    def grow(state):
        reach, _ = state
        heard = jax.ops.segment_max(reach[s].astype(jnp.int32), r, num_segments=n)
        new = reach | (heard > 0)
        return new, jnp.any(new != reach)

    reach, _ = jax.lax.while_loop(lambda c: c[1], grow, (start, jnp.array(True)))
    return reach


def soft_shortest_paths(
    graph: Graph,
    weights: Float[ArrayLike, " E"],
    source: int | Int[ArrayLike, ""],
    *,
    beta: float | Float[ArrayLike, ""],
    solver=None,
    adjoint=None,
    throw: bool = False,
) -> Equilibrium:
    r"""Soft shortest distances from `source` over a directed graph's edges (module docstring),
    solved as the fixed point of the log-normalizer over each node's incoming edges and
    differentiated implicitly with respect to `weights` and `beta`.

    **Arguments:**

    - `graph`: one [`eqattn.Graph`][] (its edges; padding edges are dropped; its edge
      features are not read).
    - `weights`: `[E]`, each edge's weight, finite and $\ge 0$ (differentiable).
    - `source`: the node the distances are from.
    - `beta`: the inverse temperature, finite and $> 0$ (larger: closer to the exact distances,
      and to a walk sum that converges only if the spectral radius of $e^{-\beta W}$ is below 1).
    - `solver`: an eqattn solver (default [`eqattn.Picard`][] to a relative tolerance of
      1e-10 in float64 (1e-6 in float32), `4 num_nodes + 16` steps; started above every
      distance, it takes about as many steps as the shortest paths have edges, more where a
      cycle's weight is not large against $1/\beta$); `adjoint` (default
      implicit, [`eqattn.ImplicitAdjoint`][]); `throw`: raise if the solve did not converge.

    **Returns:** an [`eqattn.Equilibrium`][] whose `value` is the distances `[num_nodes]`:
    `+inf` where `source` reaches no walk, NaN everywhere else when the solve did not converge
    (the walk sum diverges when `beta` is too small: `converged` says so), never a plausible
    wrong distance. Bad input is a [`GraphError`][eqattn.GraphError] naming the argument
    (values checked where they are concrete, outside `jit`).

    **Example:**

    ```python
    import jax.numpy as jnp, eqattn

    # 0 -> 1 -> 2 (weights 1, 1) and a shortcut 0 -> 2 (weight 3); node 3 unreachable
    g = eqattn.Graph(jnp.array([0, 1, 0]), jnp.array([1, 2, 2]), num_nodes=4)
    eq = eqattn.soft_shortest_paths(g, jnp.array([1.0, 1.0, 3.0]), 0, beta=20.0)
    assert eq.converged and jnp.allclose(eq.value[:3], jnp.array([0.0, 1.0, 2.0]), atol=1e-3)
    assert eq.value[3] == jnp.inf
    ```
    """
    s, r, w, src = _check(graph, weights, source)
    n = graph.num_nodes
    dtype = jnp.result_type(w.dtype, jnp.float32)
    beta = check_beta(beta, dtype).astype(dtype)
    reach = reachable(graph, src)
    # edges from nodes no walk reaches add nothing (their senders' distance is +inf): padding
    real = r < n
    edge_r = jnp.where(real & reach[jnp.clip(s, 0, n - 1)], r, -1)
    # the source's own term, [i = s], as an edge of score 0 into the source
    all_r = jnp.concatenate([edge_r, src[None]])
    sc = jnp.clip(s, 0, n - 1)

    def step(z, args):
        """z = -beta d on the reached nodes (0 elsewhere) -> each node's log-normalizer over its
        incoming edges, whose scores are z_j - beta w_ji."""
        w_, beta_ = args
        scores = jnp.concatenate([z[sc] - beta_ * w_, jnp.zeros(1, dtype)])
        return jnp.where(reach, segment_logsumexp(scores, all_r, n), 0.0)

    if solver is None:
        tol = 1e-10 if dtype == jnp.float64 else 1e-6
        solver = Picard(rtol=tol, atol=tol, max_steps=4 * n + 16)
    # start above every distance (d = 1 + the weights' sum): Picard then sums the walks by length
    # and settles in about as many steps as the shortest paths have edges (from d = 0 it would
    # wait for every walk of k shortest edges to outgrow the distances)
    total = jnp.sum(jnp.where(real & reach[sc], w, 0))
    bound = jax.lax.stop_gradient(beta * (1 + total))
    start = jnp.where(jnp.arange(n) == src, 0.0, -bound).astype(dtype)
    eq = fixed_point(
        step, start, (w.astype(dtype), beta), solver=solver, adjoint=adjoint, throw=throw
    )
    distances = jnp.where(reach, jnp.where(eq.converged, -eq.value / beta, jnp.nan), jnp.inf)
    return eqx.tree_at(lambda e: e.value, eq, distances)
