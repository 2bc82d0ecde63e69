"""What every task's optimizer step shares: the optimizer and its schedule, the update, and the
Jacobian penalty of the DEQ's training levers."""

from __future__ import annotations

import math

import equinox as eqx
import jax
import optax

from ._config import Config, TransformerConfig


def optimizer_of(config: Config, total_steps: int) -> optax.GradientTransformation:
    """AdamW with warm-up (the first 5% of the steps) and cosine decay to a hundredth of the
    learning rate (and gradient clipping) over `total_steps` steps.

    **Example:**

    ```python
    import jax.numpy as jnp
    from eqattn import digits, train

    optimizer = train.optimizer_of(digits.DigitsConfig(lr=1e-2), total_steps=100)
    params = {"w": jnp.ones(3)}
    updates, _ = optimizer.update({"w": jnp.ones(3)}, optimizer.init(params), params)
    assert float(jnp.abs(updates["w"]).max()) == 0.0  # the warm-up starts from a rate of 0
    ```
    """
    warmup = max(1, total_steps // 20)
    # optax needs a decay phase after the warm-up, also for a run of one or two steps.
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, config.lr, warmup, max(total_steps, warmup + 1), config.lr / 100
    )
    adamw = optax.adamw(schedule, weight_decay=config.weight_decay)
    return optax.chain(optax.clip_by_global_norm(config.clip), adamw) if config.clip else adamw


def apply(optimizer, model, opt_state, grads):
    """The model and optimizer state after one update with `grads`."""
    updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_inexact_array))
    return eqx.apply_updates(model, updates), opt_state


def probed(config: TransformerConfig, examples: int) -> int:
    """How many of `examples` the Jacobian penalty probes: ceil(`jacobian_share` x examples)."""
    return max(1, math.ceil(config.jacobian_share * examples - 1e-9))


def penalties(model, x, fixed_points, keys, rows: int):
    """The Jacobian penalty at the fixed points of the first `rows` examples (the forward's
    dropout keys `keys[0]`, probes drawn with `keys[1]`)."""
    first = lambda a: jax.tree.map(lambda b: b[:rows], a)  # noqa: E731
    return jax.vmap(lambda xi, zi, ki, pk: model.jacobian_penalty(xi, zi, key=ki, probe_key=pk))(
        first(x), first(fixed_points), first(keys[0]), first(keys[1])
    )
