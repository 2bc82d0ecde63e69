"""The task protocol: what `Trainer` and `evaluate` need of a task (its data, model, loss,
evaluation and reports), so that one trainer runs every task and knows none of them."""

from __future__ import annotations

import abc
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import equinox as eqx
import numpy as np

from ._config import Config
from ._evaluation import budgets
from ._models import with_shape
from ._placement import Placement


class Headline(NamedTuple):
    """The metric scored after every epoch: its name in the metrics, its short name on the
    progress bar, its formats on the bar and in the per-epoch line, and whether higher is
    better (the best checkpoint keeps the best epoch's model).

    **Example:**

    ```python
    from eqattn import text

    headline = text.TextTask.headline
    assert headline.metric == "validation_bits_per_byte" and not headline.higher_is_better
    ```
    """

    metric: str
    short: str
    bar_format: str
    line_format: str
    higher_is_better: bool


Step = Callable[..., tuple]
"""`step(model, opt_state, *data, key, z0) -> (model, opt_state, loss, stats, z)`: one optimizer
step; `stats` = (the task's score, mean solver steps, mean relative residual, fraction
converged); `z` the batch's fixed points (for the warm start) or None."""


class AbstractTask(abc.ABC):
    """What [`Trainer`][eqattn.train.Trainer] and [`evaluate`][eqattn.train.evaluate] need of a
    task. A task is made from its configuration (`__init__` loads its data and checks what its
    data decides) and gives:

    - `build_model`: the DEQ or explicit model of a configuration;
    - `example_batch`, `batches`, `train_step`: the data and loss of an optimizer step;
    - `test_metrics`: the scores after each epoch (the `headline` among them) and at the end;
    - `record`, `header`: what metrics.json and the checkpoint record beyond the common fields;
    - `evaluate`, `summary`, `evaluation_report`: evaluation and the command's lines.

    Class attributes: `name`; `description` (the command's help); `config_type`, its
    configuration (a [`Config`][eqattn.train.Config]); `score`, the training step's statistic
    beside the loss, and `bar_name`, its name on the progress bar; `headline`; `processes`,
    whether it runs over several processes."""

    name: ClassVar[str]
    description: ClassVar[str]
    config_type: ClassVar[type[Config]]
    score: ClassVar[str]
    bar_name: ClassVar[str]
    headline: ClassVar[Headline]
    processes: ClassVar[bool] = False

    config: Config
    """The run's configuration."""
    batch: int
    """Examples per optimizer step."""
    steps_per_epoch: int
    examples: int
    """Training examples (each keeps its fixed point with a warm start)."""

    @abc.abstractmethod
    def __init__(self, config: Config):
        """Load the task's data and check what it decides of `config` (a `ConfigError` names
        the parameter)."""

    @property
    def label(self) -> str:
        """The run's name on the progress bar, after the model's."""
        return self.name

    @classmethod
    def run_folder(cls, settings: dict[str, Any]) -> str:
        """The command's default folder for a run under `runs/`, from the settings given (by
        name): the task's name."""
        return cls.name

    @property
    def warm_start(self) -> bool:
        """Whether each training example's solve starts from its previous fixed point."""
        return False

    @classmethod
    def with_shape(cls, config: Config) -> Config:
        """`config` with the explicit model's width and MLP ratio filled in (what a new run
        records, so that its checkpoint rebuilds the same model): by default the twin of `depth`
        blocks with the DEQ's parameters (`eqattn.train.with_shape`); a task with its own rule
        overrides it."""
        return with_shape(cls.build_model, config)

    @classmethod
    @abc.abstractmethod
    def build_model(
        cls, config: Config, key, *, width: int | None = None, mlp_ratio: float = 2.0, dtype=None
    ) -> eqx.Module:
        """The model of `config` (`width` and `mlp_ratio`: the explicit model's; `dtype` of the
        parameters, default JAX's default float)."""

    @abc.abstractmethod
    def example_batch(self) -> tuple:
        """One step's data arguments, to compile the step with."""

    @abc.abstractmethod
    def batches(
        self, rng: np.random.Generator, place: Placement | None
    ) -> Iterator[tuple[tuple, np.ndarray | None]]:
        """One epoch: per optimizer step, its data arguments and the indices of its training
        examples (for the warm start; None where the task has none)."""

    @classmethod
    @abc.abstractmethod
    def train_step(cls, config: Config, optimizer) -> Step:
        """The optimizer step of a run of `config` (see `Step`)."""

    @abc.abstractmethod
    def test_metrics(self, model: eqx.Module, final: bool) -> dict[str, Any]:
        """The scores after an epoch (the `headline` metric among them); `final`: the run is
        done (a costly test set is scored then only: Ctrl-C must end promptly)."""

    def header(self) -> dict[str, Any]:
        """What the checkpoint's header records beyond the configuration."""
        return {}

    @abc.abstractmethod
    def record(self, *, steps: int, train_time: float) -> dict[str, Any]:
        """What metrics.json records of the data and model, after `steps` optimizer steps in
        `train_time` seconds."""

    @classmethod
    def default_budgets(cls, config: Config) -> list[int] | None:
        """The solver budgets `eqattn evaluate` tries by default: 1, 2, 4, ... and twice the
        trained one (None: the task chooses per example size)."""
        return budgets(config.max_steps)

    @classmethod
    @abc.abstractmethod
    def evaluate(
        cls,
        model: eqx.Module,
        config: Config,
        header: dict[str, Any],
        budgets: list[int] | None,
        progress: bool | None,
    ) -> dict[str, Any]:
        """`eqattn evaluate`: the test scores at the trained solver budget and, for a DEQ,
        against `budgets` (see `budget_sweep`)."""

    @classmethod
    @abc.abstractmethod
    def summary(cls, metrics: dict[str, Any]) -> str:
        """The line `eqattn train` ends with, from the run's metrics."""

    @classmethod
    @abc.abstractmethod
    def evaluation_report(cls, result: dict[str, Any]) -> list[str]:
        """The lines `eqattn evaluate` prints, from `evaluate`'s result."""

    @classmethod
    def comparison(cls, runs: dict[str, Path]) -> list[str]:
        """The lines that set finished runs of this task side by side (`runs`: each model's run
        directory, the DEQ's and its explicit twin's): by default the headline metric and the
        parameters, from their metrics.json."""
        metric, fmt = cls.headline.metric, cls.headline.line_format
        cells = [
            f"{model} {m[metric]:{fmt}} ({m['params']:,} parameters)"
            for model, m in read_metrics(runs).items()
        ]
        return [f"{metric.replace('_', ' ')}: " + ", ".join(cells)]


def read_metrics(runs: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Each run's metrics.json."""
    return {
        model: json.loads((Path(run) / "metrics.json").read_text()) for model, run in runs.items()
    }


def run_line(metrics: dict[str, Any]) -> str:
    """The part of a task's summary that every task shares: epochs, time, parameters, memory
    and the DEQ's solves."""
    mem = metrics["step_temp_memory_mb"]
    steps = (
        f" | solver steps {metrics['test_mean_solver_steps']:.1f} (mean), "
        f"{metrics['test_converged']:.1%} converged"
        if metrics["config"]["model"] == "deq"
        else ""
    )
    epochs = metrics["epochs_done"]
    return (
        f"{epochs} epoch{'s' * (epochs != 1)} in {metrics['train_time_s']:.0f} s "
        f"(+{metrics['compile_time_s']:.0f} s compile"
        + (f", {rate:,.0f} tokens/s" if (rate := metrics.get("train_tokens_per_s")) else "")
        + f") | {metrics['params']:,} params"
        + ("" if mem is None else f" | train-step memory {mem:.1f} MB")
        + steps
    )
