"""What the reasoning tasks of `eqattn train` share (`eqattn.prefix_sums`, `eqattn.mazes`):
instances of several sizes drawn afresh for every optimizer step, a fixed validation set at the
largest training size, at the end a test set there and one of a larger size, and `eqattn
evaluate` per test size against the solver's budget. An instance counts only if every one of
its parts (a string's bits, a maze's cells) is right."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import equinox as eqx
import jax
import numpy as np

from .._errors import ConfigError
from ._api import load_model
from ._config import Config
from ._evaluation import budget_sweep, progress_bar
from ._step import apply
from ._task import AbstractTask, Headline


class ReasoningTask(AbstractTask):
    """A reasoning task (module docstring). A subclass names its instances (`unit`, the share of
    them right; `part`, the share of their parts right; `part_metric`, the latter's name in the
    metrics) and gives the hooks: `sizes` and `test_sizes` of a configuration, `draw` (a
    training batch), `held_out` (a fixed set), `score_set` (a set's scores at a budget, as
    `unit`, `part`, `steps`, `converged`), `budget_for`, `longer_size` and `loss`.

    **Example:**

    ```python
    from eqattn import mazes, prefix_sums, train

    assert issubclass(prefix_sums.PrefixSumsTask, train.ReasoningTask)
    assert mazes.MazesTask.unit == "mazes" and mazes.MazesTask.part == "cells"
    ```
    """

    unit: ClassVar[str]
    part: ClassVar[str]
    part_metric: ClassVar[str]
    count_setting: ClassVar[str]
    """The configuration's field: how many instances a held-out set holds."""
    budget_rule: ClassVar[str]
    """`budget_for` as the reports write it."""
    score = "train_accuracy"
    bar_name = "acc"
    headline = Headline("validation_accuracy", "val", ".3f", ".2%", higher_is_better=True)

    def __init__(self, config: Config):
        if jax.process_count() > 1:
            raise ConfigError(f"the {self.name} task runs in one process")
        self.config = config
        sizes = self.sizes(config)
        self.batch = config.batch_size * len(sizes)
        self.steps_per_epoch = self.epoch_steps(config)
        self.examples = self.batch * self.steps_per_epoch
        n = max(sizes)
        self.validation = self.held_out(config, 1, n)
        self.test = self.held_out(config, 2, n)
        self.longer = self.held_out(config, 3, self.longer_size(n))

    # the hooks
    @classmethod
    @abc.abstractmethod
    def sizes(cls, config) -> Sequence[int]:
        """The training instances' sizes."""

    @classmethod
    @abc.abstractmethod
    def test_sizes(cls, config) -> Sequence[int]:
        """`eqattn evaluate`'s sizes."""

    @classmethod
    def compared_sizes(cls, config) -> Sequence[int]:
        """The sizes of the side by side that `eqattn train` prints after training both models
        (`comparison`): the test sizes unless a task says otherwise."""
        return cls.test_sizes(config)

    @classmethod
    def epoch_steps(cls, config) -> int:
        """Optimizer steps an epoch: the configuration's `epoch_steps`."""
        return config.epoch_steps

    @staticmethod
    def model_shape(config) -> dict[str, Any]:
        """What metrics.json records of the model's shape: the DEQ's `dim` and `heads`, the
        explicit twin's `depth`, `width` and `mlp_ratio`."""
        if config.model == "explicit":
            return {"depth": config.depth, "width": config.width, "mlp_ratio": config.mlp_ratio}
        return {"dim": config.dim, "heads": config.heads}

    @classmethod
    @abc.abstractmethod
    def draw(cls, config, rng: np.random.Generator) -> tuple:
        """One optimizer step's data arguments: fresh instances of every training size."""

    @classmethod
    @abc.abstractmethod
    def held_out(cls, config, seed: int, size: int) -> Any:
        """A fixed set of instances of `size` (drawn from `seed`)."""

    @classmethod
    @abc.abstractmethod
    def score_set(cls, model, instances, budget: int | None) -> dict[str, float]:
        """`instances`' scores: the shares right (`unit`, `part`), a DEQ's mean `steps` and
        share `converged` within `budget` steps."""

    @classmethod
    @abc.abstractmethod
    def budget_for(cls, size: int) -> int:
        """The DEQ's solver budget on instances of `size`."""

    @classmethod
    @abc.abstractmethod
    def longer_size(cls, size: int) -> int:
        """The size of the final larger test set, from the largest training size."""

    @classmethod
    def sweep_budgets(cls, size: int) -> list[int]:
        """`eqattn evaluate`'s budgets at `size` by default: an eighth, a quarter, half and all
        of the budget rule."""
        rule = cls.budget_for(size)
        return [max(2, rule // 8), rule // 4, rule // 2, rule]

    @classmethod
    def count(cls, config) -> int:
        """Instances a held-out set holds."""
        return getattr(config, cls.count_setting)

    @classmethod
    @abc.abstractmethod
    def loss(cls, config, model, data: tuple, key) -> tuple:
        """An optimizer step's loss and statistics (`train.ReasoningStats`) on `data`."""

    # what the hooks give
    def example_batch(self):
        return self.draw(self.config, np.random.default_rng(0))

    def batches(self, rng, place):
        for _ in range(self.steps_per_epoch):
            yield self.draw(self.config, rng), None

    @classmethod
    def train_step(cls, config, optimizer):
        def step(model, opt_state, *data_key_z0):
            *data, key, z0 = data_key_z0
            del z0  # no warm start
            (loss, stats), grads = eqx.filter_value_and_grad(
                lambda m: cls.loss(config, m, tuple(data), key), has_aux=True
            )(model)
            return *apply(optimizer, model, opt_state, grads), loss, stats, None

        return step

    def _score(self, model, instances, size: int) -> dict[str, float]:
        return self.score_set(model, instances, self.budget_for(size))

    def test_metrics(self, model, final):
        n = max(self.sizes(self.config))
        out = dict(validation_accuracy=self._score(model, self.validation, n)[self.unit])
        if final:
            test = self._score(model, self.test, n)
            longer = self._score(model, self.longer, self.longer_size(n))
            out.update(
                test_accuracy=test[self.unit],
                **{self.part_metric: test[self.part]},
                test_mean_solver_steps=test["steps"],
                test_converged=test["converged"],
                test_accuracy_longer=longer[self.unit],
                test_converged_longer=longer["converged"],
            )
        return out

    @classmethod
    def default_budgets(cls, config) -> list[int] | None:
        return None  # per size (`evaluate_sizes`)

    @classmethod
    def evaluate_sizes(
        cls, model, config, budgets=None, *, tick=None, sweep: bool = True, sizes=None
    ) -> list[dict[str, Any]]:
        """One row per size of `sizes` (default the test sizes): its held-out set scored at the
        budget rule (`budget_for`), and for a DEQ, with `sweep`, against the solver budget
        (`budgets`, default `sweep_budgets`; stopped once every solve converged)."""
        rows = []
        for n in cls.test_sizes(config) if sizes is None else sizes:
            instances = cls.held_out(config, 10_000 + n, n)
            rule = cls.budget_for(n)
            row: dict[str, Any] = dict(n=n, budget_rule=rule)
            row[cls.unit] = cls.count(config)
            row["at_rule"] = cls.score_set(model, instances, rule)
            if model.is_deq and sweep:
                steps = budgets or cls.sweep_budgets(n)
                row["sweep"], _ = budget_sweep(
                    sorted(set(steps)), lambda b: cls.score_set(model, instances, b)
                )
            rows.append(row)
            if tick is not None:
                tick()
        return rows

    @classmethod
    def evaluate(cls, model, config, header, budgets, progress):
        sizes = cls.test_sizes(config)
        with progress_bar(len(sizes), "evaluate", progress, "size") as bar:
            rows = cls.evaluate_sizes(model, config, budgets, tick=bar.update)
        return {
            "model": config.model,
            "trained_epochs": header.get("epoch"),
            "trained_sizes": list(cls.sizes(config)),
            "budget_rule": cls.budget_rule,
            "sizes": rows,
        }

    @classmethod
    def comparison(cls, runs: dict[str, Path]) -> list[str]:
        """Each run's share right at every compared size (`compared_sizes`, at the budget rule),
        side by side."""
        scored, config = {}, None
        for model, run in runs.items():
            loaded = load_model(Path(run), cls)
            config = loaded.config
            sizes = cls.compared_sizes(config)
            rows = cls.evaluate_sizes(loaded.model, config, sweep=False, sizes=sizes)
            scored[model] = {r["n"]: r["at_rule"][cls.unit] for r in rows}
        assert config is not None
        lines = [cls.trained_on(config)]
        for n in cls.compared_sizes(config):
            cells = ", ".join(f"{m} {s[n]:.2%}" for m, s in scored.items())
            lines.append(f"{cls.size_label(n)}: {cells}")
        return lines

    @classmethod
    @abc.abstractmethod
    def trained_on(cls, config) -> str:
        """The comparison's first line: what the runs were trained on."""

    @classmethod
    @abc.abstractmethod
    def size_label(cls, n: int) -> str:
        """A size as the reports write it."""
