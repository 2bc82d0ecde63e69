"""Generation as compiled programs: the prompt's prefill, then every token the window has room
for in one `lax.while_loop` on the device (sampling and the cache included), so that a byte
costs no round trip to the host; a slide of the window is one more call."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np


class Options(NamedTuple):
    """`generate`'s sampling and solver options (static: hashable Python values)."""

    temperature: float
    top_k: int | None
    warm_start: bool
    budget: int | None


@functools.cache
def programs():
    """The jitted programs (compiled once per model structure, shapes and options): `start`
    prefills the prompts and draws the first byte; `run(state, length, width)` draws `length`
    (traced, at most the static `width`) more through the cache, one `lax.while_loop`;
    `slide(state)` draws the byte after the window's slide."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    from .. import nn

    def draw(logits, key, options: Options):
        key, subkey = jax.random.split(key)
        if options.temperature == 0:
            return jnp.argmax(logits, axis=-1), key
        if options.top_k is not None:
            kth = jax.lax.top_k(logits, options.top_k)[0][..., -1:]
            logits = jnp.where(logits < kth, -jnp.inf, logits)
        return jax.random.categorical(subkey, logits / options.temperature, axis=-1), key

    def prefill(model, window, lengths, key, options: Options):
        fn = lambda t, n: nn.prefill(model, t, n, budget=options.budget)  # noqa: E731
        logits, cache, stats = jax.vmap(fn)(window, lengths)
        last = jax.vmap(lambda x, n: x[n - 1])(logits, lengths)
        new, key = draw(last, key, options)
        return new, key, cache, stats

    @eqx.filter_jit
    def start(model, window, lengths, key, options: Options):
        new, key, cache, stats = prefill(model, window, lengths, key, options)
        return State(new, key, cache, stats, window, lengths, jnp.max(lengths))

    def held(s: State):
        """The history's last symbols and the byte just drawn, per row: `[B, context + 1]`."""
        rows = jnp.arange(s.window.shape[0])
        held = jnp.concatenate([s.window, jnp.zeros_like(s.window[:, :1])], axis=1)
        return held.at[rows, s.lengths].set(s.new.astype(held.dtype))

    @eqx.filter_jit
    def slide(model, s: State, options: Options) -> State:
        """The byte after the window's slide: the cache rebuilt from each row's last
        `context // 2` symbols (the drawn byte included), then its next byte drawn."""
        context = s.window.shape[1]
        kept = jnp.minimum(s.lengths + 1, context // 2)
        index = s.lengths[:, None] + 1 - kept[:, None] + jnp.arange(context)
        window = jnp.take_along_axis(held(s), jnp.clip(index, 0, context), axis=1)
        window = jnp.where(jnp.arange(context) < kept[:, None], window, 0)
        new, key, cache, stats = prefill(model, window, kept, s.key, options)
        return State(new, key, cache, stats, window, kept, jnp.max(kept))

    def step(model, options: Options, s: State) -> State:
        def fn(t, c):
            return nn.extend(model, t, c, warm_start=options.warm_start, budget=options.budget)

        logits, cache, stats = jax.vmap(fn)(s.new, s.cache)
        new, key = draw(logits, s.key, options)
        window = held(s)[:, : s.window.shape[1]]
        return State(new, key, cache, stats, window, s.lengths + 1, s.filled + 1)

    @eqx.filter_jit
    def run(model, s: State, options: Options, length, width: int):
        """`length` more bytes through the cache (it must have room for them): the state, and
        the bytes, solver steps and convergence `[B, width]`, of which the first `length`
        columns are drawn."""

        def body(carry):
            i, s, drawn = carry
            s = step(model, options, s)
            new = (s.new, s.stats.steps, s.stats.converged)
            return i + 1, s, tuple(d.at[:, i].set(x) for d, x in zip(drawn, new))

        rows = s.new.shape[0]
        drawn = tuple(
            jnp.zeros((rows, width), x.dtype) for x in (s.new, s.stats.steps, s.stats.converged)
        )
        _, s, drawn = jax.lax.while_loop(lambda c: c[0] < length, body, (0, s, drawn))
        return s, drawn

    return start, run, slide


STREAMED = 16
"""The most bytes one call draws when they are streamed (`on_token`)."""


class State(NamedTuple):
    """What a segment carries: the byte just drawn per row, the key, the cache, the solve that
    drew it, the symbols the cache holds (`window [B, context]`, `lengths [B]`) and the
    longest row's length."""

    new: Any
    key: Any
    cache: Any
    stats: Any
    window: Any
    lengths: Any
    filled: Any


def batch(sequences: list[list[int]], width: int) -> tuple[np.ndarray, np.ndarray]:
    """The sequences right-padded to `width` (every prefill then has one shape: one compile),
    and their lengths."""
    lengths = np.array([len(s) for s in sequences], np.int32)
    tokens = np.zeros((len(sequences), width), np.int32)
    for row, s in zip(tokens, sequences):
        row[: len(s)] = s
    return tokens, lengths


def draw(model, history: list[list[int]], tokens: int, options: Options, key, stream=None):
    """`tokens` bytes after each row of `history` (its symbols, `START` first): the bytes
    `[B, tokens]` and their solves' steps and convergence, as numpy arrays. One call prefills,
    then one compiled loop per fill of the window (a slide: one call); `stream(bytes [B, n])`
    sees each call's bytes as they come (then a call draws at most `STREAMED`)."""
    import jax

    if tokens == 0:
        return [np.zeros((len(history), 0), t) for t in (np.int32, np.int32, bool)]
    start, run, slide = programs()
    context = model.embedding.max_len
    state = start(model, *batch(history, context), key, options)
    filled, left, parts = max(map(len, history)), tokens - 1, []

    def keep(drawn, length: int = 1):
        """A call's (bytes, steps, converged), each `[B, >= length]` of which the first `length`
        columns count: fetched at the end unless streamed."""
        parts.append((drawn, length))
        if stream is not None:
            stream(np.asarray(jax.device_get(drawn[0]))[:, :length])

    def last(s: State):
        return tuple(a[:, None] for a in (s.new, s.stats.steps, s.stats.converged))

    keep(last(state))
    while left > 0:
        if filled >= context:  # the window slides: one call, one byte
            state = slide(model, state, options)
            keep(last(state))
            filled, left = context // 2, left - 1
            continue
        room = min(left, context - filled)
        width = context if stream is None else STREAMED
        for start_at in range(0, room, width):
            length = min(width, room - start_at)
            state, drawn = run(model, state, options, np.asarray(length, np.int32), width)
            keep(drawn, length)
        filled, left = filled + room, left - room
    fetched = jax.device_get([drawn for drawn, _ in parts])
    return [
        np.concatenate([f[i][:, :n] for f, (_, n) in zip(fetched, parts)], axis=1) for i in range(3)
    ]
