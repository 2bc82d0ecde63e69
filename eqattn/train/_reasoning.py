r"""Training and scoring an [`nn.GraphReasoner`][eqattn.nn.GraphReasoner] on a batch of graphs
of one size: what the reasoning tasks (`eqattn.prefix_sums`, `eqattn.mazes`) share.

The DEQ is trained by path independence from partly solved starts (Anil et al. 2022, with the
progressive start of Bansal et al. 2022): for each batch, a count $p \sim U\{0, \dots, w\}$ and
a start $z_0$ (zeros, or $\mathcal{N}(0, 1)$ per entry, each with probability 1/2) are drawn;
the step runs $p$ times from $z_0$ with nothing differentiated, then $s$ times with gradient
(a task's $w$: as many as information needs to cross its graphs; its $s$: a few more), and the loss
is the cross-entropy of the last state's logits. The map learns to reach the answer from
anywhere on its way, which makes the fixed point the answer at any size.

A batch is `inputs` `[b, n]` (node categories), `graphs` (an [`eqattn.Graph`][] whose arrays
have a leading batch axis `b`) and `targets` `[b, n]` (a class per node); an instance counts as
right only if every node is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, PRNGKeyArray

from .. import nn
from .._graph import Graph
from .._solve import tolerances


def batched(fn, graphs: Graph):
    """`fn(inputs, graph, *rest)` mapped over a batch: over `graphs`' leading axis, or, for one
    graph shared by the batch (`senders` `[E]`), with that graph held as it is (a constant
    when it holds numpy arrays: one gather pattern for the whole batch)."""
    if np.ndim(graphs.senders) == 1:
        return jax.vmap(lambda c, *rest: fn(c, graphs, *rest))
    return lambda c, *rest: jax.vmap(fn)(c, graphs, *rest)


ReasoningStats = tuple[Array, Array, Array, Array]
r"""A training loss's statistics: the share of instances with every node right, and for a DEQ
the mean steps run, the mean relative residual of its last state ($\lVert f(z) - z\rVert /
\lVert f(z)\rVert$) and the share of instances whose state passes the solver's test (relative
tolerance only); an explicit model's are 0, 0 and 1."""


Run = Callable[[Any, Any, Any], tuple[Any, Array]]
"""`run(model, count, z0)`: the batch's output and state after `count` of `model`'s steps from
`z0` (`[b, ...]` states, or `None`: zeros), as `(out, z)`."""


def relative_residual(fz: Array, z: Array) -> Array:
    r"""Per instance (leading axis): $\lVert f(z) - z\rVert / \lVert f(z)\rVert$."""
    norm = lambda a: jnp.linalg.norm(a.reshape(a.shape[0], -1), axis=1)  # noqa: E731
    return norm(fz - z) / jnp.maximum(norm(fz), jnp.finfo(fz.dtype).tiny)


def partial_solve(
    run: Run, model, key: PRNGKeyArray, shape: tuple[int, ...], steps: int, warm: int
):
    """A DEQ's output after a random partial solve of at most `warm` steps (no gradient) and
    `steps` steps with gradient (module docstring), from a start of `shape` plus the state's
    width; with the statistics of its last states (`ReasoningStats` less the share right).
    `model` has an `encoder` (a linear map to the state) and a `core` with a `solver`."""
    kp, kz, ks = jax.random.split(key, 3)
    partial = jax.random.randint(kp, (), 0, warm + 1)
    dtype = model.encoder.weight.dtype
    scale = jax.random.bernoulli(ks).astype(dtype)
    z0 = scale * jax.random.normal(kz, (*shape, model.encoder.weight.shape[0]), dtype)
    params, static = eqx.partition(model, eqx.is_array)
    frozen = eqx.combine(jax.lax.stop_gradient(params), static)
    start = run(frozen, partial, z0)[1]
    out, z = run(model, steps, start)
    residual = relative_residual(run(frozen, 1, jax.lax.stop_gradient(z))[1], z)
    rtol = tolerances(model.core.solver)[0]
    total = (partial + steps).astype(residual.dtype)
    return out, (total, jnp.mean(residual), jnp.mean(residual <= rtol))


def residual_from_zeros(run: Run, model, steps: int) -> Array:
    """The mean relative residual of a DEQ's state after `steps` steps from zeros, with
    gradient (the residual penalty)."""
    z = run(model, steps, None)[1]
    return jnp.mean(relative_residual(run(model, 1, z)[1], z))


def _runner(inputs, graphs: Graph) -> Run:
    """`Run` of a reasoner over the batch `inputs, graphs`."""
    return lambda m, count, z0: batched(  # noqa: E731
        lambda c, g, z: m.unrolled(c, g, count, z0=z), graphs
    )(inputs, z0)


def reasoning_loss(
    model: nn.GraphReasoner,
    inputs,
    graphs: Graph,
    targets,
    key: PRNGKeyArray,
    *,
    steps: int,
    warm: int,
    penalty: float = 0.0,
) -> tuple[Array, ReasoningStats]:
    r"""The batch's mean cross-entropy and its `Stats`: a DEQ's after a random partial solve of
    at most `warm` steps and `steps` steps with gradient (module docstring), an explicit
    model's of its output. With `penalty` $> 0$, a DEQ's loss adds `penalty` times the mean
    relative residual $\lVert f(z) - z\rVert / \lVert f(z)\rVert$ of the state $z$ after
    `steps` steps from zeros, with gradient: a push toward a fixed point."""
    inputs, targets = jnp.asarray(inputs), jnp.asarray(targets)
    if model.is_deq:
        run = _runner(inputs, graphs)
        logits, (count, residual, converged) = partial_solve(
            run, model, key, inputs.shape, steps, warm
        )
    else:
        logits = batched(lambda c, g: model.predict(c, g).logits, graphs)(inputs)
        count, residual, converged = jnp.array(0.0), jnp.array(0.0), jnp.array(1.0)
    right = jnp.mean(jnp.all(jnp.argmax(logits, -1) == targets, -1))
    loss = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, targets))
    if penalty and model.is_deq:
        loss = loss + penalty * residual_from_zeros(_runner(inputs, graphs), model, steps)
    return loss, (right, count, residual, converged)


@eqx.filter_jit
def _solved(model: nn.GraphReasoner, inputs, graphs, budget):
    p = batched(lambda c, g: model.predict(c, g, budget=budget), graphs)(inputs)
    return p.logits, jnp.mean(p.steps), jnp.mean(p.converged)


@eqx.filter_jit
def _tied(model: nn.GraphReasoner, inputs, graphs, steps: int):
    return batched(lambda c, g: model.unrolled(c, g, steps)[0], graphs)(inputs)


def reasoning_score(
    model: nn.GraphReasoner,
    inputs,
    graphs: Graph,
    targets,
    *,
    budget: int | None = None,
    steps: int | None = None,
) -> dict[str, float]:
    """A batch of graphs of one size: the share with every node right (`instances`), of nodes
    right (`nodes`), and for a DEQ solved to its fixed point (within `budget` steps, traced:
    one program for every budget) the mean solver steps and the share converged; with `steps`,
    the DEQ's step run that many times instead (the tied control: its `steps` is that count and
    `converged` NaN, not measured)."""
    inputs, answers = jnp.asarray(inputs), jnp.asarray(targets)
    if steps is not None:
        logits, count, converged = _tied(model, inputs, graphs, steps), steps, jnp.nan
    else:
        traced = None if budget is None else jnp.asarray(budget, jnp.int32)
        logits, count, converged = _solved(model, inputs, graphs, traced)
    right = jnp.argmax(logits, -1) == answers
    return {
        "instances": float(jnp.mean(jnp.all(right, -1))),
        "nodes": float(jnp.mean(right)),
        "steps": float(count),
        "converged": float(converged),
    }


@eqx.filter_jit
def _continued(model: nn.GraphReasoner, inputs, graphs, steps, z):
    return batched(lambda c, g, z: model.unrolled(c, g, steps, z0=z), graphs)(inputs, z)


def reasoning_score_steps(
    model: nn.GraphReasoner, inputs, graphs: Graph, targets, *, counts: Sequence[int]
) -> list[dict[str, float]]:
    r"""A DEQ's step iterated from zeros with no stopping test, scored after each of `counts`
    steps (increasing; one run continued: `max(counts)` steps in all, one program): per count,
    the scores of `reasoning_score` (`steps`: the count) with `converged` the share of
    instances whose state passes the solver's relative test, $\lVert f(z) - z\rVert \le
    \text{rtol} \lVert f(z)\rVert$. The tied control, the solve with the stopping test off and
    accuracy against solver steps, all from one run."""
    counts = [int(c) for c in counts]
    if not counts or counts[0] < 0 or any(b <= a for a, b in zip(counts, counts[1:])):
        raise ValueError(f"`counts` must be increasing ints >= 0; got {counts}")
    if not isinstance(model.core, nn.ImplicitGraphTransformer):
        raise TypeError("`reasoning_score_steps` iterates a DEQ's step; this model is explicit")
    inputs, answers = jnp.asarray(inputs), jnp.asarray(targets)
    dtype = model.encoder.weight.dtype
    z = jnp.zeros((*inputs.shape, model.encoder.weight.shape[0]), dtype)
    rtol, done, out = tolerances(model.core.solver)[0], 0, []
    for count in counts:
        logits, z = _continued(model, inputs, graphs, jnp.asarray(count - done, jnp.int32), z)
        done = count
        fz = _continued(model, inputs, graphs, jnp.asarray(1, jnp.int32), z)[1]
        right = jnp.argmax(logits, -1) == answers
        out.append({
            "instances": float(jnp.mean(jnp.all(right, -1))),
            "nodes": float(jnp.mean(right)),
            "steps": float(count),
            "converged": float(jnp.mean(relative_residual(fz, z) <= rtol)),
        })  # fmt: skip
    return out


@eqx.filter_jit
def _from(model: nn.GraphReasoner, inputs, graphs, budget, z0):
    p = batched(lambda c, g, z: model.predict(c, g, budget=budget, z0=z), graphs)(inputs, z0)
    return jnp.argmax(p.logits, -1), p.fixed_point


def reasoning_paths(
    model: nn.GraphReasoner,
    inputs,
    graphs: Graph,
    *,
    key: PRNGKeyArray,
    budget: int | None = None,
    starts: int = 3,
) -> dict[str, float]:
    r"""Whether a DEQ's answer depends on where its solve starts: `starts` solves from random
    states ($\mathcal{N}(0, 1)$ per entry, as training starts) against the solve from zeros;
    `agree`: the lowest share over the starts of instances answered alike on every node;
    `alignment`: the lowest over the starts of the mean cosine between the two fixed points,
    each instance's flattened (the asymptotic alignment of Anil et al. 2022; 1: the same
    point)."""
    if not model.is_deq:
        raise TypeError("path independence compares a DEQ's solves; this model is explicit")
    inputs = jnp.asarray(inputs)
    dtype = model.encoder.weight.dtype
    shape = (*inputs.shape, model.encoder.weight.shape[0])
    answer, z = _from(model, inputs, graphs, budget, jnp.zeros(shape, dtype))
    agree, align = [], []
    for k in jax.random.split(key, starts):
        other, z2 = _from(model, inputs, graphs, budget, jax.random.normal(k, shape, dtype))
        agree.append(float(jnp.mean(jnp.all(other == answer, -1))))
        a, b = z.reshape(len(inputs), -1), z2.reshape(len(inputs), -1)
        norms = jnp.linalg.norm(a, axis=1) * jnp.linalg.norm(b, axis=1)
        align.append(float(jnp.mean(jnp.sum(a * b, 1) / jnp.maximum(norms, 1e-12))))
    return {"agree": min(agree), "alignment": min(align)}


def mean_parts(parts) -> tuple[Array, ReasoningStats]:
    """The mean of several `(loss, Stats)` (a step's batches of several sizes, each weighing
    alike)."""
    mean = lambda *xs: jnp.mean(jnp.stack(xs))  # noqa: E731
    return mean(*(p[0] for p in parts)), jax.tree.map(mean, *(p[1] for p in parts))


def reasoning_step(optimizer: optax.GradientTransformation, loss: Callable) -> Callable:
    """`step(model, opt_state, data, key) -> (model, opt_state, loss, stats)`, compiled: one
    optimizer step on `loss(model, data, key) -> (loss, Stats)`."""

    @eqx.filter_jit
    def step(model, opt_state, data, key):
        (value, stats), grads = eqx.filter_value_and_grad(
            lambda m: loss(m, data, key), has_aux=True
        )(model)
        updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state, value, stats

    return step


def reasoning_fit(
    model, step: Callable, draw: Callable, *, steps: int, lr: float, clip: float, seed: int
) -> tuple[Any, list[float]]:
    """`steps` optimizer steps (AdamW at `lr` after clipping the gradient's global norm to
    `clip`) of `step(optimizer) -> reasoning_step` on `draw(rng)`, fresh data each: the
    trained model and each step's loss."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"`steps` must be an int >= 1; got {steps!r}")
    optimizer = optax.chain(optax.clip_by_global_norm(clip), optax.adamw(lr))
    opt_state = optimizer.init(eqx.filter(model, eqx.is_array))
    update, rng, key = step(optimizer), np.random.default_rng(seed), jax.random.key(seed)
    losses = []
    for _ in range(steps):
        data = draw(rng)
        key, sub = jax.random.split(key)
        model, opt_state, value, _ = update(model, opt_state, data, sub)
        losses.append(float(value))
    return model, losses
