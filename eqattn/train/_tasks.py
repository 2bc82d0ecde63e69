"""The tasks by name, and what is asked of a configuration's task: its model, the explicit
baseline's matched shape, the settings that apply to it."""

from __future__ import annotations

import dataclasses
from typing import Any

import equinox as eqx

from .._errors import ConfigError
from . import _models
from ._config import TASKS, ModelConfig
from ._digits import DigitsTask
from ._graphs import GraphTask
from ._task import AbstractTask
from ._text import TextTask

_TASKS: dict[str, type[AbstractTask]] = {t.name: t for t in (DigitsTask, TextTask, GraphTask)}
assert tuple(_TASKS) == TASKS, "ModelConfig's task names and the tasks disagree"


def task_of(name: str) -> type[AbstractTask]:
    """The task called `name` (`eqattn train --task NAME`).

    **Example:**

    ```python
    from eqattn import train

    assert train.task_of("text") is train.TextTask
    ```
    """
    try:
        return _TASKS[name]
    except KeyError:
        raise ConfigError(f"--task must be one of {', '.join(_TASKS)}; got {name!r}") from None


def tasks() -> dict[str, type[AbstractTask]]:
    """Every task, by name.

    **Example:**

    ```python
    from eqattn import train

    assert list(train.tasks()) == ["digits", "text", "graphs"]
    ```
    """
    return dict(_TASKS)


def build_model(
    config: ModelConfig, key, *, width: int | None = None, mlp_ratio: float = 2.0, dtype=None
) -> eqx.Module:
    """The model of `config`, built by its task (`dtype` of its parameters; default JAX's
    default float).

    **Example:**

    ```python
    import jax
    from eqattn import train

    model = train.build_model(train.ModelConfig(model="explicit"), jax.random.key(0))
    logits = model(jax.numpy.zeros((8, 8)), inference=True)  # a digit's 8 rows of 8 pixels
    assert logits.shape == (10,)
    ```
    """
    build = task_of(config.task).build_model
    return build(config, key, width=width, mlp_ratio=mlp_ratio, dtype=dtype)


def explicit_shape(config: ModelConfig) -> tuple[int, float]:
    """The explicit baseline's `(width, mlp_ratio)`: recorded, or matched to the DEQ's
    parameters (within 5%; else a `ConfigError` naming both counts).

    **Example:**

    ```python
    from eqattn import train

    config = train.ModelConfig(model="explicit")  # 4 blocks, the digits' DEQ's parameters
    width, mlp_ratio = train.explicit_shape(config)
    deq = train.count_params(train.ModelConfig())
    assert abs(train.count_params(config) - deq) <= 0.05 * deq
    ```
    """
    return _models.explicit_shape(task_of(config.task).build_model, config)


def count_params(config: ModelConfig) -> int:
    """The parameters of the configuration's model (counted from shapes: nothing is
    initialized).

    **Example:**

    ```python
    from eqattn import train

    assert train.count_params(train.ModelConfig()) == 39_182  # the default digits DEQ
    ```
    """
    return _models.count_params(task_of(config.task).build_model, config)


def with_shape(config: ModelConfig) -> ModelConfig:
    """`config` with the explicit model's width and MLP ratio filled in (what a new run records,
    so that its checkpoint rebuilds the same model whatever the matching rule becomes)."""
    if config.model != "explicit" or config.width is not None:
        return config
    width, mlp_ratio = explicit_shape(config)
    return dataclasses.replace(config, width=width, mlp_ratio=mlp_ratio)


def config_of(recorded: dict[str, Any]) -> ModelConfig:
    """The configuration a checkpoint's header records. An explicit model saved before its shape
    was recorded gets the shape it was built with (the matching rules of that time)."""
    config = ModelConfig.from_dict(recorded)
    if config.model == "explicit" and "width" not in recorded:
        build = task_of(config.task).build_model
        width, ratio = _models.explicit_shape(build, config, legacy=True)
        config = dataclasses.replace(config, width=width, mlp_ratio=ratio)
    return config


def foreign_options(name: str) -> frozenset[str]:
    """The settings that other tasks read and task `name` does not."""
    own = task_of(name).options
    return frozenset().union(*(t.options for t in _TASKS.values())) - own


def applicable(name: str, settings: dict[str, Any]) -> dict[str, Any]:
    """`settings` (a configuration as a dict) without the fields of other tasks: what a run's
    metrics record."""
    foreign = foreign_options(name)
    return {k: v for k, v in settings.items() if k not in foreign}
