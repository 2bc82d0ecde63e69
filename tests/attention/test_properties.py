"""Properties of the log-normalizer core that hold for any input (hypothesis), on every XLA path,
in float32 and float64: softmax rows are distributions, a common shift of the keys moves only the
log-normalizer, the output is a convex combination of the values, and attention with values =
keys is (1/beta) times the gradient of the log-normalizer. Bounded: a fixed set of shapes (so
compiled programs are reused) and a fixed example budget."""

import chex
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

import eqattn

PATHS = {
    "one-shot": {},
    "tiled": {"tiling": eqattn.Tiling(forward_logits=32, backward_logits=32, min_logits=0)},
    "chunked": {"chunk_size": 2},
}
SHAPES = [(1, 1, 2), (3, 5, 4), (40, 7, 3)]  # (n, m, d); 40 queries: two 32-row tiles
TOL = {np.float32: 2e-5, np.float64: 1e-12}
BOUNDED = dict(allow_nan=False, allow_infinity=False, min_value=-3.0, max_value=3.0)
PROPERTY = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@st.composite
def problems(draw):
    """`(q [n, d], k [m, d], v [m, 3], beta, mask [n, m], dtype, path)`."""
    n, m, d = draw(st.sampled_from(SHAPES))
    dtype = draw(st.sampled_from([np.float32, np.float64]))

    def arr(shape):
        return draw(hnp.arrays(np.float64, shape, elements=st.floats(**BOUNDED))).astype(dtype)

    q, k, v = arr((n, d)), arr((m, d)), arr((m, 3))
    beta = draw(st.floats(0.1, 4.0))
    mask = draw(hnp.arrays(np.bool_, (n, m)))
    return q, k, v, beta, mask, dtype, draw(st.sampled_from(sorted(PATHS)))


@PROPERTY
@given(problems())
def test_softmax_rows_are_distributions(problem):
    q, k, _, beta, mask, dtype, _ = problem
    w = np.asarray(eqattn.attention_weights(q, k, beta=beta, mask=mask), np.float64)
    chex.assert_shape(w, mask.shape)
    assert np.all(w >= 0) and np.all(w[~mask] == 0)
    np.testing.assert_allclose(w.sum(-1), mask.any(-1).astype(float), rtol=0, atol=10 * TOL[dtype])


@PROPERTY
@given(problems(), st.data())
def test_a_common_shift_of_the_keys_moves_only_the_log_normalizer(problem, data):
    """Keys k_j + t: every logit of query i moves by beta q_i.t, so the weights (and the output)
    stay and lse_i moves by exactly that."""
    q, k, v, beta, mask, dtype, path = problem
    t = data.draw(hnp.arrays(np.float64, k.shape[-1:], elements=st.floats(**BOUNDED)))
    t = t.astype(dtype)
    f = lambda k: eqattn.attention_with_lse(q, k, v, beta=beta, mask=mask, **PATHS[path])  # noqa: E731
    (out, lse), (out_t, lse_t) = f(k), f(k + t)
    shift = beta * (q.astype(np.float64) @ t.astype(np.float64))
    scale = 1 + np.abs(np.where(np.isfinite(lse), lse, 0)) + np.abs(shift)
    tol = 50 * TOL[dtype]
    chex.assert_trees_all_close(out_t, out, rtol=0, atol=tol)
    some = mask.any(-1)
    assert np.all(np.isneginf(lse[~some])) and np.all(np.isneginf(lse_t[~some]))
    lse, lse_t = np.asarray(lse, np.float64)[some], np.asarray(lse_t, np.float64)[some]
    err = np.abs(lse_t - lse - shift[some])
    assert np.all(err <= tol * scale[some]), (err.max(), path, dtype)


@PROPERTY
@given(problems())
def test_the_output_is_a_convex_combination_of_the_values(problem):
    q, k, v, beta, mask, dtype, path = problem
    out = np.asarray(eqattn.attention(q, k, v, beta=beta, mask=mask, **PATHS[path]))
    chex.assert_shape(out, (q.shape[0], v.shape[1]))
    big = np.abs(v).max() + 1
    allowed = mask[:, :, None]
    low = np.where(allowed, v[None], big).min(1)
    high = np.where(allowed, v[None], -big).max(1)
    some = mask.any(-1)
    slack = 10 * TOL[dtype] * big
    assert np.all(out[some] >= low[some] - slack) and np.all(out[some] <= high[some] + slack)
    assert np.all(out[~some] == 0)


@PROPERTY
@given(problems())
def test_attention_is_the_gradient_of_the_log_normalizer(problem):
    """grad_q sum_i w_i A(q_i) = beta w_i attention(q_i) with values = keys."""
    q, k, _, beta, mask, dtype, path = problem
    mask = mask.copy()
    mask[:, 0] = True  # every A(q_i) finite
    w = np.linspace(0.5, 1.5, q.shape[0]).astype(dtype)

    def objective(q):
        return jnp.sum(w * eqattn.log_normalizer(q, k, beta=beta, mask=mask, **PATHS[path]))

    grad = jax.grad(objective)(q)
    expected = beta * w[:, None] * eqattn.attention(q, k, beta=beta, mask=mask, **PATHS[path])
    chex.assert_trees_all_close(grad, expected, rtol=50 * TOL[dtype], atol=50 * TOL[dtype])


class TestWithAndWithoutJit(chex.TestCase):
    """The public functions give the same numbers traced or not (float64, against numpy)."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_attention_with_lse_against_numpy(self):
        rng = np.random.default_rng(0)
        q, k, v = rng.normal(size=(2, 6, 4)), rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 5, 3))
        mask = rng.random((2, 6, 5)) > 0.3
        f = self.variant(lambda q, k, v: eqattn.attention_with_lse(q, k, v, beta=0.7, mask=mask))
        out, lse = f(q, k, v)
        s = np.where(mask, 0.7 * np.einsum("bnd,bmd->bnm", q, k), -np.inf)
        with np.errstate(divide="ignore"):
            ref_lse = np.log(np.exp(s).sum(-1))
        p = np.exp(s - np.where(np.isfinite(ref_lse), ref_lse, 0)[..., None])
        chex.assert_trees_all_close((out, lse), (p @ v, ref_lse), rtol=1e-12, atol=1e-12)
