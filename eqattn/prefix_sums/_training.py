r"""Training and scoring prefix-sums models.

The DEQ is trained by path independence from partly solved starts (Anil et al. 2022, with the
progressive start of Bansal et al. 2022): for each batch of strings of $n$ bits, a count
$p \sim U\{0, \dots, n\}$ and a start $z_0$ (zeros, or $\mathcal{N}(0, 1)$ per entry, each with
probability 1/2) are drawn; the step runs $p$ times from $z_0$ with nothing differentiated, then
$n + 4$ times with gradient, and the loss is the cross-entropy of the last state's logits. The
map learns to reach the answer from anywhere on its way, which makes the fixed point the answer
at any length.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, ArrayLike, Int, PRNGKeyArray

from .. import train
from .._graph import Graph
from ._data import chain, draw_batch
from ._model import PrefixSumsModel

EXTRA_STEPS = 4
"""Steps with gradient beyond the string's length (information crosses one edge a step)."""


Stats = train.ReasoningStats
"""A training loss's statistics: strings right, steps, residual, converged (`train.ReasoningStats`)."""


def _chains(bits) -> Graph:
    """The chain every string of a batch is read as (one graph, shared)."""
    return chain(int(bits.shape[1]))


def loss_and_stats(
    model: PrefixSumsModel,
    bits: Int[ArrayLike, "batch n"],
    targets: Int[ArrayLike, "batch n"],
    key: PRNGKeyArray,
    *,
    extra: int = EXTRA_STEPS,
) -> tuple[Array, Stats]:
    """The batch's mean cross-entropy and its `Stats`: a DEQ's after a random partial solve and
    `n + extra` steps with gradient (module docstring), an explicit model's of its output.

    **Example:**

    ```python
    import jax, numpy as np
    from eqattn import prefix_sums

    model = prefix_sums.PrefixSumsModel.deq(8, 2, key=jax.random.key(0))
    bits = prefix_sums.draw_bits(np.random.default_rng(0), 2, 5)
    targets = prefix_sums.prefix_parity(bits)
    value, (right, steps, residual, converged) = prefix_sums.loss_and_stats(
        model, bits, targets, jax.random.key(1)
    )
    assert 0 <= right <= 1 and 5 + prefix_sums.EXTRA_STEPS <= steps <= 2 * 5 + 4
    ```
    """
    bits = jnp.asarray(bits)
    return train.reasoning_loss(
        model.reasoner,
        bits,
        _chains(bits),
        targets,
        key,
        steps=bits.shape[1] + extra,
        warm=bits.shape[1],
    )


def loss(
    model: PrefixSumsModel,
    bits: Int[ArrayLike, "batch n"],
    targets: Int[ArrayLike, "batch n"],
    key: PRNGKeyArray,
) -> Array:
    """The batch's mean cross-entropy: a DEQ's after a random partial solve and `n +
    EXTRA_STEPS` steps (module docstring), an explicit model's of its output.

    **Example:**

    ```python
    import jax, numpy as np
    from eqattn import prefix_sums

    model = prefix_sums.PrefixSumsModel.deq(8, 2, key=jax.random.key(0))
    bits = prefix_sums.draw_bits(np.random.default_rng(0), 2, 5)
    value = prefix_sums.loss(model, bits, prefix_sums.prefix_parity(bits), jax.random.key(1))
    assert value.shape == () and value > 0
    ```
    """
    return loss_and_stats(model, bits, targets, key)[0]


def mixed_loss(
    model: PrefixSumsModel,
    bits: Sequence[Int[ArrayLike, "batch _"]],
    targets: Sequence[Int[ArrayLike, "batch _"]],
    key: PRNGKeyArray,
    *,
    extra: int = EXTRA_STEPS,
) -> tuple[Array, Stats]:
    """A step's loss over strings of several lengths (`draw_batch`): the mean over the lengths
    of `loss_and_stats`, each length weighing alike, and the mean of their statistics.

    **Example:**

    ```python
    import jax, numpy as np
    from eqattn import prefix_sums

    model = prefix_sums.PrefixSumsModel.deq(8, 2, key=jax.random.key(0))
    bits, targets = prefix_sums.draw_batch(np.random.default_rng(0), 2, (4, 6))
    value, stats = prefix_sums.mixed_loss(model, bits, targets, jax.random.key(1))
    assert value.shape == () and len(stats) == 4
    ```
    """
    if len(bits) != len(targets) or not bits:
        raise ValueError(
            f"`bits` and `targets` must hold one batch per length, alike; got {len(bits)} and "
            f"{len(targets)}"
        )
    keys = jax.random.split(key, len(bits))
    parts = [loss_and_stats(model, b, t, k, extra=extra) for b, t, k in zip(bits, targets, keys)]
    return train.mean_parts(parts)


def make_step(optimizer: optax.GradientTransformation, *, extra: int = EXTRA_STEPS) -> Callable:
    """`step(model, opt_state, bits, targets, key) -> (model, opt_state, loss, stats)`,
    compiled: one optimizer step on `mixed_loss` (`bits`, `targets`: one batch per length, as
    `draw_batch` gives them).

    **Example:**

    ```python
    import equinox as eqx, jax, numpy as np, optax
    from eqattn import prefix_sums

    model = prefix_sums.PrefixSumsModel.explicit(8, 2, depth=2, key=jax.random.key(0))
    optimizer = optax.adamw(1e-3)
    state = optimizer.init(eqx.filter(model, eqx.is_array))
    bits, targets = prefix_sums.draw_batch(np.random.default_rng(0), 2, (4, 5))
    step = prefix_sums.make_step(optimizer)
    model, state, value, (right, *_) = step(model, state, bits, targets, jax.random.key(1))
    ```
    """

    update = train.reasoning_step(
        optimizer, lambda m, data, k: mixed_loss(m, data[0], data[1], k, extra=extra)
    )
    return lambda model, opt_state, bits, targets, key: update(
        model, opt_state, (bits, targets), key
    )


def score(
    model: PrefixSumsModel,
    bits: Int[ArrayLike, "batch n"],
    targets: Int[ArrayLike, "batch n"],
    *,
    budget: int | None = None,
    steps: int | None = None,
) -> dict[str, float]:
    """A batch of strings of one length: the share of strings with every bit right
    (`strings`), of bits right (`bits`), and for a DEQ solved to its fixed point (within
    `budget` steps) the mean solver steps and the share converged; with `steps`, the DEQ's step
    run that many times instead (the tied control: its `steps` is that count and `converged`
    NaN, not measured).

    **Example:**

    ```python
    import jax, numpy as np
    from eqattn import prefix_sums

    model = prefix_sums.PrefixSumsModel.deq(8, 2, key=jax.random.key(0))
    bits = prefix_sums.draw_bits(np.random.default_rng(0), 4, 6)
    out = prefix_sums.score(model, bits, prefix_sums.prefix_parity(bits))
    assert 0 <= out["strings"] <= out["bits"] <= 1 and out["converged"] == 1.0
    ```
    """
    bits = jnp.asarray(bits)
    out = train.reasoning_score(
        model.reasoner, bits, _chains(bits), targets, budget=budget, steps=steps
    )
    return {"strings": out.pop("instances"), "bits": out.pop("nodes"), **out}


def score_steps(
    model: PrefixSumsModel,
    bits: Int[ArrayLike, "batch n"],
    targets: Int[ArrayLike, "batch n"],
    *,
    counts: Sequence[int],
) -> list[dict[str, float]]:
    """A DEQ's step run with no stopping test, scored after each of `counts` steps (increasing,
    one run continued): per count, `score`'s fields, `steps` the count and `converged` the share
    of strings whose state passes the solver's relative test. The tied control, 4 x the budget
    with the stopping test off, and strings right against solver steps, from one run.

    **Example:**

    ```python
    import jax, numpy as np
    from eqattn import prefix_sums

    model = prefix_sums.PrefixSumsModel.deq(8, 2, key=jax.random.key(0))
    bits = prefix_sums.draw_bits(np.random.default_rng(0), 4, 6)
    targets = prefix_sums.prefix_parity(bits)
    early, late = prefix_sums.score_steps(model, bits, targets, counts=[2, 8])
    assert late["steps"] == 8 and late["strings"] <= late["bits"] <= 1
    ```
    """
    if not model.is_deq:
        raise TypeError("`score_steps` runs a DEQ's step; this model is explicit")
    bits = jnp.asarray(bits)
    out = train.reasoning_score_steps(model.reasoner, bits, _chains(bits), targets, counts=counts)
    return [{"strings": r.pop("instances"), "bits": r.pop("nodes"), **r} for r in out]


def path_independence(
    model: PrefixSumsModel,
    bits: Int[ArrayLike, "batch n"],
    *,
    key: PRNGKeyArray,
    budget: int | None = None,
    starts: int = 3,
) -> dict[str, float]:
    r"""Whether a DEQ's answer depends on where its solve starts: `starts` solves from random
    states ($\mathcal{N}(0, 1)$ per entry, as training starts) against the solve from zeros;
    `agree`: the lowest share over the starts of strings answered alike on every bit;
    `alignment`: the lowest over the starts of the mean cosine between the two fixed points,
    each string's flattened (the asymptotic alignment of Anil et al. 2022; 1: the same point).

    **Example:**

    ```python
    import jax, numpy as np
    from eqattn import prefix_sums

    model = prefix_sums.PrefixSumsModel.deq(8, 2, key=jax.random.key(0))
    bits = prefix_sums.draw_bits(np.random.default_rng(0), 4, 6)
    out = prefix_sums.path_independence(model, bits, key=jax.random.key(1))
    assert 0 <= out["agree"] <= 1 and -1 <= out["alignment"] <= 1
    ```
    """
    if not model.is_deq:
        raise TypeError("`path_independence` compares a DEQ's solves; this model is explicit")
    bits = jnp.asarray(bits)
    return train.reasoning_paths(
        model.reasoner, bits, _chains(bits), key=key, budget=budget, starts=starts
    )


def fit(
    model: PrefixSumsModel,
    *,
    steps: int,
    lengths: tuple[int, ...] = (8, 16, 24, 32),
    batch: int = 8,
    lr: float = 1e-3,
    clip: float = 1.0,
    seed: int = 0,
) -> tuple[PrefixSumsModel, list[float]]:
    """`steps` optimizer steps (AdamW at `lr` after clipping the gradient's global norm to
    `clip`), each on `batch` fresh strings of every one of `lengths` (`draw_batch`): the trained
    model and each step's loss. (`eqattn train --task prefix-sums` trains the same step with a
    warm-up and cosine schedule, checkpoints and evaluation:
    [`PrefixSumsTask`][eqattn.prefix_sums.PrefixSumsTask].)

    **Example:**

    ```python
    import jax
    from eqattn import prefix_sums

    model = prefix_sums.PrefixSumsModel.deq(8, 2, key=jax.random.key(0))
    model, losses = prefix_sums.fit(model, steps=2, lengths=(4,), batch=2)
    assert len(losses) == 2
    ```
    """
    return train.reasoning_fit(
        model,
        lambda optimizer: train.reasoning_step(
            optimizer, lambda m, d, k: mixed_loss(m, d[0], d[1], k)
        ),
        lambda rng: draw_batch(rng, batch, tuple(lengths)),
        steps=steps,
        lr=lr,
        clip=clip,
        seed=seed,
    )
