r"""Training the generic graph models ([`GenericGraphModel`][eqattn.graphs.GenericGraphModel]) as
the reasoning tasks train theirs (`eqattn.train.reasoning_loss`): for each batch a count
$p \sim U\{0, \dots, w\}$ and a start (zeros, or $\mathcal{N}(0, 1)$ per entry, each with
probability 1/2); the DEQ's step runs $p$ times from it with nothing differentiated, then $s$
times with gradient, and the loss is the graph task's (minus the log-probability of a node's
valid parents, over the real nodes) at the last state. The map learns to reach the answer from
anywhere on its way (Anil et al. 2022; Bansal et al. 2022). An explicit model's loss is that of
its output."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray

from .._solve import tolerances
from ..train import ReasoningStats
from ._evaluation import parent_scores
from ._generic import GenericGraphModel


def _scores(model: GenericGraphModel, inputs, key, steps: int, warm: int):
    """The batch's parent scores: a DEQ's after a random partial solve (module docstring),
    with the steps run, the mean relative residual of its last states and the share of them
    within the solver's relative tolerance (an explicit model's: 0, 0 and 1)."""
    if not model.is_deq:
        scores = jax.vmap(lambda x: model.predict(x).logits)(inputs)
        return scores, (jnp.array(0.0), jnp.array(0.0), jnp.array(1.0))
    kp, kz, ks = jax.random.split(key, 3)
    partial = jax.random.randint(kp, (), 0, warm + 1)
    anchors = jnp.asarray(inputs[1])
    dtype = model.encoder.weight.dtype
    scale = jax.random.bernoulli(ks).astype(dtype)
    z0 = scale * jax.random.normal(kz, (*anchors.shape, model.encoder.weight.shape[0]), dtype)
    params, static = eqx.partition(model, eqx.is_array)
    frozen = eqx.combine(jax.lax.stop_gradient(params), static)
    start = jax.vmap(lambda x, z: frozen.unrolled(x, partial, z0=z)[1])(inputs, z0)
    scores, z = jax.vmap(lambda x, z: model.unrolled(x, steps, z0=z))(inputs, start)
    fz = jax.vmap(lambda x, z: frozen.unrolled(x, 1, z0=z)[1])(inputs, jax.lax.stop_gradient(z))
    residual = _relative(fz, z)
    rtol = tolerances(model.core.solver)[0]  # type: ignore[union-attr]
    total = (partial + steps).astype(residual.dtype)
    return scores, (total, jnp.mean(residual), jnp.mean(residual <= rtol))


def _relative(fz: Array, z: Array) -> Array:
    """Per graph: the relative residual `||f(z) - z|| / ||f(z)||`."""
    norm = lambda a: jnp.linalg.norm(a.reshape(a.shape[0], -1), axis=1)  # noqa: E731
    return norm(fz - z) / jnp.maximum(norm(fz), jnp.finfo(fz.dtype).tiny)


def _residual_from_zeros(model: GenericGraphModel, inputs, steps: int) -> Array:
    """The mean relative residual of the DEQ's state after `steps` steps from zeros."""
    z = jax.vmap(lambda x: model.unrolled(x, steps)[1])(inputs)
    fz = jax.vmap(lambda x, z: model.unrolled(x, 1, z0=z)[1])(inputs, z)
    return jnp.mean(_relative(fz, z))


def generic_loss(
    model: GenericGraphModel,
    inputs,
    targets,
    key: PRNGKeyArray,
    *,
    steps: int,
    warm: int,
    penalty: float = 0.0,
) -> tuple[Array, ReasoningStats]:
    r"""The batch's mean loss over its real nodes and its statistics: the share of them whose
    chosen parent is valid, and for a DEQ the steps run, the mean relative residual of the last
    states and the share within the solver's tolerance (module docstring); `inputs, targets`
    as [`graphs.examples`][eqattn.graphs.examples] gives them, a batch of graphs padded to one
    size. With `penalty` $> 0$, a DEQ's loss adds
    `penalty` times the mean relative residual $\lVert f(z) - z\rVert / \lVert f(z)\rVert$
    of its state after `steps` steps from zeros, with gradient: a push toward a fixed point.

    **Example:**

    ```python
    import jax
    from eqattn import graphs

    model = graphs.GenericGraphModel.deq(8, 2, "bfs", key=jax.random.key(0))
    g = graphs.sample_weighted("delaunay", 8, 4, seed=0)
    inputs, targets = graphs.examples(g, model.algorithm)
    loss, (right, steps, residual, converged) = graphs.generic_loss(
        model, inputs, targets, jax.random.key(1), steps=4, warm=8
    )
    assert loss > 0 and 0 <= right <= 1 and 4 <= steps <= 12
    ```
    """
    scores, (count, residual, converged) = _scores(model, inputs, key, steps, warm)
    loss, right = parent_scores(scores, inputs, targets)
    real = jnp.asarray(targets[2]).astype(loss.dtype)
    nodes = jnp.sum(real)
    total = jnp.sum(loss * real) / nodes
    if penalty and model.is_deq:
        total = total + penalty * _residual_from_zeros(model, inputs, steps)
    return total, (jnp.sum(right * real) / nodes, count, residual, converged)
