"""What every task's models share: the DEQ's solver and adjoint from the configuration, the
explicit baseline's width matched to the DEQ's parameters, and one prediction interface over
both kinds of model (`eqattn.nn.AbstractTransformer.predict`)."""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import nn
from .._errors import ConfigError
from .._solve._named import named_adjoint, named_solver
from ._config import ModelConfig

Prediction = nn.Prediction


def solver_of(config: ModelConfig):
    """The DEQ's forward solver."""
    return named_solver(config.solver, rtol=config.rtol, max_steps=config.max_steps)


def adjoint_of(config: ModelConfig):
    """The DEQ's adjoint (how its fixed point is differentiated)."""
    return named_adjoint(
        config.adjoint,
        rtol=config.rtol,
        max_steps=config.max_steps,
        backward_solver=config.backward_solver,
        backward_steps=config.backward_steps,
        phantom_steps=config.phantom_steps,
        phantom_damping=config.phantom_damping,
    )


def deq_options(config: ModelConfig) -> dict:
    """The keyword arguments of an `eqattn.nn.DEQTransformer` that the configuration sets."""
    return dict(
        solver=solver_of(config),
        adjoint=adjoint_of(config),
        dropout=config.dropout,
        depth=config.cell_depth,
        stem_depth=config.stem_depth,
        attend_input=config.attend_input,
    )


Build = Callable[..., eqx.Module]
"""`build(config, key, *, width, mlp_ratio, dtype) -> model`: a task's model builder."""


def count_params(build: Build, config: ModelConfig, *, width=None, mlp_ratio=2.0) -> int:
    """The parameters of `build(config, ...)` (an explicit model of `width` and `mlp_ratio` when
    `width` is given), counted from shapes (nothing is initialized)."""
    shapes = eqx.filter_eval_shape(
        lambda: build(config, jax.random.key(0), width=width, mlp_ratio=mlp_ratio)
    )
    return sum(x.size for x in jax.tree.leaves(shapes) if isinstance(x, jax.ShapeDtypeStruct))


def explicit_shape(build: Build, config: ModelConfig, *, legacy: bool = False) -> tuple[int, float]:
    """The explicit baseline's `(width, mlp_ratio)`: the configuration's own when it records
    them, else `depth` blocks with the DEQ model's parameters (`matched_shape`)."""
    if config.width is not None:
        return config.width, 2.0 if config.mlp_ratio is None else config.mlp_ratio
    return matched_shape(build, config, extended=not legacy)


@functools.lru_cache(maxsize=64)
def matched_shape(build: Build, config: ModelConfig, *, extended: bool) -> tuple[int, float]:
    """`depth` blocks with about the DEQ model's parameters. The width (a multiple of `heads`, at
    most `dim`) closest at MLP ratio 2; if that is more than 5% off, the closest pair with the
    MLP ratio in 1 to 4 by quarters, and if still more than 5% off, with the width up to
    `2 * dim` and the ratio in 0.25 to 8 (else a `ConfigError` naming both counts). Checkpoints
    that do not record their shape were built by the first rule alone (digits) or the first two
    (text): `extended=False` gives that."""
    target = count_params(build, dataclasses.replace(config, model="deq"))
    explicit = dataclasses.replace(config, model="explicit", width=None, mlp_ratio=None)
    # each (width, ratio) counted once: the rules and `_closest` revisit the same pairs
    count = functools.cache(lambda w, r: count_params(build, explicit, width=w, mlp_ratio=r))
    off = lambda wr: abs(count(*wr) - target)  # noqa: E731
    width = min(range(config.heads, config.dim + 1, config.heads), key=lambda w: off((w, 2.0)))
    if off((width, 2.0)) <= 0.05 * target or (config.task == "digits" and not extended):
        return width, 2.0
    best = _closest(count, target, config.heads, config.dim, (1.0, 4.0))
    if off(best) <= 0.05 * target or not extended:
        return best
    best = _closest(count, target, config.heads, 2 * config.dim, (0.25, 8.0))
    if off(best) > 0.05 * target:
        raise ConfigError(
            f"no explicit model of --depth {config.depth} comes within 5% of the DEQ's "
            f"{target:,} parameters (the closest, width {best[0]} at MLP ratio {best[1]}, has "
            f"{count(*best):,}); choose another --depth or --dim"
        )
    return best


def _closest(count, target: int, heads: int, max_width: int, ratios) -> tuple[int, float]:
    """The `(width, ratio)` whose `count` is closest to `target`: widths multiples of `heads` up
    to `max_width`, ratios by quarters within `ratios`. The count is affine in the ratio, so two
    counts per width give its best ratio."""
    pairs = []
    for w in range(heads, max_width + 1, heads):
        one, two = count(w, 1.0), count(w, 2.0)
        ratio = 1.0 + (target - one) / (two - one) if two != one else 2.0
        pairs.append((w, min(max(round(4 * ratio) / 4, ratios[0]), ratios[1])))
    return min(pairs, key=lambda wr: abs(count(*wr) - target))


@typing.runtime_checkable
class Predictor(typing.Protocol):
    """A model with `predict` (`eqattn.nn.AbstractTransformer`, the graph models)."""

    def predict(self, x, *, budget=None, key=None, z0=None) -> Prediction: ...


def predict(model: Predictor, x, budget=None, key=None, z0=None) -> Prediction:
    """One example's output and its solve's statistics (`model.predict`): `key` (training) draws
    dropout masks, without it the model runs in inference mode; `z0` warm-starts a DEQ's solve."""
    return model.predict(x, budget=budget, key=key, z0=z0)


def correction_segments(budget: int, pieces: int) -> tuple[int, ...]:
    """`budget` solver steps split into `pieces` nearly equal pieces of at least 2 steps."""
    if budget < 2 * pieces:
        raise ConfigError(
            f"--corrections {pieces} needs a training budget of at least {2 * pieces} solver "
            f"steps (--train-steps, --max-steps); got {budget}"
        )
    return tuple(budget // pieces + (i < budget % pieces) for i in range(pieces))


def predict_corrected(model: eqx.Module, x, segments: Sequence[int], key=None, z0=None):
    """As `predict` for a DEQ solved in `segments` pieces (fixed-point correction): `logits
    [pieces, ...]`, one per piece's end; the statistics are the whole solve's."""
    if not isinstance(model, nn.DEQTransformer):
        raise ConfigError("fixed-point correction (--corrections) needs the DEQ model")
    logits, pieces = model.trajectory(x, segments, key=key, inference=key is None, z0=z0)
    last = pieces[-1]
    steps = jnp.sum(jnp.stack([eq.steps for eq in pieces]))
    return Prediction(jnp.stack(logits), steps, last.relative_residual, last.converged, last.value)
