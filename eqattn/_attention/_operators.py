r"""The public operators: attention as the gradient of a log-normalizer, and multi-head reshaping.
Each call walks one path: check ([`check_arguments`][]) -> plan ([`plan`][], the choice
`eqattn.select_implementation` reports) -> prepare ([`prepare`][]) -> run ([`run`][]).

For a discrete carrier on the keys, $A(\eta) = \log\sum_j e^{\beta k_j\cdot\eta}$ and
$\frac{1}{\beta}\nabla_\eta A = \sum_j \mathrm{softmax}_j(\beta k\cdot\eta)\, k_j$: softmax
attention with values = keys (A. Shim, "A Probabilistic Interpretation of Transformers", 2021).
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from ._backends import run
from ._checks import Implementation, check_causal, check_chunk_size
from ._plan import Tiling, check_tiling, plan
from ._prepare import causal_mask, check_arguments, prepare


def _dispatch(
    queries, keys, values, *, beta, mask, causal, chunk_size, implementation, tiling, need_lse
) -> tuple[Array, Array | None]:
    """`(out, lse)` (`lse` None from cuDNN) by the one path: check, plan, prepare, run."""
    args = check_arguments(queries, keys, values, beta, mask)
    check_chunk_size(chunk_size)
    check_causal(causal)
    # a single query sees every key (the causal mask is aligned at the bottom right): cached
    # generation's one-token calls then skip the causal machinery
    causal = causal and args.queries.shape[-2] > 1
    chosen = plan(
        args.queries,
        args.keys,
        args.values,
        mask=args.mask,
        implementation=implementation,
        chunk_size=chunk_size,
        need_lse=need_lse,
        tiling=check_tiling(tiling),
        causal=causal,
    )
    problem = prepare(args, causal)
    return problem.finish(*run(chosen, problem))


def attention_with_lse(
    queries: Float[ArrayLike, "*#batch n d"],
    keys: Float[ArrayLike, "*#batch m d"],
    values: Float[ArrayLike, "*#batch m dv"] | None = None,
    *,
    beta: float | Float[ArrayLike, "*#batch"] = 1.0,
    mask: Bool[ArrayLike, "*#mask"] | None = None,
    causal: bool = False,
    chunk_size: int | None = None,
    implementation: Implementation = "auto",
    tiling: Tiling | None = None,
) -> tuple[Float[Array, "*batch n dv"], Float[Array, "*batch n"]]:
    r"""Softmax attention and the log-normalizer of every query, in one pass.

    With logits $s_{ij} = \beta\, q_i \cdot k_j$ over the keys $j$ that `mask` allows,

    $$\mathrm{lse}_i = \log \sum_j e^{s_{ij}}, \qquad
      \mathrm{out}_i = \sum_j e^{s_{ij} - \mathrm{lse}_i}\, v_j .$$

    The softmax is computed in at least float32 (bf16/fp16 inputs are upcast, the outputs come
    back in the inputs' dtype) and shifted by the row maximum, so logits of any size are safe. A
    query whose mask excludes every key gets `lse = -inf` and `out = 0`, with zero gradients.

    The backward pass (a custom VJP, cotangents of both `out` and `lse`) recomputes the weights
    from the saved `lse` instead of storing the `n x m` attention matrix. It supports reverse-mode
    autodiff (`grad`, `vjp`; on the XLA paths and the fused kernel also reverse over reverse,
    cuDNN's once only); forward-mode (`jvp`, `jacfwd`) is not supported.

    **Arguments:**

    - `queries` `[..., n, d]`, `keys` `[..., m, d]`, `values` `[..., m, dv]` (default: `keys`).
    - `beta`: inverse temperature $\beta > 0$: a number or an array that broadcasts to the batch
      axes `[...]` (e.g. shape `[heads]` for inputs `[..., heads, n, d]`). Differentiable. A
      value that is not finite and > 0 raises a `ValueError`; a traced one (under `jit`) makes
      the outputs NaN (why not a runtime error: see the README's Reliability section).
    - `mask`: boolean, `True` where query $i$ may attend to key $j$; broadcasts to `[..., n, m]`.
      What it hides is inert: NaN or inf there reaches neither the outputs nor the gradients. A
      query that sees a non-finite key, or is non-finite itself, gets NaN `lse` and `out`; one
      that sees a non-finite value gets a NaN `out` row.
    - `causal`: query $i$ sees key $j$ only if $j \le i + (m - n)$ (the causal mask aligned at
      the bottom right: with $n = m$, keys $0..i$; $n$ new queries after $m - n$ cached keys see
      the cache and the keys up to their own), combined with `mask`. No `n x m` mask is formed
      and the blocks above the diagonal are not computed, by every implementation (see
      [`eqattn.Tiling`][]`.causal_leaf`); cuDNN takes it when $n = m$. Static.
    - `chunk_size`: process the keys in blocks of this many with a running (max, sum-exp,
      weighted sum) (online softmax), forward and backward: memory $O(n \cdot \mathrm{chunk})$
      rather than $O(nm)$, results equal to one pass to round-off. `None`: as `"auto"` decides.
    - `implementation`: `"auto"` (the rule: [`eqattn.select_implementation`][]), `"xla"`
      (eqattn's one pass, never chunked), `"chunked"` (blocks of `chunk_size`, default 1024,
      keys) or `"pallas"`: eqattn's fused kernel (FlashAttention-2 tiling, Triton on NVIDIA
      GPUs, Mosaic on TPUs, interpret mode on a CPU for tests), memory $O((n + m) d)$ forward
      and backward, feature sizes up to 256. cuDNN's kernel (`"cudnn"`) returns no log-sum-exp:
      it serves [`eqattn.attention`][] only.
    - `tiling`: an [`eqattn.Tiling`][], the thresholds and sizes of the automatic choices above
      (static; default `Tiling()`).

    Leading (batch) axes of all arguments broadcast against each other.

    **Returns:**

    `(out, lse)` with shapes `[..., n, dv]` and `[..., n]`.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 4, 16, 8))  # [batch, heads, n, d]
    out, lse = eqattn.attention_with_lse(q, k, v, beta=jnp.full(4, 0.5), causal=True)
    assert out.shape == (2, 4, 16, 8) and lse.shape == (2, 4, 16)
    # the first query sees only the first key: its output is that key's value
    assert jnp.allclose(out[..., 0, :], v[..., 0, :], atol=1e-6)
    ```
    """
    options = dict(beta=beta, mask=mask, chunk_size=chunk_size, implementation=implementation)
    out, lse = _dispatch(
        queries, keys, values, **options, tiling=tiling, need_lse=True, causal=causal
    )
    assert lse is not None  # cuDNN, which gives none, is not planned when one is needed
    return out, lse


def log_normalizer(
    queries: Float[ArrayLike, "*#batch n d"],
    keys: Float[ArrayLike, "*#batch m d"],
    *,
    beta: float | Float[ArrayLike, "*#batch"] = 1.0,
    mask: Bool[ArrayLike, "*#mask"] | None = None,
    causal: bool = False,
    chunk_size: int | None = None,
    implementation: Implementation = "auto",
    tiling: Tiling | None = None,
) -> Float[Array, "*batch n"]:
    r"""Log-normalizer of the discrete exponential family on the keys, one per query:

    $$A(q_i) = \log \sum_{j:\ \mathrm{mask}_{ij}} e^{\beta\, q_i \cdot k_j}.$$

    Its gradient is $\beta$ times [`eqattn.attention`][] with values = keys. A query whose mask
    excludes every key gets $-\infty$. Arguments as in [`eqattn.attention_with_lse`][].

    **Returns:** `[..., n]`.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    q, k = jax.random.normal(jax.random.key(0), (2, 5, 3))
    A = eqattn.log_normalizer(q, k, beta=2.0)
    assert jnp.allclose(A, jax.nn.logsumexp(2.0 * q @ k.T, axis=-1), atol=1e-5)
    ```
    """
    keys = jnp.asarray(keys)
    # Zero-width values: the core then does no output matmul, only the log-sum-exp.
    no_values = jnp.zeros(keys.shape[:-1] + (0,), keys.dtype)
    return attention_with_lse(
        queries,
        keys,
        no_values,
        beta=beta,
        mask=mask,
        chunk_size=chunk_size,
        causal=causal,
        implementation=implementation,
        tiling=tiling,
    )[1]


def attention(
    queries: Float[ArrayLike, "*#batch n d"],
    keys: Float[ArrayLike, "*#batch m d"],
    values: Float[ArrayLike, "*#batch m dv"] | None = None,
    *,
    beta: float | Float[ArrayLike, "*#batch"] = 1.0,
    mask: Bool[ArrayLike, "*#mask"] | None = None,
    causal: bool = False,
    chunk_size: int | None = None,
    implementation: Implementation = "auto",
    tiling: Tiling | None = None,
) -> Float[Array, "*batch n dv"]:
    r"""Softmax attention, $\mathrm{out}_i = \sum_j \mathrm{softmax}_j(\beta\, q_i\cdot k_j)\, v_j$.

    With `values=None` (values = keys) this is the mean of the exponential family tilted by
    $q_i$, $\frac{1}{\beta}\nabla_{q_i} A(q_i)$ (see [`eqattn.log_normalizer`][]).
    Arguments as in [`eqattn.attention_with_lse`][]; a fully masked query gets 0. Here
    `implementation` may also be `"cudnn"`: cuDNN's fused flash attention on NVIDIA GPUs, which
    `"auto"` picks where it can run the inputs ([`eqattn.select_implementation`][]).

    **Returns:** `[..., n, dv]`.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    q, k = jax.random.normal(jax.random.key(0), (2, 5, 3))
    # values = keys: (1/beta) times the gradient of the log-normalizer
    grad = jax.grad(lambda q: eqattn.log_normalizer(q, k, beta=2.0).sum())(q)
    assert jnp.allclose(eqattn.attention(q, k, beta=2.0), grad / 2.0, atol=1e-5)
    ```
    """
    return _dispatch(
        queries,
        keys,
        values,
        beta=beta,
        mask=mask,
        chunk_size=chunk_size,
        implementation=implementation,
        tiling=tiling,
        need_lse=False,
        causal=causal,
    )[0]


def attention_weights(
    queries: Float[ArrayLike, "*#batch n d"],
    keys: Float[ArrayLike, "*#batch m d"],
    *,
    beta: float | Float[ArrayLike, "*#batch"] = 1.0,
    mask: Bool[ArrayLike, "*#mask"] | None = None,
    causal: bool = False,
    implementation: Implementation = "auto",
    tiling: Tiling | None = None,
) -> Float[Array, "*batch n m"]:
    r"""The attention (association) weights $p_{ij} = \exp(\beta\, q_i\cdot k_j - A(q_i))$, with
    the log-normalizer $A$ from [`eqattn.log_normalizer`][]: one $n \times m$ pass, for
    inspecting what attends to what. Masked entries and fully masked rows are 0. Arguments as in
    [`eqattn.attention_with_lse`][].

    **Returns:** `[..., n, m]`.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    q, k = jax.random.normal(jax.random.key(0), (2, 4, 3))
    p = eqattn.attention_weights(q, k, causal=True)
    assert jnp.allclose(p.sum(-1), 1.0) and jnp.all(jnp.triu(p, k=1) == 0)
    ```
    """
    queries, keys = jnp.asarray(queries), jnp.asarray(keys)
    lse = log_normalizer(
        queries,
        keys,
        beta=beta,
        mask=mask,
        causal=causal,
        implementation=implementation,
        tiling=tiling,
    )
    b = jnp.asarray(beta, jnp.promote_types(lse.dtype, jnp.float32))[..., None, None]
    logits = b * jnp.einsum("...nd,...md->...nm", queries, keys, preferred_element_type=b.dtype)
    keep = jnp.isfinite(lse)[..., None]  # fully masked rows are 0
    if mask is not None:
        keep = keep & jnp.asarray(mask)
    if causal:  # this operator's output is n x m anyway
        keep = keep & causal_mask(queries.shape[-2], keys.shape[-2])
    safe = jnp.where(jnp.isfinite(lse), lse, 0).astype(b.dtype)[..., None]
    return jnp.where(keep, jnp.exp(logits - safe), 0).astype(lse.dtype)


def split_heads(x: Float[ArrayLike, "*batch n hd"], num_heads: int) -> Float[Array, "*batch h n d"]:
    """`[..., n, heads * d]` -> `[..., heads, n, d]`.

    **Example:**

    ```python
    import jax.numpy as jnp, eqattn

    x = jnp.arange(2 * 5 * 12.0).reshape(2, 5, 12)  # [batch, n, heads * d]
    h = eqattn.split_heads(x, 3)
    assert h.shape == (2, 3, 5, 4) and jnp.all(h[:, 1] == x[..., 4:8])
    assert jnp.all(eqattn.merge_heads(h) == x)
    ```
    """
    x = jnp.asarray(x)
    if x.ndim < 2 or num_heads < 1 or x.shape[-1] % num_heads:
        raise ValueError(
            f"`x` must have shape [..., n, num_heads * head_dim] with num_heads={num_heads} "
            f"dividing the last axis; got shape {x.shape}."
        )
    *batch, n, hd = x.shape
    return jnp.swapaxes(x.reshape(*batch, n, num_heads, hd // num_heads), -2, -3)


def merge_heads(x: Float[ArrayLike, "*batch h n d"]) -> Float[Array, "*batch n hd"]:
    """`[..., heads, n, d]` -> `[..., n, heads * d]` (inverse of [`eqattn.split_heads`][]).

    **Example:**

    ```python
    import jax.numpy as jnp, eqattn

    h = jnp.arange(3 * 5 * 4.0).reshape(3, 5, 4)  # [heads, n, d]
    x = eqattn.merge_heads(h)
    assert x.shape == (5, 12) and jnp.all(x[:, 4:8] == h[1])
    ```
    """
    x = jnp.asarray(x)
    if x.ndim < 3:
        raise ValueError(f"`x` must have shape [..., heads, n, head_dim]; got shape {x.shape}.")
    x = jnp.swapaxes(x, -2, -3)
    return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])
