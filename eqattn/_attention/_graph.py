r"""Attention over a graph's edges, in O(E): each node's log-normalizer over its incoming edges.

For the edges $e$ with `receivers[e] = i`, the scores are $s_e = \beta\, q_i \cdot k_e + b_e$,

$$\mathrm{lse}_i = \log \sum_{e \to i} e^{s_e}, \qquad
  \mathrm{out}_i = \sum_{e \to i} e^{s_e - \mathrm{lse}_i}\, v_e,$$

the same contract as dense attention row by row: a node with no incoming edge gets
$\mathrm{lse} = -\infty$ and output 0, and its gradients are 0, never NaN; a receiver outside
`0 .. n - 1` marks a padding edge, which nothing reads. The pass gathers each edge's query,
reduces per node with segment operations and recomputes the edge weights in the backward (a
custom VJP), so nothing of size $n^2$ or $E^2$ is formed: memory O(E (d + dv) + n (d + dv)).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

from ._xla import compute_dtype


def check_shapes(q, k, v, r) -> None:
    """The shapes and dtypes (arrays or `jax.ShapeDtypeStruct`s): a `ValueError` naming the
    argument and the shapes."""
    shapes = f"queries {q.shape}, keys {k.shape}, values {v.shape}, receivers {r.shape}"
    for name, a in (("queries", q), ("keys", k), ("values", v)):
        if a.ndim != 2 or not jnp.issubdtype(a.dtype, jnp.floating):
            raise ValueError(f"`{name}` must be a 2-D floating-point array; got {shapes}.")
    if r.ndim != 1 or not jnp.issubdtype(r.dtype, jnp.integer):
        raise ValueError(f"`receivers` must be a 1-D integer array (one per edge); got {shapes}.")
    if not (k.shape[0] == v.shape[0] == r.shape[0]):
        raise ValueError(f"`keys`, `values` and `receivers` must have one row per edge; {shapes}.")
    if k.shape[1] != q.shape[1]:
        raise ValueError(f"`queries` and `keys` must have the same width d; got {shapes}.")


def _check(queries, keys, values, receivers, beta, bias):
    """The arguments as arrays, checked: a `ValueError` naming the argument and the shapes."""
    q, k, v = jnp.asarray(queries), jnp.asarray(keys), jnp.asarray(values)
    r = jnp.asarray(receivers)
    check_shapes(q, k, v, r)
    b = jnp.asarray(beta)
    if b.ndim != 0 or not jnp.issubdtype(b.dtype, jnp.number):
        raise ValueError(f"`beta` must be a number (a scalar); got shape {b.shape}.")
    if bias is not None:
        bias = jnp.asarray(bias)
        if bias.shape != r.shape or not jnp.issubdtype(bias.dtype, jnp.floating):
            raise ValueError(
                f"`bias` must be floating-point of shape {r.shape} (one per edge); got "
                f"{bias.dtype}{list(bias.shape)}."
            )
    return q, k, v, r, b, bias


def _dots(q, k, r, dtype):
    """Each edge's `q_receiver . k_edge` (a padding edge's receiver is clamped into range: what
    it computes is dropped by the segment sums, which drop an index out of range)."""
    return jnp.sum(q[r].astype(dtype) * k.astype(dtype), axis=-1)


def _logits(dots, beta, bias, dtype):
    """`beta * dots + bias` (no bias: none added)."""
    s = jnp.asarray(beta, dtype) * dots
    return s if bias is None else s + jnp.asarray(bias, dtype)


def _forward(q, k, v, r, beta, bias):
    """`(out, lse, (dots, weights))`: one gather, one segment max and two segment sums over the
    edges; the backward reuses the dot products and the edges' softmax `weights [E]` (0 on a
    padding edge)."""
    n, dtype = q.shape[0], compute_dtype(q.dtype, k.dtype, v.dtype)
    dots = _dots(q, k, r, dtype)
    s = _logits(dots, beta, bias, dtype)
    top = jax.ops.segment_max(s, r, num_segments=n)  # -inf for a node with no edge
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    p = jnp.exp(s - top[r])
    total = jax.ops.segment_sum(p, r, num_segments=n)
    acc = jax.ops.segment_sum(p[:, None] * v.astype(dtype), r, num_segments=n)
    some = total > 0
    safe = jnp.where(some, total, 1.0)
    out = jnp.where(some[:, None], acc / safe[:, None], 0.0)
    lse = jnp.where(some, top + jnp.log(safe), -jnp.inf)
    valid = (r >= 0) & (r < n)
    weights = jnp.where(valid, p / safe[r], 0.0)
    return out.astype(v.dtype), lse, (dots, weights)


@jax.custom_vjp
def _core(q, k, v, r, beta, bias):
    return _forward(q, k, v, r, beta, bias)[:2]


def _core_fwd(q, k, v, r, beta, bias):
    out, lse, (dots, weights) = _forward(q, k, v, r, beta, bias)
    return (out, lse), (q, k, v, r, beta, bias, out, lse, dots, weights)


def _core_bwd(residuals, cotangents):
    r"""With $p_e$ the edge's weight: $\partial s_e = p_e (g_{r_e} \cdot v_e - g_{r_e} \cdot
    \mathrm{out}_{r_e} + \bar\ell_{r_e})$, then $dq$, $dk$, $d\beta$, $db$ from $s_e$ and
    $dv_e = p_e g_{r_e}$, from the forward's edge weights and dot products (one number per
    edge each), nothing of size $n^2$; a padding edge's, and a node's without edges, are zero."""
    q, k, v, r, beta, bias, out, lse, dots, p = residuals
    g_out, g_lse = cotangents
    n, dtype = q.shape[0], compute_dtype(q.dtype, k.dtype, v.dtype)
    rc = jnp.clip(r, 0, max(n - 1, 0))
    b = jnp.asarray(beta, dtype)
    finite = jnp.isfinite(lse)
    g = g_out.astype(dtype)[rc]  # [E, dv]: each edge's receiver's output cotangent
    delta = jnp.sum(g_out.astype(dtype) * out.astype(dtype), axis=-1)  # [n]
    g_lse = jnp.where(finite, g_lse.astype(dtype), 0.0)
    ds = p * (jnp.sum(g * v.astype(dtype), axis=-1) - delta[rc] + g_lse[rc])  # [E]
    scaled = (b * ds)[:, None]
    dq = jax.ops.segment_sum(scaled * k.astype(dtype), rc, num_segments=n)
    dk = scaled * q[rc].astype(dtype)
    dv = p[:, None] * g
    zero_r = np.zeros(r.shape, jax.dtypes.float0)
    return (
        dq.astype(q.dtype),
        dk.astype(k.dtype),
        dv.astype(v.dtype),
        zero_r,
        jnp.sum(ds * dots).astype(jnp.asarray(beta).dtype),
        None if bias is None else ds.astype(jnp.asarray(bias).dtype),
    )


_core.defvjp(_core_fwd, _core_bwd)


def graph_attention_with_lse(
    queries: Float[ArrayLike, "n d"],
    keys: Float[ArrayLike, "E d"],
    values: Float[ArrayLike, "E dv"],
    receivers: Int[ArrayLike, " E"],
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
    - `receivers`: `[E]` integer, each edge's receiving node. A receiver outside `0 .. n - 1`
      marks a padding edge, which nothing reads: a batch of graphs padded to one edge count
      runs under `jax.vmap`.
    - `beta`: the inverse temperature, a scalar (differentiable).
    - `bias`: `[E]`, added to each edge's score (e.g. $-\beta w_e$ for edge weights $w_e$).

    **Returns:** `(out [n, dv], lse [n])`.

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
    q, k, v, r, b, bias = _check(queries, keys, values, receivers, beta, bias)
    b = b if jnp.issubdtype(b.dtype, jnp.floating) else b.astype(compute_dtype(q.dtype, k.dtype))
    return _core(q, k, v, r, b, bias)


def graph_attention(
    queries: Float[ArrayLike, "n d"],
    keys: Float[ArrayLike, "E d"],
    values: Float[ArrayLike, "E dv"],
    receivers: Int[ArrayLike, " E"],
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
    senders, receivers = jnp.array([0, 1, 1, 2]), jnp.array([1, 0, 2, 1])
    x = jnp.eye(3)
    out = eqattn.graph_attention(x, x[senders], x[senders], receivers, beta=0.0)  # averages
    assert jnp.allclose(out, jnp.array([[0, 1, 0], [0.5, 0, 0.5], [0, 1, 0]]))
    ```
    """
    return graph_attention_with_lse(queries, keys, values, receivers, beta=beta, bias=bias)[0]
