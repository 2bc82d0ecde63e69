"""The engine's checks: each raises a `ValueError` or `TypeError` naming the argument and the shapes,
at trace time, before anything is computed. (The engine's vocabulary: *check* raises on bad input;
*inert* is what a mask hides, made harmless; *poison* marks the outputs a visible non-finite
input reaches, set to NaN.)"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

Implementation = Literal["auto", "xla", "chunked", "cudnn", "pallas"]
IMPLEMENTATIONS = ("auto", "xla", "chunked", "cudnn", "pallas")


def check_implementation(implementation, need_lse: bool) -> None:
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"`implementation` must be one of {', '.join(map(repr, IMPLEMENTATIONS))}; "
            f"got {implementation!r}."
        )
    if need_lse and implementation == "cudnn":
        raise ValueError(
            "`implementation='cudnn'` returns no log-sum-exp: use it with `eqattn.attention`, "
            "or pick 'auto', 'xla', 'chunked' or 'pallas' for the log-sum-exp."
        )


def check_chunk_size(chunk_size) -> None:
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
    ):
        raise ValueError(f"`chunk_size` must be a positive int or None; got {chunk_size!r}.")


def check_causal(causal) -> None:
    if not isinstance(causal, bool):
        raise TypeError(f"`causal` must be True or False (static); got {causal!r}.")


def is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _shape_error(message: str, **arrays) -> ValueError:
    shapes = ", ".join(f"{name} {tuple(jnp.shape(a))}" for name, a in arrays.items())
    return ValueError(f"{message}; got {shapes}.")


def _broadcast_batch(**arrays) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*(jnp.shape(a)[:-2] for a in arrays.values())))
    except ValueError:
        raise _shape_error(
            "the leading (batch) axes of "
            + ", ".join(f"`{name}`" for name in arrays)
            + " must broadcast against each other",
            **arrays,
        ) from None


def check_inputs(queries, keys, values, beta, mask):
    """Trace-time validation. Returns the broadcast batch shape."""
    for name, a in (("queries", queries), ("keys", keys), ("values", values)):
        if jnp.ndim(a) < 2:
            raise ValueError(
                f"`{name}` must have shape [..., tokens, features]; got shape {jnp.shape(a)}."
            )
        if not jnp.issubdtype(jnp.result_type(a), jnp.floating):
            raise ValueError(f"`{name}` must be a floating-point array; got dtype {a.dtype}.")
    if queries.shape[-1] != keys.shape[-1]:
        raise _shape_error(
            "`queries` and `keys` must have the same feature size d", queries=queries, keys=keys
        )
    if values.shape[-2] != keys.shape[-2]:
        raise _shape_error(
            "`values` must have one row per key (the same m as `keys`)", keys=keys, values=values
        )
    batch = _broadcast_batch(queries=queries, keys=keys, values=values)
    n, m = queries.shape[-2], keys.shape[-2]

    beta_shape = jnp.shape(beta)
    if not jnp.issubdtype(jnp.result_type(beta), jnp.floating) and not jnp.issubdtype(
        jnp.result_type(beta), jnp.integer
    ):
        raise ValueError(
            f"`beta` must be a real number or array; got dtype {jnp.result_type(beta)}."
        )
    try:
        ok = np.broadcast_shapes(beta_shape, batch) == batch
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"`beta` must be a scalar or broadcast to the batch axes {batch} of the inputs "
            "(e.g. shape [heads] for inputs [..., heads, tokens, features]); "
            f"got shape {beta_shape}."
        )
    if is_concrete(beta) and not np.all(np.isfinite(beta) & (np.asarray(beta) > 0)):
        raise ValueError(
            f"`beta` (the inverse temperature) must be finite and > 0; got {np.asarray(beta)}."
        )

    if mask is not None:
        if jnp.result_type(mask) != jnp.bool_:
            raise ValueError(
                f"`mask` must be boolean (True = may attend); got dtype {jnp.result_type(mask)}."
            )
        target = batch + (n, m)
        try:
            ok = np.broadcast_shapes(jnp.shape(mask), target) == target
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(
                f"`mask` must broadcast to [..., n, m] = {target}; got shape {jnp.shape(mask)} "
                f"(queries {queries.shape}, keys {keys.shape})."
            )
    return batch
