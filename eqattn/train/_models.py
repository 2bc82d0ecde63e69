"""The explicit twin's shape: its width and MLP ratio matched to the DEQ's parameters, from any
task's model builder."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import equinox as eqx
import jax

from .._errors import ConfigError
from ._config import Config

Build = Callable[..., eqx.Module]
"""`build(config, key) -> model`: a task's model builder (`AbstractTask.build_model`)."""


def count_params(build: Build, config: Config) -> int:
    """The parameters of `build(config, key)`, counted from shapes (nothing is initialized)."""
    shapes = eqx.filter_eval_shape(lambda: build(config, jax.random.key(0)))
    return sum(x.size for x in jax.tree.leaves(shapes) if isinstance(x, jax.ShapeDtypeStruct))


def explicit_shape(build: Build, config: Config) -> tuple[int, float]:
    """The explicit twin's `(width, mlp_ratio)`: the configuration's own when it records them,
    else `depth` blocks with the DEQ model's parameters (`matched_shape`)."""
    if config.width is not None:
        return config.width, 2.0 if config.mlp_ratio is None else config.mlp_ratio
    return matched_shape(build, config)


def with_shape(build: Build, config: Config) -> Config:
    """`config` with the explicit model's width and MLP ratio filled in (what a new run records,
    so that its checkpoint rebuilds the same model whatever the matching rule becomes)."""
    if config.model != "explicit" or config.width is not None:
        return config
    width, mlp_ratio = explicit_shape(build, config)
    return dataclasses.replace(config, width=width, mlp_ratio=mlp_ratio)


@functools.lru_cache(maxsize=64)
def matched_shape(build: Build, config: Config) -> tuple[int, float]:
    """`depth` blocks with about the DEQ model's parameters. The width (a multiple of the
    configuration's `width_step`, the heads of a transformer, at
    most `dim`) closest at MLP ratio 2; if that is more than 5% off, the closest pair with the
    MLP ratio in 1 to 4 by quarters, and if still more than 5% off, with the width up to
    `2 * dim` and the ratio in 0.25 to 8 (else a `ConfigError` naming both counts)."""
    target = count_params(build, dataclasses.replace(config, model="deq"))
    # each (width, ratio) counted once: the rules and `_closest` revisit the same pairs
    count = functools.cache(
        lambda w, r: count_params(
            build, dataclasses.replace(config, model="explicit", width=w, mlp_ratio=r)
        )
    )
    off = lambda wr: abs(count(*wr) - target)  # noqa: E731
    width = min(
        range(config.width_step, config.dim + 1, config.width_step), key=lambda w: off((w, 2.0))
    )
    if off((width, 2.0)) <= 0.05 * target:
        return width, 2.0
    best = _closest(count, target, config.width_step, config.dim, (1.0, 4.0))
    if off(best) <= 0.05 * target:
        return best
    best = _closest(count, target, config.width_step, 2 * config.dim, (0.25, 8.0))
    if off(best) > 0.05 * target:
        raise ConfigError(
            f"no explicit model of `depth` {config.depth} comes within 5% of the DEQ's "
            f"{target:,} parameters (the closest, width {best[0]} at MLP ratio {best[1]}, has "
            f"{count(*best):,}); choose another `depth` or `dim`"
        )
    return best


def _closest(count, target: int, step: int, max_width: int, ratios) -> tuple[int, float]:
    """The `(width, ratio)` whose `count` is closest to `target`: widths multiples of `step` up
    to `max_width`, ratios by quarters within `ratios`. The count is affine in the ratio, so two
    counts per width give its best ratio."""
    pairs = []
    for w in range(step, max_width + 1, step):
        one, two = count(w, 1.0), count(w, 2.0)
        ratio = 1.0 + (target - one) / (two - one) if two != one else 2.0
        pairs.append((w, min(max(round(4 * ratio) / 4, ratios[0]), ratios[1])))
    return min(pairs, key=lambda wr: abs(count(*wr) - target))


def initial_key(config: Config) -> tuple[jax.Array, jax.Array]:
    """`(training key, initialisation key)` of a run of `config`: its `seed` split once."""
    key, init_key = jax.random.split(jax.random.key(config.seed))
    return key, init_key
