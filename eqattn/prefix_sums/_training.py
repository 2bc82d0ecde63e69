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

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, ArrayLike, Int, PRNGKeyArray

from .._solve import tolerances
from ._data import draw_batch
from ._model import PrefixSumsModel

EXTRA_STEPS = 4
"""Steps with gradient beyond the string's length (information crosses one edge a step)."""


def _cross_entropy(logits, targets) -> Array:
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, targets))


Stats = tuple[Array, Array, Array, Array]
r"""A training loss's statistics: the share of strings with every bit right, and for a DEQ the
mean steps run, the mean relative residual of its last state ($\lVert f(z) - z\rVert /
\lVert f(z)\rVert$) and the share of strings whose state passes the solver's test (relative
tolerance only); an explicit model's are 0, 0 and 1."""


def _deq_logits(model: PrefixSumsModel, bits, key, extra: int):
    """The DEQ's logits after a random partial solve and `n + extra` steps (module docstring),
    and the statistics of its last states."""
    n = bits.shape[1]
    kp, kz, ks = jax.random.split(key, 3)
    warm = jax.random.randint(kp, (), 0, n + 1)
    scale = jax.random.bernoulli(ks).astype(model.encoder.weight.dtype)
    dim = model.encoder.weight.shape[0]
    z0 = scale * jax.random.normal(kz, (*bits.shape, dim), model.encoder.weight.dtype)
    params, static = eqx.partition(model, eqx.is_array)
    frozen = eqx.combine(jax.lax.stop_gradient(params), static)
    start = jax.vmap(lambda b, z: frozen.unrolled(b, warm, z0=z)[1])(bits, z0)
    logits, z = jax.vmap(lambda b, z: model.unrolled(b, n + extra, z0=z))(bits, start)
    fz = jax.vmap(lambda b, z: frozen.unrolled(b, 1, z0=z)[1])(bits, jax.lax.stop_gradient(z))
    norm = lambda a: jnp.linalg.norm(a.reshape(len(bits), -1), axis=1)  # noqa: E731
    residual = norm(fz - z) / jnp.maximum(norm(fz), jnp.finfo(fz.dtype).tiny)
    rtol = tolerances(model.core.solver)[0]  # type: ignore[union-attr]
    steps = (warm + n + extra).astype(residual.dtype)
    return logits, (steps, jnp.mean(residual), jnp.mean(residual <= rtol))


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
    bits, targets = jnp.asarray(bits), jnp.asarray(targets)
    if model.is_deq:
        logits, (steps, residual, converged) = _deq_logits(model, bits, key, extra)
    else:
        logits = jax.vmap(lambda b: model.predict(b).logits)(bits)
        steps, residual, converged = jnp.array(0.0), jnp.array(0.0), jnp.array(1.0)
    right = jnp.mean(jnp.all(jnp.argmax(logits, -1) == targets, -1))
    return _cross_entropy(logits, targets), (right, steps, residual, converged)


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
    mean = lambda *xs: jnp.mean(jnp.stack(xs))  # noqa: E731
    return mean(*(p[0] for p in parts)), jax.tree.map(mean, *(p[1] for p in parts))


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

    @eqx.filter_jit
    def step(model, opt_state, bits, targets, key):
        (value, stats), grads = eqx.filter_value_and_grad(
            lambda m: mixed_loss(m, bits, targets, key, extra=extra), has_aux=True
        )(model)
        updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state, value, stats

    return step


@eqx.filter_jit
def _solved(model: PrefixSumsModel, bits, budget):
    p = jax.vmap(lambda b: model.predict(b, budget=budget))(bits)
    return p.logits, jnp.mean(p.steps), jnp.mean(p.converged)


@eqx.filter_jit
def _tied(model: PrefixSumsModel, bits, steps: int):
    return jax.vmap(lambda b: model.unrolled(b, steps)[0])(bits)


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
    strings, answers = jnp.asarray(bits), jnp.asarray(targets)
    if steps is not None:
        logits, solver_steps, converged = _tied(model, strings, steps), steps, jnp.nan
    else:  # the budget traced: one program for every budget
        traced = None if budget is None else jnp.asarray(budget, jnp.int32)
        logits, solver_steps, converged = _solved(model, strings, traced)
    right = jnp.argmax(logits, -1) == answers
    return {
        "strings": float(jnp.mean(jnp.all(right, -1))),
        "bits": float(jnp.mean(right)),
        "steps": float(solver_steps),
        "converged": float(converged),
    }


@eqx.filter_jit
def _from(model: PrefixSumsModel, bits, budget, z0):
    p = jax.vmap(lambda b, z: model.predict(b, budget=budget, z0=z))(bits, z0)
    return jnp.argmax(p.logits, -1), p.fixed_point


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
    dtype = model.encoder.weight.dtype
    shape = (*bits.shape, model.encoder.weight.shape[0])
    answer, z = _from(model, bits, budget, jnp.zeros(shape, dtype))
    agree, align = [], []
    for k in jax.random.split(key, starts):
        other, z2 = _from(model, bits, budget, jax.random.normal(k, shape, dtype))
        agree.append(float(jnp.mean(jnp.all(other == answer, -1))))
        a, b = z.reshape(len(bits), -1), z2.reshape(len(bits), -1)
        norms = jnp.linalg.norm(a, axis=1) * jnp.linalg.norm(b, axis=1)
        align.append(float(jnp.mean(jnp.sum(a * b, 1) / jnp.maximum(norms, 1e-12))))
    return {"agree": min(agree), "alignment": min(align)}


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
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"`steps` must be an int >= 1; got {steps!r}")
    optimizer = optax.chain(optax.clip_by_global_norm(clip), optax.adamw(lr))
    opt_state = optimizer.init(eqx.filter(model, eqx.is_array))
    step, rng, key = make_step(optimizer), np.random.default_rng(seed), jax.random.key(seed)
    losses = []
    for _ in range(steps):
        bits, targets = draw_batch(rng, batch, tuple(lengths))
        key, sub = jax.random.split(key)
        model, opt_state, value, _ = step(model, opt_state, bits, targets, sub)
        losses.append(float(value))
    return model, losses
