"""The renormalization a block applies: layer norm of each token, or standardization of the
token cloud."""

from __future__ import annotations

from typing import Literal

from .._renorm import renormalize, standardize_tokens

Norm = Literal["layer", "tokens"]


def apply_norm(norm: str, z):
    """`z [tokens, dim]` renormalized: `"layer"`, each token to zero mean and unit variance;
    `"tokens"`, the token cloud to zero mean and identity covariance."""
    if norm == "layer":
        return renormalize(z, axis=-1)
    return standardize_tokens(z)


def check_norm(norm: str, causal: bool = False) -> None:
    if norm not in ("layer", "tokens"):
        raise ValueError(f"`norm` must be 'layer' or 'tokens'; got {norm!r}.")
    if causal and norm == "tokens":
        raise ValueError(
            "`norm='tokens'` mixes the tokens (it standardizes over them), so a causal block "
            "would let a token see later ones: use norm='layer' with causal=True."
        )
