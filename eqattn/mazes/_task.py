"""The mazes task of `eqattn train`: the DEQ or its explicit twin trained on small mazes
(`mixed_loss`), scored on larger ones, where a DEQ's solve runs until its fixed point."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import equinox as eqx
import jax
import numpy as np

from .. import nn, train
from ..train import ConfigError, ReasoningTask, run_line
from ._config import MazesConfig
from ._data import draw_mazes
from ._model import budget_for, deq, explicit
from ._training import mixed_loss, score


def longer_size(size: int) -> int:
    """The final larger test's mazes after training on mazes of at most `size` cells a side:
    `2 size + 3` (about five times the cells).

    **Example:**

    ```python
    from eqattn import mazes

    assert mazes.longer_size(9) == 21
    ```
    """
    return 2 * size + 3


def _shaped(config: MazesConfig) -> MazesConfig:
    """`config` with the explicit twin's `width` and `mlp_ratio` filled in when not given
    ([`nn.GraphReasoner.matched`][eqattn.nn.GraphReasoner.matched]'s shape)."""
    if config.model != "explicit" or config.width is not None:
        return config
    model = eqx.filter_eval_shape(lambda: deq(config.dim, config.heads, key=jax.random.key(0)))
    assert config.depth is not None  # resolved by the configuration
    try:
        dim, _, hidden = model.twin_shape(config.depth)
    except ValueError as error:  # no twin of the DEQ's parameters at this depth
        raise ConfigError(str(error)) from None
    return dataclasses.replace(config, width=dim, mlp_ratio=hidden / dim)


def _build(config: MazesConfig, key, dtype=None) -> nn.GraphReasoner:
    if config.model == "deq":
        solver, adjoint = config.deq_solver(), config.deq_adjoint()
        return deq(config.dim, config.heads, key=key, solver=solver, adjoint=adjoint, dtype=dtype)
    config = _shaped(config)
    assert config.width is not None and config.mlp_ratio is not None and config.depth
    hidden = max(1, round(config.mlp_ratio * config.width))
    heads = nn.GraphReasoner.twin_heads(config.width, config.heads)
    return explicit(config.width, heads, depth=config.depth, key=key, hidden=hidden, dtype=dtype)


class MazesTask(ReasoningTask):
    """Mazes of `sizes` cells a side drawn afresh for every step; after each epoch a fixed set
    of mazes of the largest training size is scored (the validation score keeps `best.eqx`),
    at the end another, and mazes of [`longer_size`][eqattn.mazes.longer_size]. `evaluate`
    scores `test_sizes` (9 to 59 cells a side by default) against the solver's budget. A maze
    counts only if every cell is right.

    **Example:**

    ```python
    from eqattn import mazes

    task = mazes.MazesTask(mazes.MazesConfig(sizes=(3, 4), test_mazes=2))
    (batches,) = task.example_batch()
    assert [b.inputs.shape for b in batches] == [(8, 9), (8, 16)] and task.batch == 16
    ```
    """

    name = "mazes"
    description = "the path through a maze, trained on small mazes and tested on large"
    config_type = MazesConfig
    unit, part, part_metric = "mazes", "cells", "test_cell_accuracy"
    count_setting = "test_mazes"
    budget_rule = "4 k^2 + 100"
    config: MazesConfig

    @classmethod
    def sizes(cls, config):
        return config.sizes

    @classmethod
    def test_sizes(cls, config):
        return config.test_sizes

    @classmethod
    def compared_sizes(cls, config):
        return config.compare_sizes

    @classmethod
    def draw(cls, config, rng):
        return ([draw_mazes(rng, config.batch_size, k) for k in config.sizes],)

    @classmethod
    def held_out(cls, config, seed, size):
        return draw_mazes(np.random.default_rng(seed), config.test_mazes, size)

    @classmethod
    def score_set(cls, model, instances, budget):
        return score(model, instances, budget=budget)

    @classmethod
    def budget_for(cls, size):
        return budget_for(size)

    @classmethod
    def longer_size(cls, size):
        return longer_size(size)

    @classmethod
    def loss(cls, config, model, data, key):
        (batches,) = data
        return mixed_loss(
            model, batches, key, warm=config.warm, penalty=config.penalty, extra=config.train_steps
        )

    @classmethod
    def with_shape(cls, config):
        """The twin's shape by [`nn.GraphReasoner.matched`][eqattn.nn.GraphReasoner.matched]'s
        rule."""
        return _shaped(config)

    @classmethod
    def build_model(cls, config, key, *, dtype=None):
        """An [`nn.GraphReasoner`][eqattn.nn.GraphReasoner]: the DEQ, or its twin."""
        return _build(config, key, dtype)

    def record(self, *, steps, train_time):
        m = self.config
        return dict(
            model_shape=self.model_shape(m),
            sizes=list(m.sizes),
            longer_size=longer_size(max(m.sizes)),
            train_mazes=steps * self.batch,
            test_mazes=m.test_mazes,
        )

    @classmethod
    def summary(cls, metrics):
        low, high = min(metrics["sizes"]), max(metrics["sizes"])
        k = metrics["longer_size"]
        return (
            f"{metrics['config']['model']}: mazes solved {metrics['test_accuracy']:.2%} at "
            f"{high} x {high} ({metrics['test_mazes']} mazes; trained on {low}-{high} cells a "
            f"side), {metrics['test_accuracy_longer']:.2%} at {k} x {k} | {run_line(metrics)}"
        )

    @classmethod
    def evaluation_report(cls, result):
        deq_run = result["model"] == "deq"
        low, high = min(result["trained_sizes"]), max(result["trained_sizes"])
        lines = [
            f"mazes ({result['model']} model, trained on {low}-{high} cells a side): mazes with "
            "every cell right"
            + (f", at the solver budget rule {result['budget_rule']}" if deq_run else ""),
            "   size    mazes  budget  steps  converged   mazes solved  cells right",
        ]
        for r in result["sizes"]:
            a = r["at_rule"]
            solve = (
                train.solve_cells(r["budget_rule"], a["steps"], a["converged"])
                if deq_run
                else train.solve_cells(None, None, None)
            )
            size = f"{r['n']} x {r['n']}"
            lines.append(
                f"{size:>7} {r['mazes']:>8} {solve} {a['mazes']:>14.2%} {a['cells']:>12.2%}"
            )
            if deq_run and len(r["sweep"]) > 1:
                cells = [f"{s['max_steps']}: {s['mazes']:.1%}" for s in r["sweep"]]
                lines.append("    against the budget: " + ", ".join(cells))
        return lines

    @classmethod
    def trained_on(cls, config):
        low, high = min(config.sizes), max(config.sizes)
        return f"trained on mazes of {low}-{high} cells a side; mazes with every cell right:"

    @classmethod
    def size_label(cls, n):
        return f"{n:>3} x {n:<3}"


def load_model(run: str | os.PathLike, *, max_steps: int | None = None) -> eqx.Module:
    """The model of a mazes run (its directory, or a checkpoint file: the run's `best.eqx` is
    its best validated model), its DEQ's step limit raised to `max_steps` if given.

    **Example:**

    ```python
    from eqattn import mazes, train

    try:
        mazes.load_model("no/such/run")
    except train.RunError as error:
        assert str(error).startswith("checkpoint not found")
    ```
    """
    return train.load_model(Path(run), MazesTask, max_steps).model
