"""`eqattn train --task generic-graphs`: the generic graph models
([`GenericGraphModel`][eqattn.graphs.GenericGraphModel]) learning an algorithm of the graph task
from its parents alone, on the graph task's data, scores and evaluation."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import equinox as eqx
import jax

from .. import nn, train
from ..train import Config, ConfigError, apply, at_least, non_negative, setting
from ._config import GraphConfig
from ._generic import GenericGraphModel
from ._generic_training import generic_loss
from ._task import GraphTask


@dataclasses.dataclass(frozen=True, kw_only=True)
class GenericGraphConfig(GraphConfig):
    """A run of the generic graph model: the DEQ
    ([`GenericGraphModel.deq`][eqattn.graphs.GenericGraphModel.deq], `dim` channels, `heads`
    heads, Picard iteration to the relative residual `rtol`) or its explicit twin of `depth`
    untied steps with the DEQ's parameters
    ([`GenericGraphModel.matched`][eqattn.graphs.GenericGraphModel.matched]; a `width` and
    `mlp_ratio` given instead set its shape), learning `algorithm` on the graph task's data
    ([`GraphConfig`][eqattn.graphs.GraphConfig]: graphs of `graph_sizes` nodes from
    `families`) by [`generic_loss`][eqattn.graphs.generic_loss]: the DEQ from a random
    partial solve of at most `warm` steps, then `depth` steps with gradient, plus `penalty`
    times the relative residual.

    **Example:**

    ```python
    from eqattn import graphs

    config = graphs.GenericGraphConfig(algorithm="shortest-paths")
    assert (config.dim, config.heads, config.depth, config.rtol) == (32, 4, 16, 1e-4)
    ```
    """

    dim: int = 32
    depth: int = setting(
        16, "explicit: untied steps; DEQ: steps with gradient after the partial solve"
    )
    adjoint: str = "implicit"
    rtol: float = 1e-4
    epochs: int = 8
    lr: float = 1e-3
    weight_decay: float = 1e-4
    epoch_steps: int = setting(250, "optimizer steps per epoch (each ends with validation)")
    heads: int = setting(
        4, "attention heads (the DEQ's; the twin's: the most that divide its width)"
    )
    warm: int = setting(16, "DEQ: the partial solve's most steps (without gradient)")
    penalty: float = setting(1.0, "DEQ: the weight of the relative residual in the loss")

    def __post_init__(self):
        super().__post_init__()
        at_least(self, ("heads",), 1)
        at_least(self, ("warm",), 0)
        non_negative(self, ("penalty",))
        if self.dim % self.heads:
            raise ConfigError(f"`dim` ({self.dim}) must be divisible by `heads` ({self.heads})")

    @property
    def default_width(self) -> int | None:
        """None: the twin's shape gives it the DEQ's parameters."""
        return None

    def deq_solver(self):
        """Picard iteration (by `solver`'s name) to the relative residual `rtol` of the whole
        state within `max_steps`."""
        return Config.deq_solver(self)


def _deq(config: GenericGraphConfig, key, dtype=None) -> GenericGraphModel:
    solver, adjoint = config.deq_solver(), config.deq_adjoint()
    return GenericGraphModel.deq(
        config.dim, config.heads, config.algorithm, key=key, solver=solver, adjoint=adjoint,
        dtype=dtype,
    )  # fmt: skip


def _shaped(config: GenericGraphConfig) -> GenericGraphConfig:
    """`config` with the twin's `width` and `mlp_ratio` filled in when not given."""
    if config.model != "explicit" or config.width is not None:
        return config
    model = eqx.filter_eval_shape(lambda: _deq(config, jax.random.key(0)))
    try:
        dim, _, hidden = model.twin_shape(config.depth)
    except ValueError as error:  # no twin of the DEQ's parameters at this depth
        raise ConfigError(str(error)) from None
    return dataclasses.replace(config, width=dim, mlp_ratio=hidden / dim)


class GenericGraphTask(GraphTask):
    """The graph task ([`GraphTask`][eqattn.graphs.GraphTask]: its data, validation, test at
    the training sizes and at 64 nodes, `eqattn evaluate`'s sizes and budgets) learned by the
    generic graph models; runs go to `runs/generic-graphs/ALGORITHM`.

    **Example:**

    ```python
    import jax
    from eqattn import graphs

    config = graphs.GenericGraphConfig(dim=8, heads=2, model="explicit", depth=4)
    twin = graphs.GenericGraphTask.build_model(config, jax.random.key(0))
    assert len(twin.core.steps) == 4 and not twin.is_deq
    ```
    """

    name = "generic-graphs"
    description = (
        "the generic graph transformer learning BFS, shortest paths or spanning trees from the "
        "parents alone"
    )
    config_type = GenericGraphConfig  # type: ignore[assignment]  # (its own settings)
    config: GenericGraphConfig

    @classmethod
    def with_shape(cls, config):
        """The twin's shape by
        [`GenericGraphModel.twin_shape`][eqattn.graphs.GenericGraphModel.twin_shape]'s rule."""
        return _shaped(config)

    @classmethod
    def build_model(cls, config, key, *, dtype=None):
        """A [`GenericGraphModel`][eqattn.graphs.GenericGraphModel]: the DEQ, or its twin."""
        if config.model == "deq":
            return _deq(config, key, dtype)
        config = _shaped(config)
        hidden = max(1, round(config.mlp_ratio * config.width))
        heads = nn.GraphReasoner.twin_heads(config.width, config.heads)
        return GenericGraphModel.explicit(
            config.width, heads, config.algorithm, depth=config.depth, key=key, hidden=hidden,
            dtype=dtype,
        )  # fmt: skip

    @classmethod
    def run_folder(cls, settings):
        """`generic-graphs/ALGORITHM`."""
        return f"generic-graphs/{settings.get('algorithm', GenericGraphConfig.algorithm)}"

    @classmethod
    def train_step(cls, config, optimizer):
        """One optimizer step on [`generic_loss`][eqattn.graphs.generic_loss]."""

        def step(model, opt_state, inputs, targets, key, z0):
            del z0  # no warm start
            (loss, stats), grads = eqx.filter_value_and_grad(
                lambda m: generic_loss(
                    m,
                    inputs,
                    targets,
                    key,
                    steps=config.depth,
                    warm=config.warm,
                    penalty=config.penalty,
                ),  # fmt: skip
                has_aux=True,
            )(model)
            return *apply(optimizer, model, opt_state, grads), loss, stats, None

        return step

    def record(self, *, steps, train_time):
        m = self.config
        shape: dict[str, Any] = {"dim": m.dim, "heads": m.heads}
        if m.model == "explicit":
            shape = {"depth": m.depth, "width": m.width, "mlp_ratio": m.mlp_ratio}
        return {**super().record(steps=steps, train_time=train_time), "model_shape": shape}


def load_model(run: str | os.PathLike, *, max_steps: int | None = None) -> eqx.Module:
    """The model of a graphs run, of `eqattn train --task graphs` or `--task generic-graphs`
    (its directory, or a checkpoint file: the run's `best.eqx` is its best validated model),
    for [`predict`][eqattn.graphs.predict]; its DEQ's step limit raised to `max_steps` if given
    ([`eqattn.train.load_model`][] gives the configuration and header too).

    **Example:**

    ```python
    from eqattn import graphs

    try:
        graphs.load_model("no/such/run")
    except graphs.RunError as error:
        assert str(error).startswith("checkpoint not found")
    ```
    """
    _, header = train.read_header(run)
    task = GenericGraphTask if header.get("task") == GenericGraphTask.name else GraphTask
    return train.load_model(Path(run), task, max_steps).model
