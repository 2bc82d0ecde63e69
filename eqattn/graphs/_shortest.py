r"""Soft shortest paths: the fixed point of the log-normalizer over each node's incoming edges.

With edge weights $w_{ji} \ge 0$ and an inverse temperature $\beta$, the soft Bellman-Ford
operator is

$$d_i = -\frac{1}{\beta} \log\Big( [i = s] + \sum_{j \to i} e^{-\beta (d_j + w_{ji})} \Big),$$

the log-normalizer of node $i$'s incoming edges (attention's, [`eqattn.graph_attention_with_lse`][],
with the scores $-\beta(d_j + w_{ji})$) plus the source's own term. Its fixed point is
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

from .._attention import graph_attention_with_lse
from .._errors import ConfigError
from .._solve import Equilibrium, Picard, fixed_point


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _check(senders, receivers, weights, source, num_nodes):
    """The edge list as arrays, checked (values where they are concrete)."""
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int | np.integer) or num_nodes < 1:
        raise ConfigError(f"`num_nodes` must be an int >= 1; got {num_nodes!r}")
    s, r, w = jnp.asarray(senders), jnp.asarray(receivers), jnp.asarray(weights)
    for name, a in (("senders", s), ("receivers", r)):
        if a.ndim != 1 or not jnp.issubdtype(a.dtype, jnp.integer):
            raise ConfigError(f"`{name}` must be a 1-D integer array; got {a.dtype}{list(a.shape)}")
    if w.ndim != 1 or not jnp.issubdtype(w.dtype, jnp.floating):
        raise ConfigError(
            f"`weights` must be a 1-D floating-point array; got {w.dtype}{list(w.shape)}"
        )
    if not (s.shape == r.shape == w.shape):
        raise ConfigError(
            f"`senders`, `receivers` and `weights` must have one entry per edge; got "
            f"{s.shape[0]}, {r.shape[0]} and {w.shape[0]}"
        )
    # values are checked in numpy where they are concrete (a traced one, under `jit`, is not)
    for name, a in (("senders", s), ("receivers", r)):
        values = np.asarray(a) if _is_concrete(a) else np.zeros(0)
        if values.size and (values.min() < 0 or values.max() >= num_nodes):
            raise ConfigError(f"`{name}` must be node indices in 0 .. {num_nodes - 1}")
    values = np.asarray(w) if _is_concrete(w) else np.zeros(0)
    if values.size and not np.all(np.isfinite(values) & (values >= 0)):
        raise ConfigError(
            "`weights` must be finite and >= 0 (a shortest path needs no negative cycle)"
        )
    if _is_concrete(source) and not 0 <= int(np.asarray(source)) < num_nodes:
        raise ConfigError(
            f"`source` must be a node in 0 .. {num_nodes - 1}; got {int(np.asarray(source))}"
        )
    return s, r, w, jnp.asarray(source, jnp.int32)


def reachable(senders, receivers, source, num_nodes: int) -> Array:
    """The nodes a walk from `source` reaches (`[num_nodes]` bool), by propagation along the
    edges until nothing changes (at most `num_nodes` rounds)."""
    start = jnp.zeros(num_nodes, bool).at[source].set(True)

    def grow(state):
        reach, _ = state
        heard = jax.ops.segment_max(
            reach[senders].astype(jnp.int32), receivers, num_segments=num_nodes
        )
        new = reach | (heard > 0)
        return new, jnp.any(new != reach)

    reach, _ = jax.lax.while_loop(lambda s: s[1], grow, (start, jnp.array(True)))
    return reach


def soft_shortest_paths(
    senders: Int[ArrayLike, " E"],
    receivers: Int[ArrayLike, " E"],
    weights: Float[ArrayLike, " E"],
    source: int | Int[ArrayLike, ""],
    num_nodes: int,
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

    - `senders`, `receivers`: `[E]` integers, each edge's ends (an undirected edge is two).
    - `weights`: `[E]`, finite and $\ge 0$.
    - `source`: the node the distances are from; `num_nodes`: the graph's nodes.
    - `beta`: the inverse temperature (larger: closer to the exact distances, and to a walk sum
      that converges only if the spectral radius of $e^{-\beta W}$ is below 1).
    - `solver`: an eqattn solver (default [`eqattn.Picard`][] to a relative tolerance of
      1e-10 in float64 (1e-6 in float32), `4 num_nodes + 16` steps; started above every
      distance, it takes about as many steps as the shortest paths have edges, more where a
      cycle's weight is not large against $1/\beta$); `adjoint` (default
      implicit, [`eqattn.ImplicitAdjoint`][]); `throw`: raise if the solve did not converge.

    **Returns:** an [`eqattn.Equilibrium`][] whose `value` is the distances `[num_nodes]`:
    `+inf` where `source` reaches no walk, NaN everywhere else when the solve did not converge
    (the walk sum diverges when `beta` is too small: `converged` says so), never a plausible
    wrong distance. Bad input is a `ValueError` naming the argument (values checked where they
    are concrete, outside `jit`).

    **Example:**

    ```python
    import jax.numpy as jnp
    from eqattn import graphs

    # 0 -> 1 -> 2 (weights 1, 1) and a shortcut 0 -> 2 (weight 3); node 3 unreachable
    senders, receivers = jnp.array([0, 1, 0]), jnp.array([1, 2, 2])
    eq = graphs.soft_shortest_paths(senders, receivers, jnp.array([1.0, 1.0, 3.0]), 0, 4, beta=20.0)
    assert eq.converged and jnp.allclose(eq.value[:3], jnp.array([0.0, 1.0, 2.0]), atol=1e-3)
    assert eq.value[3] == jnp.inf
    ```
    """
    s, r, w, src = _check(senders, receivers, weights, source, num_nodes)
    dtype = jnp.result_type(w.dtype, jnp.float32)
    beta = jnp.asarray(beta, dtype)
    if _is_concrete(beta) and not np.asarray(beta) > 0:
        raise ConfigError(f"`beta` must be > 0; got {float(np.asarray(beta))}")
    reach = reachable(s, r, src, num_nodes)
    # edges from nodes no walk reaches add nothing (their senders' distance is +inf): padding
    edge_r = jnp.where(reach[s], r, -1)
    # the source's own term, [i = s], as an edge of score 0 into the source
    all_r = jnp.concatenate([edge_r, src[None]])
    ones = jnp.ones((num_nodes, 1), dtype)

    def step(z, args):
        """z = -beta d on the reached nodes (0 elsewhere) -> each node's log-normalizer over its
        incoming edges, whose scores are z_j - beta w_ji."""
        w_, beta_ = args
        keys = jnp.concatenate([z[s], jnp.zeros(1, dtype)])[:, None]
        bias = jnp.concatenate([-beta_ * w_, jnp.zeros(1, dtype)])
        _, lse = graph_attention_with_lse(ones, keys, keys, all_r, bias=bias)
        return jnp.where(reach, lse, 0.0)

    if solver is None:
        tol = 1e-10 if dtype == jnp.float64 else 1e-6
        solver = Picard(rtol=tol, atol=tol, max_steps=4 * num_nodes + 16)
    # start above every distance (d = 1 + the weights' sum): Picard then sums the walks by length
    # and settles in about as many steps as the shortest paths have edges (from d = 0 it would
    # wait for every walk of k shortest edges to outgrow the distances)
    bound = jax.lax.stop_gradient(beta * (1 + jnp.sum(jnp.where(reach[s], w, 0))))
    start = jnp.where(jnp.arange(num_nodes) == src, 0.0, -bound).astype(dtype)
    eq = fixed_point(step, start, (w, beta), solver=solver, adjoint=adjoint, throw=throw)
    distances = jnp.where(reach, jnp.where(eq.converged, -eq.value / beta, jnp.nan), jnp.inf)
    return eqx.tree_at(lambda e: e.value, eq, distances)
