"""Per-token maps: a linear layer on each token, and a token array's sharding."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float


def per_token(
    linear: eqx.nn.Linear, x: Float[ArrayLike, "*tokens in"]
) -> Float[Array, "*tokens out"]:
    r"""`linear` applied to each row of `x`: $x W^\top + b$, one matmul over all the tokens.

    The values of `jax.vmap(linear)(x)`, laid out for what follows: `eqx.nn.Linear` computes
    $W x$ per token, and batched by `vmap` that product leaves its result as `[out, tokens]`,
    which XLA transposes back before the next operation (on a CPU, a DEQ block's map spends
    about a third of its time in those copies)."""
    y = jnp.asarray(x) @ linear.weight.T
    return y if linear.bias is None else y + linear.bias


def shard_tokens(sequence, x):
    """`x [..., tokens, dim]` sharded along its tokens as `sequence` (an
    `eqattn.parallel.SequenceSplit`) says (None: as it is)."""
    return x if sequence is None else sequence.constrain(x)
