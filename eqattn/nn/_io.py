"""Token embedding and read-out shared by the transformer models (implicit and explicit)."""

from __future__ import annotations

from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp

Pooling = Literal["mean", "cls", "none"]


def init_io(keys, num_outputs, dim, vocab_size, in_features, max_len, pooling, dtype):
    """`(embed, positions, cls_token, final_norm, head)` of a model, from four PRNG keys."""
    if (vocab_size is None) == (in_features is None):
        raise ValueError("give exactly one of `vocab_size` (integer tokens) and `in_features`.")
    if pooling not in ("mean", "cls", "none"):
        raise ValueError(f"`pooling` must be 'mean', 'cls' or 'none'; got {pooling!r}.")
    ke, kp, kc, kh = keys
    if vocab_size is not None:
        embed = eqx.nn.Embedding(vocab_size, dim, key=ke, dtype=dtype)
    else:
        embed = eqx.nn.Linear(in_features, dim, key=ke, dtype=dtype)
    float_dtype = dtype or jnp.result_type(float)
    positions = 0.02 * jax.random.normal(kp, (max_len + 1, dim), float_dtype)
    cls_token = 0.02 * jax.random.normal(kc, (dim,), float_dtype) if pooling == "cls" else None
    final_norm = eqx.nn.LayerNorm(dim, dtype=dtype)
    head = eqx.nn.Linear(dim, num_outputs, key=kh, dtype=dtype)
    return embed, positions, cls_token, final_norm, head


def embed_tokens(model, x, padding_mask):
    """Checked inputs -> (embedded tokens with positions (and the summary token), padding mask)."""
    if isinstance(model.embed, eqx.nn.Embedding):
        if jnp.ndim(x) != 1 or not jnp.issubdtype(jnp.result_type(x), jnp.integer):
            raise ValueError(
                f"`x` must be integer tokens of shape [n]; got {jnp.result_type(x)}{list(jnp.shape(x))}."
            )
    elif jnp.ndim(x) != 2 or x.shape[-1] != model.embed.in_features:
        raise ValueError(
            f"`x` must have shape [n, {model.embed.in_features}]; got shape {jnp.shape(x)}."
        )
    if x.shape[0] > model.max_len:
        raise ValueError(f"`x` has {x.shape[0]} tokens; this model takes at most {model.max_len}.")
    h = jax.vmap(model.embed)(x)
    n = h.shape[0]
    if padding_mask is not None:
        padding_mask = jnp.asarray(padding_mask)
        if padding_mask.shape != (n,) or padding_mask.dtype != jnp.bool_:
            raise ValueError(
                f"`padding_mask` must be boolean of shape [{n}]; got "
                f"{padding_mask.dtype}{list(padding_mask.shape)}."
            )
    if model.cls_token is not None:
        h = jnp.concatenate([model.cls_token[None], h])
        if padding_mask is not None:
            padding_mask = jnp.concatenate([jnp.ones(1, bool), padding_mask])
    return h + model.positions[: h.shape[0]], padding_mask


def read_out(model, z, padding_mask):
    """Final norm, pooling and head."""
    z = jax.vmap(model.final_norm)(z)
    if model.pooling == "cls":
        z = z[0]
    elif model.pooling == "mean":
        w = jnp.ones(z.shape[0]) if padding_mask is None else padding_mask.astype(z.dtype)
        z = (w @ z) / jnp.maximum(jnp.sum(w), 1)
    else:
        return jax.vmap(model.head)(z)
    return model.head(z)
