"""`eqattn train --task graphs`: reachability and a BFS parent for every node of graphs drawn on
the fly (`eqattn.graphs`), trained on small graphs and tested on graphs up to 64 times larger,
where a DEQ's solve takes as many steps as the graph is deep."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import graphs
from .._errors import ConfigError
from ._config import ModelConfig, TrainConfig
from ._evaluation import progress_bar
from ._graph_data import draw, examples, node_scores
from ._graph_scores import distance_table, evaluate_sizes, summary_lines
from ._models import explicit_shape, predict
from ._step import apply
from ._task import AbstractTask, Headline, run_line

VALIDATION_GRAPHS = 192
"""Graphs of the training sizes scored after each epoch (a fixed set), and at the end (another)."""

# The task's defaults (measured in the graphs guide): the propagation block of width 16 solved
# by Picard iteration (a step moves what a node knows one edge) with the Jacobian-free gradient,
# 40 solver steps while training (2 x 16 + 8: the rule for the largest training graphs).
_DEFAULTS = {
    "dim": 16,
    "heads": 1,
    "epochs": 5,
    "epoch_steps": 200,
    "batch_size": 32,
    "lr": 1e-2,
    "weight_decay": 0.0,
    "label_smoothing": 0.0,
    "dropout": 0.0,
    "train_steps": 40,
    "max_steps": 4096,
}
_DEQ_DEFAULTS = {"solver": "picard", "adjoint": "jacobian-free", "rtol": 1e-4}
# The explicit model: 16 untied blocks, as many as the training graphs' longest distance (15)
# needs, so that it can solve its training distribution (at 4 it reaches 4 hops: 69% in
# distribution); its width is then 7 for equal parameters.
_EXPLICIT_DEFAULTS = {"depth": 16}


def make_train_step(model_config: ModelConfig, config: TrainConfig, optimizer):
    """The graphs' optimizer step (`Step`); `stats` = (share of nodes with both answers right,
    mean solver steps, mean relative residual, share converged)."""

    def loss_fn(model, inputs, targets):
        p = jax.vmap(lambda x: predict(model, x, config.train_steps))(inputs)
        loss, right_reach, right_parent = node_scores(p.logits, targets)
        real = targets[2].astype(loss.dtype)
        nodes = jnp.sum(real)
        accuracy = jnp.sum((right_reach & right_parent) * real) / nodes
        stats = (accuracy, p.steps.mean(), p.residual.mean(), p.converged.mean())
        return jnp.sum(loss * real) / nodes, stats

    def step(model, opt_state, inputs, targets, key, z0):
        del key, z0  # no dropout, no warm start
        (loss, stats), grads = eqx.filter_value_and_grad(loss_fn, has_aux=True)(
            model, inputs, targets
        )
        return *apply(optimizer, model, opt_state, grads), loss, stats, None

    return step


class GraphTask(AbstractTask):
    """Graphs of `graph_sizes` nodes from `families` (all of `eqattn.graphs.FAMILIES` by
    default), drawn afresh for every step; after each epoch a fixed set of graphs of the same
    sizes is scored (the validation score keeps `best.eqx`), at the end another, and graphs of
    64 nodes. `eqattn evaluate` scores every family at 16, 64 and 256 nodes (1024 for paths
    and grids) against the solver's budget, and by distance from the source.

    **Example:**

    ```python
    from eqattn import train

    model_config, config = train.configs("graphs", "deq")
    task = train.GraphTask(model_config, config)
    (features, adjacency), (reach, parents, real) = task.example_batch()
    assert adjacency.shape == (32, 16, 16) and features.shape == (32, 16, 17)
    ```
    """

    name = "graphs"
    description = "reachability and BFS parents on graphs, trained small and tested large"
    options = frozenset(("block", "graph_sizes", "families", "epoch_steps"))
    defaults = _DEFAULTS
    deq_defaults = _DEQ_DEFAULTS
    explicit_defaults = _EXPLICIT_DEFAULTS
    score = "train_accuracy"
    bar_name = "acc"
    headline = Headline("validation_accuracy", "val", ".3f", ".2%", higher_is_better=True)

    def __init__(self, model_config: ModelConfig, config: TrainConfig):
        refused = [
            ("--warm-start", config.warm_start),
            ("--corrections", config.corrections),
            ("--jacobian-weight", config.jacobian_weight),
        ]
        for option, value in refused:
            if value:
                raise ConfigError(f"{option} is not for --task graphs")
        if jax.process_count() > 1:
            raise ConfigError("--task graphs runs in one process")
        self.families = tuple(config.families or graphs.FAMILIES)
        unknown = set(self.families) - set(graphs.FAMILIES)
        if unknown:
            raise ConfigError(
                f"--families must be of {', '.join(graphs.FAMILIES)}; got {', '.join(unknown)}"
            )
        self.model_config, self.config = model_config, config
        self.batch, self.steps_per_epoch = config.batch_size, config.epoch_steps
        self.examples = self.batch * self.steps_per_epoch

        def fixed(seed, count, sizes):
            adjacency, source, real = draw(np.random.default_rng(seed), count, sizes, self.families)
            return examples(adjacency, source, real, np.random.default_rng(seed))

        self.validation = fixed(1, VALIDATION_GRAPHS, config.graph_sizes)
        self.test = fixed(2, VALIDATION_GRAPHS, config.graph_sizes)
        self.larger = fixed(3, 48, (64, 64))

    @classmethod
    def build_model(cls, config, key, *, width=None, mlp_ratio=2.0, dtype=None):
        settings = dict(vars(config))
        if config.model == "explicit":
            if width is None:
                width, mlp_ratio = explicit_shape(cls.build_model, config)
            settings.update(width=width, mlp_ratio=mlp_ratio)
        return graphs.model_from_settings(settings, key, dtype=dtype)

    def example_batch(self):
        rng = np.random.default_rng(0)
        adjacency, source, real = draw(rng, self.batch, self.config.graph_sizes, self.families)
        return examples(adjacency, source, real, rng)

    def batches(self, rng, place):
        for _ in range(self.steps_per_epoch):
            adjacency, source, real = draw(rng, self.batch, self.config.graph_sizes, self.families)
            yield examples(adjacency, source, real, rng), None

    @classmethod
    def train_step(cls, model_config, config, optimizer):
        return make_train_step(model_config, config, optimizer)

    def test_metrics(self, model, final):
        out = dict(validation_accuracy=_accuracy(model, *self.validation)["accuracy"])
        if final:
            test, larger = _accuracy(model, *self.test), _accuracy(model, *self.larger)
            out.update({f"test_{k}": v for k, v in test.items()})
            out["test_accuracy_at_64_nodes"] = larger["accuracy"]
        return out

    def record(self, *, steps, train_time):
        m = self.model_config
        shape: dict[str, Any] = {"block": m.block, "dim": m.dim}
        if m.model == "explicit":
            shape = {"block": m.block, "depth": m.depth, "width": m.width, "mlp_ratio": m.mlp_ratio}
        return dict(
            model_shape=shape,
            graph_sizes=list(self.config.graph_sizes),
            families=list(self.families),
            train_graphs=steps * self.batch,
            test_graphs=VALIDATION_GRAPHS,
        )

    @classmethod
    def default_budgets(cls, config: ModelConfig) -> list[int] | None:
        return None  # the rule's multiples at each size (`evaluate_sizes`)

    @classmethod
    def evaluate(cls, model, config, header, budgets, progress):
        with progress_bar(None, "evaluate", progress, "size") as bar:
            rows = evaluate_sizes(model, config, budgets, tick=bar.update)
        return {
            "model": config.model,
            "trained_epochs": header.get("epoch"),
            "budget_rule": "2 n + 8",
            "sizes": rows,
            "by_distance": distance_table(rows),
        }

    @classmethod
    def summary(cls, metrics):
        return (
            f"{metrics['model_config']['model']}: test accuracy {metrics['test_accuracy']:.2%} "
            f"(reachable {metrics['test_reach_accuracy']:.2%}, parent "
            f"{metrics['test_parent_accuracy']:.2%}; {metrics['test_graphs']} graphs of "
            f"{metrics['graph_sizes'][0]}-{metrics['graph_sizes'][1]} nodes; at 64 nodes "
            f"{metrics['test_accuracy_at_64_nodes']:.2%}) | {run_line(metrics)}"
        )

    @classmethod
    def evaluation_report(cls, result):
        return summary_lines(result)


def _accuracy(model, inputs, targets) -> dict[str, float]:
    """The shares of real nodes with reachability, the parent, and both right, and the solves'
    statistics, at the budget rule of the graphs' size."""
    n = targets[2].shape[1]
    p = _predict_batch(model, inputs, jnp.asarray(graphs.budget_for(n)))
    _, right_reach, right_parent = node_scores(p.logits, targets)
    real = np.asarray(targets[2])
    share = lambda x: float(np.sum(np.asarray(x) & real) / np.sum(real))  # noqa: E731
    return dict(
        accuracy=share(np.asarray(right_reach) & np.asarray(right_parent)),
        reach_accuracy=share(right_reach),
        parent_accuracy=share(right_parent),
        mean_solver_steps=float(np.mean(p.steps)),
        mean_relative_residual=float(np.mean(p.residual)),
        converged=float(np.mean(p.converged)),
    )


@eqx.filter_jit
def _predict_batch(model, inputs, budget):
    return jax.vmap(lambda x: predict(model, x, budget))(inputs)
