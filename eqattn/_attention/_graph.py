r"""The engine's segment path: attention over a graph's edges, in O(E), each node's
log-normalizer over its incoming edges (the graph floor's `eqattn.graph_attention` enters here).

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

from .._errors import GraphError
from ._xla import compute_dtype


def check_graph_shapes(q, k, v, r) -> None:
    """The shapes and dtypes (arrays or `jax.ShapeDtypeStruct`s): a `GraphError` naming the
    argument and the shapes."""
    shapes = f"queries {q.shape}, keys {k.shape}, values {v.shape}, receivers {r.shape}"
    for name, a in (("queries", q), ("keys", k), ("values", v)):
        if a.ndim != 2 or not jnp.issubdtype(a.dtype, jnp.floating):
            raise GraphError(f"`{name}` must be a 2-D floating-point array; got {shapes}.")
    if r.ndim != 1 or not jnp.issubdtype(r.dtype, jnp.integer):
        raise GraphError(f"`receivers` must be a 1-D integer array (one per edge); got {shapes}.")
    if not (k.shape[0] == v.shape[0] == r.shape[0]):
        raise GraphError(f"`keys`, `values` and `receivers` must have one row per edge; {shapes}.")
    if k.shape[1] != q.shape[1]:
        raise GraphError(f"`queries` and `keys` must have the same width d; got {shapes}.")


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
def segment_attention(q, k, v, r, beta, bias):
    """`(out [n, dv], lse [n])` of each node over its incoming edges (module docstring), on
    checked arrays: `beta` a floating-point scalar, `bias` `[E]` or None. The graph floor's
    operators (`eqattn.graph_attention`, the segment operations) call it."""
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
    # 0 on a padding edge (p is already): said as a select, it also keeps XLA's CPU fusion
    # (jaxlib 0.10) from ending the row reduction with `ds` broadcast to [E, d], written out and
    # read back by both products below (the findings page: graph attention against jraph)
    ds = jnp.where((r >= 0) & (r < n), ds, 0.0)
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


segment_attention.defvjp(_core_fwd, _core_bwd)
