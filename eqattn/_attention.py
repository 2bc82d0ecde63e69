r"""Attention as the gradient of a log-normalizer, and multi-head reshaping.

For a discrete carrier on the keys, $A(\eta) = \log\sum_j e^{\beta k_j\cdot\eta}$ and
$\frac{1}{\beta}\nabla_\eta A = \sum_j \mathrm{softmax}_j(\beta k\cdot\eta)\, k_j$: softmax
attention with values = keys (A. Shim, "A Probabilistic Interpretation of Transformers", 2021).
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from ._core import Implementation, attention_with_lse, check_inputs
from ._implementation import cudnn_attention, select_implementation


def log_normalizer(
    queries: Float[ArrayLike, "*#batch n d"],
    keys: Float[ArrayLike, "*#batch m d"],
    *,
    beta: float | Float[ArrayLike, "*#batch"] = 1.0,
    mask: Bool[ArrayLike, "*#batch #n #m"] | None = None,
    chunk_size: int | None = None,
    implementation: Implementation = "auto",
) -> Float[Array, "*batch n"]:
    r"""Log-normalizer of the discrete exponential family on the keys, one per query:

    $$A(q_i) = \log \sum_{j:\ \mathrm{mask}_{ij}} e^{\beta\, q_i \cdot k_j}.$$

    Its gradient is $\beta$ times [`eqattn.attention`][] with values = keys. A query whose mask
    excludes every key gets $-\infty$. Arguments as in [`eqattn.attention_with_lse`][].

    **Returns:** `[..., n]`.
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
        implementation=implementation,
    )[1]


def attention(
    queries: Float[ArrayLike, "*#batch n d"],
    keys: Float[ArrayLike, "*#batch m d"],
    values: Float[ArrayLike, "*#batch m dv"] | None = None,
    *,
    beta: float | Float[ArrayLike, "*#batch"] = 1.0,
    mask: Bool[ArrayLike, "*#batch #n #m"] | None = None,
    chunk_size: int | None = None,
    implementation: Implementation = "auto",
) -> Float[Array, "*batch n dv"]:
    r"""Softmax attention, $\mathrm{out}_i = \sum_j \mathrm{softmax}_j(\beta\, q_i\cdot k_j)\, v_j$.

    With `values=None` (values = keys) this is the mean of the exponential family tilted by
    $q_i$, $\frac{1}{\beta}\nabla_{q_i} A(q_i)$ (see [`eqattn.log_normalizer`][]).
    Arguments as in [`eqattn.attention_with_lse`][]; a fully masked query gets 0. Here
    `implementation` may also be `"cudnn"`: cuDNN's fused flash attention on NVIDIA GPUs, which
    `"auto"` picks when it can run the inputs (bf16/fp16, $d = d_v \le 128$, $8 \mid d$, no mask);
    see [`eqattn.select_implementation`][].

    **Returns:** `[..., n, dv]`.
    """
    queries, keys = jnp.asarray(queries), jnp.asarray(keys)
    values = keys if values is None else jnp.asarray(values)
    mask = None if mask is None else jnp.asarray(mask)
    check_inputs(queries, keys, values, jnp.asarray(beta), mask)
    impl = select_implementation(
        queries, keys, values, mask=mask, implementation=implementation, chunk_size=chunk_size
    )
    if impl == "cudnn":
        return cudnn_attention(queries, keys, values, beta=jnp.asarray(beta), mask=mask)
    return attention_with_lse(
        queries,
        keys,
        values,
        beta=beta,
        mask=mask,
        chunk_size=chunk_size,
        implementation=implementation,
    )[0]


def split_heads(x: Float[ArrayLike, "*batch n hd"], num_heads: int) -> Float[Array, "*batch h n d"]:
    """`[..., n, heads * d]` -> `[..., heads, n, d]`."""
    x = jnp.asarray(x)
    if x.ndim < 2 or num_heads < 1 or x.shape[-1] % num_heads:
        raise ValueError(
            f"`x` must have shape [..., n, num_heads * head_dim] with num_heads={num_heads} "
            f"dividing the last axis; got shape {x.shape}."
        )
    *batch, n, hd = x.shape
    return jnp.swapaxes(x.reshape(*batch, n, num_heads, hd // num_heads), -2, -3)


def merge_heads(x: Float[ArrayLike, "*batch h n d"]) -> Float[Array, "*batch n hd"]:
    """`[..., heads, n, d]` -> `[..., n, heads * d]` (inverse of [`eqattn.split_heads`][])."""
    x = jnp.asarray(x)
    if x.ndim < 3:
        raise ValueError(f"`x` must have shape [..., heads, n, head_dim]; got shape {x.shape}.")
    x = jnp.swapaxes(x, -2, -3)
    return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])
