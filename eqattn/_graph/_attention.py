r"""Attention over a graph's edges, in O(E), and the segment operations built on it.

For the edges $e$ with `receivers[e] = i`, the scores are $s_e = \beta\, q_i \cdot k_e + b_e$,

$$\mathrm{lse}_i = \log \sum_{e \to i} e^{s_e}, \qquad
  \mathrm{out}_i = \sum_{e \to i} e^{s_e - \mathrm{lse}_i}\, v_e,$$

the same contract as dense attention row by row: a node with no incoming edge gets
$\mathrm{lse} = -\infty$ and output 0, and its gradients are 0, never NaN. The engine's segment
pass computes it (a gather per edge, a segment max, two segment sums, and a custom VJP that
recomputes nothing of size $n^2$ or $E^2$).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from .._attention import check_graph_shapes, compute_dtype, segment_attention
from .._errors import GraphError
from ._graph import Graph, is_concrete


def _receivers(receivers, n: int) -> Array:
    """A `Graph`'s receivers (its node count `n`, the queries'), or the array given."""
    if isinstance(receivers, Graph):
        if receivers.num_nodes != n:
            raise GraphError(
                f"`queries` must have one row per node of the graph ({receivers.num_nodes}); "
                f"got {n}"
            )
        return jnp.asarray(receivers.receivers)
    return jnp.asarray(receivers)


def check_beta(beta, dtype) -> Array:
    """`beta` as a floating-point scalar: a `GraphError` if it is not one, or (where it holds a
    value) not finite and > 0; a traced bad `beta` becomes NaN, so the output is NaN, loudly
    wrong, never the output of a graph without edges (as dense attention's)."""
    b = jnp.asarray(beta)
    if b.ndim != 0 or not jnp.issubdtype(b.dtype, jnp.number):
        raise GraphError(f"`beta` must be a number (a scalar); got shape {b.shape}.")
    b = b if jnp.issubdtype(b.dtype, jnp.floating) else b.astype(dtype)
    if is_concrete(b):
        if not (np.isfinite(np.asarray(b)) and np.asarray(b) > 0):
            raise GraphError(
                f"`beta` (the inverse temperature) must be finite and > 0; got {np.asarray(b)}."
            )
        return b
    return jnp.where(jnp.isfinite(b) & (b > 0), b, jnp.array(jnp.nan, b.dtype))


def _check_bias(bias, r):
    if bias is None:
        return None
    bias = jnp.asarray(bias)
    if bias.shape != r.shape or not jnp.issubdtype(bias.dtype, jnp.floating):
        raise GraphError(
            f"`bias` must be floating-point of shape {r.shape} (one per edge); got "
            f"{bias.dtype}{list(bias.shape)}."
        )
    return bias


def graph_attention_with_lse(
    queries: Float[ArrayLike, "n d"],
    keys: Float[ArrayLike, "E d"],
    values: Float[ArrayLike, "E dv"],
    receivers: Int[ArrayLike, " E"] | Graph,
    *,
    beta: float | Float[ArrayLike, ""] = 1.0,
    bias: Float[ArrayLike, " E"] | None = None,
) -> tuple[Float[Array, "n dv"], Float[Array, " n"]]:
    r"""Softmax attention of each node over its incoming edges, and its log-normalizer, in
    O(E) time and memory.

    For the edges $e$ that `receivers` sends to node $i$: scores $s_e = \beta\, q_i \cdot k_e +
    b_e$, $\mathrm{lse}_i = \log\sum_{e \to i} e^{s_e}$ and $\mathrm{out}_i = \sum_{e \to i}
    e^{s_e - \mathrm{lse}_i} v_e$: [`eqattn.attention_with_lse`][] with node $i$'s keys its
    edges' (the caller gathers a sender's key per edge, and may add edge features), so
    multi-edges and self-loops are edges like any other. A node with no incoming edge gets
    `lse = -inf` and output 0, with zero gradients; scores of any size are stable.
    bfloat16/float16 inputs are accumulated in float32; `out` has the values' dtype, `lse` the
    accumulation dtype.

    **Arguments:**

    - `queries`: `[n, d]`, one per receiving node.
    - `keys`, `values`: `[E, d]` and `[E, dv]`, one per edge.
    - `receivers`: a [`Graph`][eqattn.Graph] of `n` nodes (its receivers), or `[E]` integers,
      each edge's receiving node. A receiver outside `0 .. n - 1` marks a padding edge, which
      nothing reads: a batch of graphs padded to one edge count runs under `jax.vmap`.
    - `beta`: the inverse temperature, a scalar, finite and $> 0$ (differentiable; a traced
      one that is not gives NaN).
    - `bias`: `[E]`, added to each edge's score (e.g. $-\beta w_e$ for edge weights $w_e$).

    **Returns:** `(out [n, dv], lse [n])`. Bad shapes or a bad `beta` raise a
    [`GraphError`][eqattn.GraphError] naming the argument.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, numpy as np, eqattn

    senders, receivers = jnp.array([0, 1, 2, 2]), jnp.array([1, 2, 0, 1])  # node 3: no edge in
    x = jax.random.normal(jax.random.key(0), (4, 8))
    out, lse = eqattn.graph_attention_with_lse(x, x[senders], x[senders], receivers)
    # node 1 attends over its two incoming edges (from 0 and 2), as dense attention would
    dense = eqattn.attention(x[1:2], x[jnp.array([0, 2])], x[jnp.array([0, 2])])
    assert jnp.allclose(out[1], dense[0], atol=1e-5)
    assert lse[3] == -jnp.inf and (out[3] == 0).all()
    ```
    """
    q, k, v = jnp.asarray(queries), jnp.asarray(keys), jnp.asarray(values)
    r = _receivers(receivers, q.shape[0] if q.ndim else 0)
    check_graph_shapes(q, k, v, r)
    b = check_beta(beta, compute_dtype(q.dtype, k.dtype))
    # `r` and `bias` through an operation first: a numpy array that `vmap` maps under `jit`
    # would reach the custom VJP as a raw constant, which JAX refuses ("non-canonical
    # constant", jax-ml/jax#27362); the operation makes it a traced value (XLA drops it)
    bias = _check_bias(bias, r)
    r, bias = jax.tree.map(lambda a: a + jnp.zeros((), a.dtype), (r, bias))
    out, lse = segment_attention(q, k, v, r, b, bias)
    if is_concrete(b):
        return out, lse
    # a traced bad `beta` is NaN (`check_beta`), which the pass would read as no edge at all:
    # every node says so instead
    bad = jnp.isnan(b)
    return jnp.where(bad, jnp.nan, out).astype(out.dtype), jnp.where(bad, jnp.nan, lse)


def graph_attention(
    queries: Float[ArrayLike, "n d"],
    keys: Float[ArrayLike, "E d"],
    values: Float[ArrayLike, "E dv"],
    receivers: Int[ArrayLike, " E"] | Graph,
    *,
    beta: float | Float[ArrayLike, ""] = 1.0,
    bias: Float[ArrayLike, " E"] | None = None,
) -> Float[Array, "n dv"]:
    r"""Softmax attention of each node over its incoming edges, in O(E): the output of
    [`eqattn.graph_attention_with_lse`][] (see there for the arguments and the contract).

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    # a path 0 - 1 - 2, both directions: node 1 hears 0 and 2, the ends one neighbour each
    g = eqattn.Graph(jnp.array([0, 1, 1, 2]), jnp.array([1, 0, 2, 1]), num_nodes=3)
    x = jnp.eye(3)
    out = eqattn.graph_attention(x, x[g.senders], x[g.senders], g, beta=1e-9)  # averages
    assert jnp.allclose(out, jnp.array([[0, 1, 0], [0.5, 0, 0.5], [0, 1, 0]]))
    ```
    """
    return graph_attention_with_lse(queries, keys, values, receivers, beta=beta, bias=bias)[0]


def _segments(data, segment_ids, num_segments: int):
    d, ids = jnp.asarray(data), jnp.asarray(segment_ids)
    if isinstance(num_segments, bool) or not isinstance(num_segments, int | np.integer):
        raise GraphError(f"`num_segments` must be an int >= 1; got {num_segments!r}")
    if d.ndim != 1 or ids.shape != d.shape or not jnp.issubdtype(ids.dtype, jnp.integer):
        raise GraphError(
            f"`data` and `segment_ids` must be [E] (floating, integer); got "
            f"{d.dtype}{list(d.shape)} and {ids.dtype}{list(ids.shape)}"
        )
    if not jnp.issubdtype(d.dtype, jnp.floating):
        raise GraphError(f"`data` must be floating-point; got {d.dtype}")
    return d, ids


def segment_logsumexp(
    data: Float[ArrayLike, " E"], segment_ids: Int[ArrayLike, " E"], num_segments: int
) -> Float[Array, " n"]:
    r"""Each segment's log-sum-exp, $\log \sum_{e:\, \mathrm{id}_e = i} e^{x_e}$, stable at
    any size; $-\infty$ for a segment without entries (or whose entries are all $-\infty$),
    with zero gradients there, never NaN. An id outside `0 .. num_segments - 1` is dropped (a
    graph's padding edges).

    **Example:**

    ```python
    import jax.numpy as jnp, eqattn

    x, ids = jnp.array([1000.0, 1000.0, 0.0]), jnp.array([0, 0, 2])
    out = eqattn.segment_logsumexp(x, ids, 3)
    assert jnp.allclose(out, jnp.array([1000.0 + jnp.log(2.0), -jnp.inf, 0.0]))
    ```
    """
    x, ids = _segments(data, segment_ids, num_segments)
    zeros = jnp.zeros((x.shape[0], 1), x.dtype)
    ones = jnp.ones((int(num_segments), 1), x.dtype)
    return segment_attention(ones, zeros, zeros, ids, jnp.ones((), x.dtype), x)[1]


def segment_softmin(
    data: Float[ArrayLike, " E"],
    segment_ids: Int[ArrayLike, " E"],
    num_segments: int,
    *,
    beta: float | Float[ArrayLike, ""],
    where: Bool[ArrayLike, " E"] | None = None,
) -> Float[Array, " n"]:
    r"""Each segment's soft minimum: the mean of its entries weighted by $p_e \propto
    e^{-\beta x_e}$ (attention with the entries as keys and values and the query $-1$),
    computed as $\min x + \sum_e p_e (x_e - \min x)$, so that it is the least entry exactly
    where the others' weights vanish or equal it (no rounding to drift on through a fixed point
    that feeds it back). It lies between the segment's least and largest entry, and tends to the
    least as $\beta \to \infty$. Only the entries `where` is True count; a segment with none
    gets 0 (zero gradients). Differentiable in `data` and `beta` ($> 0$, finite): its gradient is
    the weighted mean's.

    **Example:**

    ```python
    import jax.numpy as jnp, eqattn

    x, ids = jnp.array([3.0, 1.0, 2.0, 5.0]), jnp.array([0, 0, 0, 1])
    assert (eqattn.segment_softmin(x, ids, 3, beta=100.0) == jnp.array([1.0, 5.0, 0.0])).all()
    mean = eqattn.segment_softmin(x, ids, 3, beta=1e-9, where=x < 4)  # nearly the plain mean
    assert jnp.allclose(mean, jnp.array([2.0, 0.0, 0.0]))
    ```
    """
    x, ids = _segments(data, segment_ids, num_segments)
    n = int(num_segments)
    mask = jnp.ones(x.shape, bool)
    if where is not None:
        mask = jnp.asarray(where)
        if mask.shape != x.shape or mask.dtype != jnp.bool_:
            raise GraphError(f"`where` must be boolean [E]; got {mask.dtype}{list(mask.shape)}")
    least = jax.lax.stop_gradient(
        jax.ops.segment_min(jnp.where(mask, x, jnp.inf), ids, num_segments=n)
    )
    at = least.at[ids].get(mode="fill", fill_value=0.0)
    deviation = jnp.where(mask, x - at, 0.0)[:, None]
    bias = jnp.where(mask, 0.0, -jnp.inf).astype(x.dtype)
    b = check_beta(beta, x.dtype)
    mean = segment_attention(-jnp.ones((n, 1), x.dtype), x[:, None], deviation, ids, b, bias)[0]
    out = jnp.where(jnp.isfinite(least), least + mean[:, 0], 0.0)
    return out if is_concrete(b) else jnp.where(jnp.isnan(b), jnp.nan, out).astype(out.dtype)
