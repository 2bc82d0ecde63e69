"""A hand-set fixed point over records (the `spanning` suite's second part): each node carries
its least list of k records (float32, 0 past its end), each step takes, per node, the least of
its flagged neighbours' lists extended by the edge between them, level by level: the minimum of
level l among the edges that tie at the levels above. `hard`: exact minima (the tropical limit);
`soft`: each minimum a soft one, `eqattn.graph_attention` at inverse temperature `BETA` on the
weights over their mean, the ties those within a relative `TIE` of it; `hops`: a last level,
the path's edges. No parameter is learned:
this measures what such a layer could answer, and what its steps cost."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import eqattn
from eqattn import graphs

BETA = 1e5
TIE = 1e-6


def extend(r: jax.Array, w: jax.Array) -> jax.Array:
    """Each edge's list `[E, k]`: the sender's records `r [E, k]` heavier than `w [E]`, then w
    (0 past the end)."""
    above = jnp.concatenate([jnp.full_like(r[:, :1], jnp.inf), r[:, :-1]], axis=1)
    return jnp.where(w[:, None] < above, jnp.maximum(r, w[:, None]), 0.0)


def _least(m, mask, receivers, n: int, soft: bool):
    """Per node the least list of its masked edges `m [E, k]`, and the edges that reach it."""
    out = []
    for level in range(m.shape[1]):
        v = m[:, level]
        if soft:
            bias = jnp.where(mask, 0.0, -jnp.inf)
            least = eqattn.graph_attention(
                -jnp.ones((n, 1)), v[:, None], v[:, None], receivers, beta=BETA, bias=bias
            )[:, 0]
            mask = mask & (v <= least[receivers] * (1 + TIE))
        else:
            least = jax.ops.segment_min(jnp.where(mask, v, jnp.inf), receivers, num_segments=n)
            mask = mask & (v == least[receivers])
        out.append(least)
    return jnp.stack(out, 1), mask


@functools.partial(jax.jit, static_argnames=("n", "k", "soft", "hops"))
def step(state, senders, receivers, w, source, n: int, k: int, soft: bool, hops: bool = False):
    """One step: `(records [n, k], flag [n])` to the next, and each edge's tie after the last
    level (the edges a node's least list comes from). `hops`: one level more, after the
    records, the edges on the path (`records [n, k + 1]`): among lists that tie in their first
    k records, the path of fewer edges (a node's own children tie with its parent there when
    its path has k records or more)."""
    r, flag = state
    mask = (flag[senders] > 0) & (receivers < n)
    m = extend(r[senders][:, :k], w)
    if hops:
        m = jnp.concatenate([m, r[senders][:, k:] + 1], axis=1)
    least, mask = _least(m, mask, receivers, n, soft)
    heard = jax.ops.segment_max(mask.astype(r.dtype), receivers, num_segments=n) > 0
    own = jnp.arange(n) == source
    r = jnp.where(heard[:, None] & ~own[:, None], least, 0.0)
    return (r, (heard | own).astype(r.dtype)), mask


@functools.partial(jax.jit, static_argnames=("n", "k", "soft", "budget", "hops"))
def solve(senders, receivers, w, source, n: int, k: int, soft: bool, budget: int, hops: bool):
    """The fixed point from nothing reached but the source: `(records, flag)`, the steps taken,
    whether it stopped (no record moved by more than a relative `TIE`, the flags unchanged),
    and each node's parent (the first edge of its tie)."""
    state = (jnp.zeros((n, k + hops)), (jnp.arange(n) == source).astype(jnp.float32))

    def cond(c):
        return (c[1] < budget) & ~c[2]

    def body(c):
        new = step(c[0], senders, receivers, w, source, n, k, soft, hops)[0]
        moved = jnp.max(jnp.abs(new[0] - c[0][0]) - TIE * jnp.abs(c[0][0]), initial=0.0)
        same = (moved <= 0) & jnp.array_equal(new[1], c[0][1])
        return new, c[1] + 1, same

    state, steps, done = jax.lax.while_loop(cond, body, (state, 0, False))
    _, mask = step(state, senders, receivers, w, source, n, k, soft, hops)
    first = jax.ops.segment_min(
        jnp.where(mask, jnp.arange(len(senders)), len(senders)), receivers, num_segments=n
    )
    parent = jnp.where(first < len(senders), senders[jnp.minimum(first, len(senders) - 1)], -1)
    own = (parent < 0) | (jnp.arange(n) == source)  # the source, and what nothing reaches
    return state, steps, done, jnp.where(own, jnp.arange(n), parent)


def answer(
    g: graphs.WeightedGraphs, b: int, k: int, soft: bool, hops: bool = False
) -> tuple[float, int, bool]:
    """Graph `b` of `g`: the share of nodes whose parent is right (`graphs.score_parents`), the
    steps, whether the solve stopped unchanged within the budget rule."""
    s, r, n = g.edges
    w = g.weights[b] / g.weights[b][r[b] < n].mean()
    args = (jnp.asarray(s[b]), jnp.asarray(r[b]), jnp.asarray(w, jnp.float32), int(g.source[b]))
    budget = graphs.budget_for(n)
    _, steps, done, parent = solve(*args, n=n, k=k, soft=soft, budget=budget, hops=hops)
    one = graphs.WeightedGraphs(
        graphs.EdgeList(s[b : b + 1], r[b : b + 1], n), g.weights[b : b + 1], g.source[b : b + 1]
    )
    right = graphs.score_parents(one, np.asarray(parent)[None], "mst")
    return float(right.mean()), int(steps), bool(done)
