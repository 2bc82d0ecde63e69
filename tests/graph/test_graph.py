"""The graph floor: `Graph` and its one validator (one error type, one line naming what is
wrong), batching by padding under `jax.vmap`, and the segment operations against float64 numpy,
finite differences and their contract (empty segments, huge values, padding, ties)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import eqattn

from ..checks import unchecked


def _path(n=4):
    i = np.arange(n - 1)
    return np.concatenate([i, i + 1]), np.concatenate([i + 1, i])


def test_a_graph_batches_by_padding_under_vmap():
    """Two graphs of 3 and 5 edges padded to 6 (receiver n): in-degrees as numpy counts them,
    one program for the batch."""
    s0, r0 = np.array([0, 1, 2]), np.array([1, 2, 0])
    s1, r1 = np.array([0, 0, 1, 3, 2]), np.array([1, 2, 2, 2, 3])
    n = 4
    senders = np.zeros((2, 6), np.int32)
    receivers = np.full((2, 6), n, np.int32)
    senders[0, :3], receivers[0, :3], senders[1, :5], receivers[1, :5] = s0, r0, s1, r1
    batch = eqattn.Graph(senders, receivers, num_nodes=n).check()
    degree = jax.jit(jax.vmap(lambda g: g.in_degree()))(batch)
    np.testing.assert_array_equal(degree[0], np.bincount(r0, minlength=n))
    np.testing.assert_array_equal(degree[1], np.bincount(r1, minlength=n))
    assert batch.num_edges == 6 and batch.real.sum() == 8


@pytest.mark.float32
def test_a_batch_of_numpy_graphs_maps_under_jit():
    """A batch of numpy graphs closed over by a compiled function and mapped by `vmap` through
    graph attention: the same answer as mapped eagerly (JAX refused the raw numpy array in the
    attention's custom VJP: "non-canonical constant")."""
    senders, receivers = np.array([[0, 1, 2], [1, 2, 0]]), np.array([[1, 2, 0], [0, 1, 2]])
    batch = eqattn.Graph(senders, receivers, num_nodes=3)
    x = jax.random.normal(jax.random.key(0), (2, 3, 4))

    def one(g, x):
        k = x[jnp.asarray(g.senders)]
        return eqattn.graph_attention(x, k, k, g)

    np.testing.assert_allclose(
        jax.jit(lambda x: jax.vmap(one)(batch, x))(x), jax.vmap(one)(batch, x), rtol=1e-6
    )


@pytest.mark.bad_input
def test_the_validator_refuses_bad_graphs_in_one_line():
    s, r = _path()
    w = np.ones((len(s), 1))
    cases = [
        (eqattn.Graph(s, r[:-1], num_nodes=4), {}, "integers of one shape"),
        (eqattn.Graph(s.astype(float), r, num_nodes=4), {}, "integers of one shape"),
        (eqattn.Graph(s, r, num_nodes=0), {}, "`num_nodes` must be an int >= 1"),
        (eqattn.Graph(s, r + 2, num_nodes=4), {}, "`receivers` must be nodes in 0 .. 3"),
        (eqattn.Graph(s - 1, r, num_nodes=4), {}, "`senders` of real edges"),
        (eqattn.Graph(s, r, num_nodes=4, edge_features=w[:-1]), {}, "`edge_features` must be"),
        (eqattn.Graph(s, r, num_nodes=4, edge_features=w * np.nan), {}, "finite"),
        (eqattn.Graph(s, r, num_nodes=4, edge_features=w), {"edge_features": 2}, r"\[\*batch, E, 2\]"),
        (eqattn.Graph(s, r, num_nodes=4), {"edge_features": 1}, "got None"),
        (eqattn.Graph(s[:3], r[:3], num_nodes=4), {"undirected": True}, "reverse"),
        (eqattn.Graph(np.array([1, 1]), np.array([1, 1]), num_nodes=4), {"undirected": True}, "self-loops"),
        (eqattn.Graph(s, r, num_nodes=4, edge_features=np.arange(6.0)[:, None]), {"undirected": True}, "equal both ways"),
        (eqattn.Graph(np.r_[s, 0], np.r_[r, 1], num_nodes=4), {"undirected": True}, "once"),
    ]  # fmt: skip
    for graph, kwargs, match in cases:
        with unchecked(), pytest.raises(eqattn.GraphError, match=match) as error:
            eqattn.check_graph(graph, **kwargs)
        assert "\n" not in str(error.value)
    with pytest.raises(eqattn.GraphError, match="`num_nodes` must be an int"):
        eqattn.Graph(s, r, num_nodes=4.0)
    assert issubclass(eqattn.GraphError, ValueError)
    # padding (receiver n) is allowed anywhere, whatever its sender
    padded = eqattn.Graph(np.r_[s, 7], np.r_[r, 4], num_nodes=4)
    assert eqattn.check_graph(padded, undirected=True) is padded


def _segments_reference(x, ids, n, beta, where):
    lse, soft = np.full(n, -np.inf), np.zeros(n)
    for i in range(n):
        e = np.flatnonzero((ids == i) & where)
        if e.size:
            lse[i] = np.log(np.sum(np.exp(x[e] - x[e].max()))) + x[e].max()
            p = np.exp(-beta * (x[e] - x[e].min()))
            soft[i] = p @ x[e] / p.sum()
    return lse, soft


def test_segment_operations_against_float64_numpy():
    rng = np.random.default_rng(0)
    n, edges = 7, 40
    x = rng.standard_normal(edges) * 3
    ids = rng.integers(0, n + 2, edges)  # ids n and n + 1 are dropped (padding)
    ids[ids == 2] = 3  # segment 2 is empty
    where = rng.random(edges) < 0.8
    lse, soft = _segments_reference(x, ids, n, 1.7, where)
    got_lse = eqattn.segment_logsumexp(np.where(where, x, -np.inf), ids, n)
    np.testing.assert_allclose(got_lse, lse, rtol=1e-12)
    got = eqattn.segment_softmin(x, ids, n, beta=1.7, where=where)
    np.testing.assert_allclose(got, soft, rtol=1e-12, atol=1e-14)
    assert got_lse[2] == -np.inf and got[2] == 0.0
    # huge entries: shifted, not overflowed
    big = eqattn.segment_logsumexp(np.array([1e4, 1e4 + 1.0]), np.array([0, 0]), 1)
    np.testing.assert_allclose(big, [1e4 + 1.0 + np.log1p(np.exp(-1.0))], rtol=1e-15)


def test_the_soft_minimum_is_the_least_entry_exactly_at_the_tropical_limit_and_in_ties():
    """Centred on the least entry, it returns that entry bit for bit where the others' weights
    vanish, and where entries tie (a mean of equal numbers would round), in float32 too."""
    x = jnp.array([492.390625, 492.390625, 492.390625, 600.0, 7.0], jnp.float32)
    ids = jnp.array([0, 0, 0, 0, 1])
    out = eqattn.segment_softmin(x, ids, 2, beta=1e5)
    assert out.dtype == jnp.float32 and out[0] == x[0] and out[1] == x[4]


def test_segment_gradients_match_finite_differences_and_are_zero_for_empty_segments():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(12)
    ids = np.array([0, 0, 0, 1, 1, 3, 3, 3, 3, 0, 1, 3])
    where = np.ones(12, bool)
    where[[3, 4, 10]] = False  # segment 1 has no entry that counts

    def f(x, beta):
        lse = eqattn.segment_logsumexp(jnp.where(where, x, -jnp.inf), ids, 4)
        return jnp.where(jnp.isfinite(lse), lse, 0.0), eqattn.segment_softmin(
            x, ids, 4, beta=beta, where=where
        )

    check_grads(f, (x, 2.3), order=1, modes=["rev"], atol=1e-7, rtol=1e-7)
    g = jax.grad(lambda x: f(x, 2.3)[1].sum() + f(x, 2.3)[0].sum())(x)
    g = np.asarray(g)
    assert np.isfinite(g).all() and not g[[3, 4, 10]].any()


@pytest.mark.bad_input
def test_segment_operations_refuse_bad_input():
    x, ids = np.ones(3), np.zeros(3, np.int32)
    for call, match in [
        (lambda: eqattn.segment_logsumexp(x[:2], ids, 2), "one shape|`data` and `segment_ids`"),
        (lambda: eqattn.segment_logsumexp(ids, ids, 2), "floating-point"),
        (lambda: eqattn.segment_logsumexp(x, ids, 2.0), "`num_segments` must be an int"),
        (lambda: eqattn.segment_softmin(x, ids, 2, beta=0.0), "finite and > 0"),
        (lambda: eqattn.segment_softmin(x, ids, 2, beta=1.0, where=ids), "`where` must be boolean"),
    ]:
        with unchecked(), pytest.raises(eqattn.GraphError, match=match):
            call()
