"""The task protocol: what `Trainer` and `evaluate` need of a task (its data, model, loss,
evaluation and reports), so that one trainer runs every task and no code outside a task asks
which task it runs."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, NamedTuple

import equinox as eqx
import numpy as np

from ._config import ModelConfig, TrainConfig
from ._evaluation import budgets
from ._placement import Placement


class Headline(NamedTuple):
    """The metric scored after every epoch: its name in the metrics, its short name on the
    progress bar, its formats on the bar and in the per-epoch line, and whether higher is
    better (the best checkpoint keeps the best epoch's model).

    **Example:**

    ```python
    from eqattn import train

    headline = train.TextTask.headline
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
    """A task `eqattn train --task NAME` trains on. A task is made from the run's configuration
    (`__init__` loads its data and may fill data-derived fields of `model_config`) and gives:

    - `build_model`: the DEQ or explicit model of a configuration;
    - `example_batch`, `batches`, `train_step`: the data and loss of an optimizer step;
    - `test_metrics`: the scores after each epoch (the `headline` among them) and at the end;
    - `record`, `header`: what metrics.json and the checkpoint record beyond the common fields;
    - `evaluate`, `summary`, `evaluation_report`: `eqattn evaluate` and the command's lines.

    Class attributes: `name`; `description` (the command's help); `options`, the settings
    (`ModelConfig`/`TrainConfig` fields) that this task alone reads (the command refuses another
    task's); `defaults` and `deq_defaults`, its settings that differ from the dataclasses' (the
    DEQ's own in the second); `score`, the training step's statistic beside the loss, and
    `bar_name`, its name on the progress bar; `headline`; `warm_start` and `processes`, whether
    it keeps each training example's fixed point and runs over several processes;
    `language_model`, whether its models generate (`eqattn generate`)."""

    name: ClassVar[str]
    description: ClassVar[str]
    options: ClassVar[frozenset[str]] = frozenset()
    defaults: ClassVar[Mapping[str, Any]] = {}
    deq_defaults: ClassVar[Mapping[str, Any]] = {}
    explicit_defaults: ClassVar[Mapping[str, Any]] = {}
    score: ClassVar[str]
    bar_name: ClassVar[str]
    headline: ClassVar[Headline]
    warm_start: ClassVar[bool] = False
    processes: ClassVar[bool] = False
    language_model: ClassVar[bool] = False

    model_config: ModelConfig
    """The run's model configuration, with the fields its data sets filled in."""
    config: TrainConfig
    batch: int
    """Examples per optimizer step."""
    steps_per_epoch: int
    examples: int
    """Training examples (each keeps its fixed point with `warm_start`)."""

    @abc.abstractmethod
    def __init__(self, model_config: ModelConfig, config: TrainConfig):
        """Load the task's data and check the settings (a `ConfigError` names a bad one)."""

    @property
    def label(self) -> str:
        """The run's name on the progress bar, after the model's."""
        return self.name

    @classmethod
    def settings(cls, model: str) -> dict[str, Any]:
        """This task's defaults for `--model MODEL` that are not the dataclasses'."""
        own = cls.deq_defaults if model == "deq" else cls.explicit_defaults
        return {**cls.defaults, **own}

    @classmethod
    @abc.abstractmethod
    def build_model(
        cls,
        config: ModelConfig,
        key,
        *,
        width: int | None = None,
        mlp_ratio: float = 2.0,
        dtype=None,
    ) -> eqx.Module:
        """The model of `config` (`width` and `mlp_ratio`: the explicit model's, when given;
        `dtype` of the parameters, default JAX's default float)."""

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
    def train_step(cls, model_config: ModelConfig, config: TrainConfig, optimizer) -> Step:
        """The optimizer step of a run of these settings (see `Step`)."""

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
    def default_budgets(cls, config: ModelConfig) -> list[int] | None:
        """The solver budgets `eqattn evaluate` tries by default: 1, 2, 4, ... and twice the
        trained one (None: the task chooses per example size)."""
        return budgets(config.max_steps)

    @classmethod
    @abc.abstractmethod
    def evaluate(
        cls,
        model: eqx.Module,
        config: ModelConfig,
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


def run_line(metrics: dict[str, Any]) -> str:
    """The part of a task's summary that every task shares: epochs, time, parameters, memory
    and the DEQ's solves."""
    mem = metrics["step_temp_memory_mb"]
    steps = (
        f" | solver steps {metrics['test_mean_solver_steps']:.1f} (mean), "
        f"{metrics['test_converged']:.1%} converged"
        if metrics["model_config"]["model"] == "deq"
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
