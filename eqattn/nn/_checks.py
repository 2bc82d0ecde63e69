"""The checks every layer makes of its settings and inputs, each raising a `ValueError` (or a
`TypeError`) that names the argument and the shapes."""

from __future__ import annotations

import jax.numpy as jnp

from ..parallel import SequenceSplit


def check_dims(dim: int, num_heads: int, name: str = "dim") -> int:
    """The head size `dim // num_heads`, if `num_heads` divides `dim`."""
    if dim < 1 or num_heads < 1 or dim % num_heads:
        raise ValueError(
            f"`num_heads` must divide `{name}`; got {name}={dim}, num_heads={num_heads}."
        )
    return dim // num_heads


def check_tokens(x, dim: int, name: str = "x") -> None:
    """`x` is one example's tokens, `[tokens, dim]`."""
    if jnp.ndim(x) != 2 or x.shape[-1] != dim:
        raise ValueError(
            f"`{name}` must have shape [tokens, {dim}] (one example; use jax.vmap for a batch); "
            f"got shape {jnp.shape(x)}."
        )


def check_mask(mask, n: int, m: int, name: str = "mask"):
    """`mask` as a boolean array broadcasting to `[n, m]` (queries x keys), or None."""
    if mask is None:
        return None
    mask = jnp.asarray(mask)
    try:
        ok = jnp.broadcast_shapes(mask.shape, (n, m)) == (n, m) and mask.dtype == jnp.bool_
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"`{name}` must be boolean and broadcast to [{n}, {m}] (queries x keys); got "
            f"{mask.dtype}{list(mask.shape)}."
        )
    return mask


def check_sequence(sequence):
    """`sequence` is an `eqattn.parallel.SequenceSplit` or None."""
    if sequence is not None and not isinstance(sequence, SequenceSplit):
        raise TypeError(
            f"`sequence` must be an eqattn.parallel.SequenceSplit or None; got "
            f"{type(sequence).__name__}."
        )
    return sequence


def check_dropout(rate: float) -> None:
    if not 0 <= rate < 1:
        raise ValueError(f"`dropout` must be in [0, 1); got {rate}.")
