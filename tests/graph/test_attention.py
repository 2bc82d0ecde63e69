"""Attention over a graph's edges against float64 numpy, dense masked attention, finite
differences and its contract: empty nodes, huge scores, low precision, padding under vmap, bad
input, and memory in O(E)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import eqattn

from ..checks import unchecked


def _graph(rng, n=9, edges=30, d=4, dv=3):
    """Random edges with multi-edges and self-loops; nodes 0 and 1 receive none."""
    senders = rng.integers(0, n, edges)
    receivers = rng.integers(2, n, edges)
    receivers[:3] = receivers[3]  # a node with several edges
    senders[4] = receivers[4]  # a self-loop
    senders[5], receivers[5] = senders[6], receivers[6]  # a multi-edge
    q = rng.standard_normal((n, d))
    k = rng.standard_normal((edges, d))
    v = rng.standard_normal((edges, dv))
    return q, k, v, senders, receivers


def _reference(q, k, v, receivers, beta=1.0, bias=None):
    """float64 numpy, node by node: a softmax over its incoming edges."""
    n, dv = q.shape[0], v.shape[1]
    bias = np.zeros(len(receivers)) if bias is None else np.asarray(bias, np.float64)
    out, lse = np.zeros((n, dv)), np.full(n, -np.inf)
    for i in range(n):
        e = np.flatnonzero(receivers == i)
        if e.size:
            s = beta * (k[e] @ q[i]) + bias[e]
            lse[i] = s.max() + np.log(np.exp(s - s.max()).sum())
            out[i] = np.exp(s - lse[i]) @ v[e]
    return out, lse


def test_graph_attention_matches_float64_numpy_with_empty_nodes_multi_edges_and_self_loops():
    rng = np.random.default_rng(0)
    q, k, v, _, receivers = _graph(rng)
    bias = rng.standard_normal(len(receivers))
    out, lse = eqattn.graph_attention_with_lse(q, k, v, receivers, beta=0.7, bias=bias)
    ref_out, ref_lse = _reference(q, k, v, receivers, 0.7, bias)
    np.testing.assert_allclose(out, ref_out, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-12)
    assert lse[0] == lse[1] == -np.inf and not out[:2].any()  # no incoming edge
    np.testing.assert_array_equal(
        eqattn.graph_attention(q, k, v, receivers, beta=0.7, bias=bias), out
    )


def test_graph_attention_equals_dense_masked_attention_values_and_gradients():
    """With node keys and values gathered by sender and no multi-edge, it is `attention` with
    the adjacency as the mask (float64, to 1e-6): outputs, log-normalizers and gradients."""
    rng = np.random.default_rng(1)
    n, d = 12, 5
    adjacency = rng.random((n, n)) < 0.3
    adjacency[3] = False  # node 3 attends to nothing
    receivers, senders = np.nonzero(adjacency)  # receiver i attends to sender j
    x = jnp.asarray(rng.standard_normal((n, d)))
    w = jnp.asarray(rng.standard_normal((n, d)))

    def sparse(x, w, beta):
        out, lse = eqattn.graph_attention_with_lse(x, w[senders], x[senders], receivers, beta=beta)
        return out, jnp.where(jnp.isfinite(lse), lse, 0.0)

    def dense(x, w, beta):
        out, lse = eqattn.attention_with_lse(x, w, x, beta=beta, mask=jnp.asarray(adjacency))
        return out, jnp.where(jnp.isfinite(lse), lse, 0.0)

    for a, b in zip(sparse(x, w, 0.8), dense(x, w, 0.8)):
        np.testing.assert_allclose(a, b, atol=1e-6)
    loss = lambda f: lambda x, w, beta: sum(jnp.sum(jnp.sin(o)) for o in f(x, w, beta))  # noqa: E731
    grads = jax.grad(loss(sparse), argnums=(0, 1, 2))(x, w, 0.8)
    for a, b in zip(grads, jax.grad(loss(dense), argnums=(0, 1, 2))(x, w, 0.8)):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert not np.any(grads[0][3]) or np.any(adjacency[:, 3])  # node 3's query takes none


def test_graph_attention_gradients_match_finite_differences():
    rng = np.random.default_rng(2)
    q, k, v, _, receivers = _graph(rng, n=7, edges=16)
    bias = rng.standard_normal(len(receivers))

    def both(q, k, v, beta, bias):
        out, lse = eqattn.graph_attention_with_lse(q, k, v, receivers, beta=beta, bias=bias)
        return out, jnp.where(jnp.isfinite(lse), lse, 0.0)

    check_grads(both, (q, k, v, 0.6, bias), order=1, modes=["rev"], atol=1e-6, rtol=1e-6)


def test_empty_nodes_and_huge_scores_give_finite_values_and_gradients():
    rng = np.random.default_rng(3)
    q, k, v, _, receivers = _graph(rng)
    q = 1e4 * q  # scores of order 1e4: exp overflows unless shifted
    out, lse = eqattn.graph_attention_with_lse(q, k, v, receivers)
    ref_out, ref_lse = _reference(q, k, v, receivers)
    np.testing.assert_allclose(out, ref_out, atol=1e-9)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12)
    grads = jax.grad(
        lambda q, k, v: jnp.sum(eqattn.graph_attention(q, k, v, receivers)), (0, 1, 2)
    )(q, k, v)
    assert all(np.isfinite(g).all() for g in grads)
    assert not np.any(grads[0][:2])  # the empty nodes' queries take no gradient
    # no edge at all: every node empty
    out, lse = eqattn.graph_attention_with_lse(q, k[:0], v[:0], receivers[:0])
    assert out.shape == (q.shape[0], v.shape[1]) and not out.any() and (lse == -np.inf).all()


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision_inputs_accumulate_in_float32(dtype):
    rng = np.random.default_rng(4)
    q, k, v, _, receivers = _graph(rng, n=64, edges=2000, d=16, dv=8)
    out, lse = eqattn.graph_attention_with_lse(
        *(jnp.asarray(a, dtype) for a in (q, k, v)), receivers
    )
    assert out.dtype == dtype and lse.dtype == jnp.float32
    rounded = [np.asarray(jnp.asarray(a, dtype), np.float64) for a in (q, k, v)]
    ref_out, ref_lse = _reference(*rounded, receivers)
    eps = float(jnp.finfo(dtype).eps)
    np.testing.assert_allclose(np.asarray(out, np.float64), ref_out, atol=4 * eps)
    np.testing.assert_allclose(
        lse, ref_lse, atol=1e-4, rtol=1e-5
    )  # float32 sums, not 2000 roundings


def test_a_batch_of_graphs_padded_to_one_edge_count_runs_under_vmap_and_jit():
    """Padding edges carry a receiver out of range (here n): they change no node's answer."""
    rng = np.random.default_rng(5)
    graphs = [_graph(rng, edges=e) for e in (10, 17, 25)]
    width = max(len(g[4]) for g in graphs)
    n = graphs[0][0].shape[0]

    def padded(a, fill):
        return np.concatenate([a, np.full((width - len(a), *a.shape[1:]), fill)])

    batch = [np.stack([padded(g[i], 0.0 if i < 3 else n) for g in graphs]) for i in (1, 2, 4)]
    q = np.stack([g[0] for g in graphs])
    run = jax.jit(jax.vmap(eqattn.graph_attention_with_lse))
    out, lse = run(q, batch[0], batch[1], batch[2].astype(np.int32))
    for i, (gq, gk, gv, _, gr) in enumerate(graphs):
        ref_out, ref_lse = _reference(gq, gk, gv, gr)
        np.testing.assert_allclose(out[i], ref_out, atol=1e-12)
        np.testing.assert_allclose(lse[i], ref_lse, atol=1e-12)
    # a negative receiver is padding too
    q1, k1, v1, _, r1 = graphs[0]
    shifted = eqattn.graph_attention(
        q1,
        np.concatenate([k1, k1[:2]]),
        np.concatenate([v1, v1[:2]]),
        np.concatenate([r1, [-1, -5]]),
    )
    np.testing.assert_allclose(shifted, _reference(q1, k1, v1, r1)[0], atol=1e-12)


@pytest.mark.bad_input
def test_bad_input_is_a_graph_error_naming_the_argument():
    q, k, v, r = np.ones((3, 4)), np.ones((5, 4)), np.ones((5, 2)), np.zeros(5, np.int32)
    graph = eqattn.Graph(np.zeros(5, np.int32), r, num_nodes=4)
    for args, kwargs, match in [
        ((q[0], k, v, r), {}, "`queries` must be a 2-D"),
        ((q, k[:, :3], v, r), {}, "same width d"),
        ((q, k, v[:4], r), {}, "one row per edge"),
        ((q, k, v, r.astype(float)), {}, "`receivers` must be a 1-D integer"),
        ((q, k, v, r), {"bias": np.ones(4)}, "`bias` must be floating-point of shape"),
        ((q, k, v, r), {"beta": np.ones(2)}, "`beta` must be a number"),
        ((q, k, v, graph), {}, r"one row per node of the graph \(4\); got 3"),
    ]:
        with unchecked(), pytest.raises(eqattn.GraphError, match=match):
            eqattn.graph_attention(*args, **kwargs)


@pytest.mark.parametrize("beta", [np.nan, np.inf, 0.0, -1.0])
def test_a_bad_beta_is_refused_or_poisoned_never_a_graph_without_edges(beta):
    """As dense attention: a concrete `beta` that is not finite and > 0 is refused; a traced
    one gives NaN (loudly wrong), not output 0 and lse -inf for every node."""
    rng = np.random.default_rng(6)
    q, k, v, _, receivers = _graph(rng)
    with pytest.raises(eqattn.GraphError, match="finite and > 0"):
        eqattn.graph_attention(q, k, v, receivers, beta=beta)
    with pytest.raises(ValueError, match="finite and > 0"):
        eqattn.attention(q, k, beta=beta)  # the same contract as the dense operator's
    out, lse = jax.jit(lambda b: eqattn.graph_attention_with_lse(q, k, v, receivers, beta=b))(
        jnp.asarray(beta)
    )
    has_edges = np.isin(np.arange(q.shape[0]), receivers)
    assert np.isnan(out[has_edges]).all() and np.isnan(lse[has_edges]).all()


def test_a_graph_gives_its_receivers():
    """A `Graph` in place of the receivers: the same answer (and its node count is checked)."""
    rng = np.random.default_rng(7)
    q, k, v, senders, receivers = _graph(rng)
    graph = eqattn.Graph(senders, receivers, num_nodes=q.shape[0])
    np.testing.assert_array_equal(
        eqattn.graph_attention(q, k, v, graph), eqattn.graph_attention(q, k, v, receivers)
    )


def test_the_backward_holds_memory_in_the_edges_not_the_nodes_squared():
    """n = 100,000 nodes, mean in-degree 6, d = 64, float32: the compiled gradient's temporaries
    within 1.5x the inputs' size (1.02x measured), where one dense n x n float32 array is 40
    GB."""
    n, edges, d = 100_000, 600_000, 64
    shapes = (
        jax.ShapeDtypeStruct((n, d), jnp.float32),
        jax.ShapeDtypeStruct((edges, d), jnp.float32),
        jax.ShapeDtypeStruct((edges, d), jnp.float32),
        jax.ShapeDtypeStruct((edges,), jnp.int32),
    )
    loss = lambda q, k, v, r: jnp.sum(eqattn.graph_attention(q, k, v, r))  # noqa: E731
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*shapes).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    inputs = sum(np.prod(s.shape) * s.dtype.itemsize for s in shapes)
    assert temp <= 1.5 * inputs, (temp / 2**20, inputs / 2**20)


def test_select_implementation_reports_the_segment_path_and_refuses_dense_options():
    """`select_implementation(..., receivers=...)` says what `graph_attention` runs, on every
    backend, from shapes alone; dense options and bad shapes are refused by name."""
    q = jax.ShapeDtypeStruct((10, 8), jnp.float32)
    e = jax.ShapeDtypeStruct((30, 8), jnp.float32)
    r = jax.ShapeDtypeStruct((30,), jnp.int32)
    for backend in ("cpu", "gpu", "tpu"):
        assert eqattn.select_implementation(q, e, e, receivers=r, backend=backend) == "segment"
    with pytest.raises(ValueError, match="mask"):
        eqattn.select_implementation(q, e, e, receivers=r, mask=jnp.ones((10, 30), bool))
    with pytest.raises(ValueError, match="implementation"):
        eqattn.select_implementation(q, e, e, receivers=r, implementation="xla")
    with pytest.raises(ValueError, match="receivers"):
        eqattn.select_implementation(q, e, e, receivers=jax.ShapeDtypeStruct((29,), jnp.int32))
