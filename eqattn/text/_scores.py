r"""Bits per byte of a language model over evaluation windows, two ways.

- **Jointly** (`bits_per_byte`): each window in one call, a DEQ's rows solved together. Under a
  causal mask the exact fixed point's row $t$ depends on the bytes up to $t$ alone, but a joint
  solve stops on a test over all its rows (and Anderson's mixing weights are shared by all of
  them), so an approximate fixed point lets later bytes move earlier predictions, by up to the
  solve's tolerance.
- **Through the cache** (`cached_bits_per_byte`): each window's first byte prefilled, then
  every further byte's row solved by itself against the earlier rows' fixed points
  ([`eqattn.nn.extend`][] in a `lax.scan`): exactly causal, whatever the tolerance.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from .. import nn
from ._windows import Windows

EVAL_BATCH = 32
"""Windows per evaluation call (the last call is padded with unscored windows)."""


@eqx.filter_jit
def _score_windows(model, x, targets, weights, budget):
    """Summed bits and scored bytes of a batch of windows, and each window's solve."""
    p = jax.vmap(lambda xi: model.predict(xi, budget=budget))(x)
    nats = optax.softmax_cross_entropy_with_integer_labels(p.logits, targets)
    bits = jnp.sum(nats * weights) / math.log(2)
    return bits, jnp.sum(weights), p.steps, p.residual, p.converged


@eqx.filter_jit
def _score_cached(model, x, targets, weights, budget, start: int = 1):
    """As `_score_windows`, the rows from `start` on each solved against the earlier rows'
    cache (the first `start` rows, none of them scored unless `start` is 1, solved jointly):
    the mean steps of a window's solves, the largest residual, and whether all converged."""

    def window(tokens, target, weight):
        first, cache, s0 = nn.prefill(model, tokens[:start], budget=budget)

        def step(cache, token):
            logits, cache, s = nn.extend(model, token, cache, budget=budget)
            return cache, (logits, s.steps, s.relative_residual, s.converged)

        _, (logits, steps, residual, converged) = jax.lax.scan(step, cache, tokens[start:])
        logits = jnp.concatenate([first, logits])
        nats = optax.softmax_cross_entropy_with_integer_labels(logits, target)
        return (
            jnp.sum(nats * weight),
            jnp.sum(weight),
            (s0.steps + jnp.sum(steps)) / (1 + steps.shape[0]),
            jnp.maximum(s0.relative_residual, jnp.max(residual)),
            s0.converged & jnp.all(converged),
        )

    nats, scored, *solves = jax.vmap(window)(x, targets, weights)
    return jnp.sum(nats) / math.log(2), jnp.sum(scored), *solves


def _score(score: Callable, model, windows: Windows, budget, tick) -> dict[str, Any]:
    return _summary(*_sums(score, model, windows, budget, tick))


def _sums(score: Callable, model, windows: Windows, budget, tick):
    """Summed bits and scored bytes of `windows` and the statistics of each one's solve."""
    n = len(windows.inputs)
    pad = -n % EVAL_BATCH
    arrays = [np.concatenate([a, np.zeros((pad, *a.shape[1:]), a.dtype)]) for a in windows]
    bits = scored = 0.0
    stats: list[list[np.ndarray]] = [[], [], []]
    for i in range(0, n + pad, EVAL_BATCH):
        chunk = [jnp.asarray(a[i : i + EVAL_BATCH]) for a in arrays]
        b, s, *solves = score(model, *chunk, budget)
        bits, scored = bits + float(b), scored + float(s)
        for kept, a in zip(stats, solves):
            kept.append(np.asarray(a)[: min(EVAL_BATCH, n - i)])
        if tick is not None:
            tick()
    return bits, scored, [np.concatenate(a) for a in stats]


def _summary(bits: float, scored: float, stats: list[np.ndarray]) -> dict[str, Any]:
    steps, residual, converged = (float(a.mean()) for a in stats)
    return dict(
        bits_per_byte=bits / scored,
        scored_bytes=int(scored),
        mean_solver_steps=steps,
        mean_relative_residual=residual,
        converged=converged,
    )


def bits_per_byte(model, windows: Windows, budget=None, tick=None) -> dict[str, Any]:
    """Bits per byte of `windows`, each scored in one call (in batches of `EVAL_BATCH`, the
    last padded), and the mean statistics of the solves; `tick()` after each batch."""
    return _score(_score_windows, model, windows, budget, tick)


def cached_bits_per_byte(model, windows: Windows, budget=None, tick=None) -> dict[str, Any]:
    """As `bits_per_byte`, each scored byte's row solved against the earlier rows' cache: every
    prediction reads the bytes before it alone (module docstring). A window whose first half is
    context only (scored by an earlier window) has that half solved jointly, which no scored
    byte's history can tell apart; the statistics are per window (the mean steps of its solves,
    its largest relative residual, whether all converged)."""
    context = windows.inputs.shape[1]
    half = context // 2
    first_scored = np.where(windows.weights.any(1), windows.weights.argmax(1), context)
    later = first_scored >= half
    bits = scored = 0.0
    stats: list[list[np.ndarray]] = [[], [], []]
    for group, start in ((~later, 1), (later, half)):
        if group.any():
            part = Windows(*(a[group] for a in windows))
            score = functools.partial(_score_cached, start=max(start, 1))
            b, s, solves = _sums(score, model, part, budget, tick)
            bits, scored = bits + b, scored + s
            for kept, a in zip(stats, solves):
                kept.append(a)
    return _summary(bits, scored, [np.concatenate(a) for a in stats])


def cached_batches(windows: Windows) -> int:
    """Calls `cached_bits_per_byte` makes for `windows`."""
    half = windows.inputs.shape[1] // 2
    weights = windows.weights
    later = np.where(weights.any(1), weights.argmax(1), weights.shape[1]) >= half
    return sum(-(-int(g.sum()) // EVAL_BATCH) for g in (~later, later))


def reported_bits_per_byte(model, windows: Windows, budget=None, tick=None) -> dict[str, Any]:
    """The test figure `eqattn train` and `evaluate` report: a DEQ's through its cache
    (`cached_bits_per_byte`: exactly causal), an explicit model's in one call per window (the
    same, at less cost)."""
    if isinstance(model, nn.DEQTransformer):
        return cached_bits_per_byte(model, windows, budget, tick)
    return bits_per_byte(model, windows, budget, tick)


def batches(windows: Windows) -> int:
    """Calls to score `windows`."""
    return -(-len(windows.inputs) // EVAL_BATCH)


def spread(windows: Windows, count: int) -> Windows:
    """`count` windows spread evenly over `windows` (all of them if fewer)."""
    idx = np.unique(np.linspace(0, len(windows.inputs) - 1, count).astype(int))
    return Windows(*(a[idx] for a in windows))
