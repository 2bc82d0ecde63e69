r"""Training the generic graph models ([`GenericGraphModel`][eqattn.graphs.GenericGraphModel]) as
the reasoning tasks train theirs (`eqattn.train.reasoning_loss`): for each batch a count
$p \sim U\{0, \dots, w\}$ and a start (zeros, or $\mathcal{N}(0, 1)$ per entry, each with
probability 1/2); the DEQ's step runs $p$ times from it with nothing differentiated, then $s$
times with gradient, and the loss is the graph task's (minus the log-probability of a node's
valid parents, over the real nodes) at the last state. The map learns to reach the answer from
anywhere on its way (Anil et al. 2022; Bansal et al. 2022). An explicit model's loss is that of
its output."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray

from ..train import ReasoningStats, Run, partial_solve, residual_from_zeros
from ._evaluation import parent_scores
from ._generic import GenericGraphModel


def _run(inputs) -> Run:
    """`train.Run` of a generic model over the batch `inputs`."""
    return lambda m, count, z0: jax.vmap(lambda x, z: m.unrolled(x, count, z0=z))(inputs, z0)  # noqa: E731


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
    if model.is_deq:
        anchors = jnp.asarray(inputs[1])
        scores, (count, residual, converged) = partial_solve(
            _run(inputs), model, key, anchors.shape, steps, warm
        )
    else:
        scores = jax.vmap(lambda x: model.predict(x).logits)(inputs)
        count, residual, converged = jnp.array(0.0), jnp.array(0.0), jnp.array(1.0)
    loss, right = parent_scores(scores, inputs, targets)
    real = jnp.asarray(targets[2]).astype(loss.dtype)
    nodes = jnp.sum(real)
    total = jnp.sum(loss * real) / nodes
    if penalty and model.is_deq:
        total = total + penalty * residual_from_zeros(_run(inputs), model, steps)
    return total, (jnp.sum(right * real) / nodes, count, residual, converged)
