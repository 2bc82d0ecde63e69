"""A training run's settings: the model's (`ModelConfig`, saved in its checkpoint) and the
optimization's (`TrainConfig`). The dataclasses' defaults are the digits'; each task states where
its own differ (`AbstractTask.defaults`)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

from .._errors import ConfigError
from .._solve._named import ADJOINTS as ADJOINTS, SOLVERS as _SOLVERS

TASKS = ("digits", "text", "graphs")
"""The tasks `eqattn train --task` knows (each an `AbstractTask` of `eqattn.train`)."""
SOLVERS = tuple(_SOLVERS)
# A solve's budget counts evaluations of the map; the first one tests the starting point, so a
# budget of 1 returns the start itself (zeros, or a warm start): a model whose output does not
# depend on its input.
ONE_EVALUATION = "a budget of 1 evaluates the map at the solve's start only and returns the start"


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _at_least(config, names, low: int) -> None:
    for name in names:
        value = getattr(config, name)
        if value < low:
            raise ConfigError(f"{_option(name)} must be >= {low}; got {value}")


def _finite(config, names, *, positive: bool) -> None:
    for name in names:
        value = getattr(config, name)
        if not (math.isfinite(value) and (value > 0 if positive else value >= 0)):
            raise ConfigError(
                f"{_option(name)} must be finite and {'> 0' if positive else '>= 0'}; got {value}"
            )


def _choice(config, name: str, choices) -> None:
    value = getattr(config, name)
    if value not in choices:
        raise ConfigError(f"{_option(name)} must be one of {', '.join(choices)}; got {value!r}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """What a checkpoint needs to rebuild its model (saved in the checkpoint's header).

    **Example:**

    ```python
    from eqattn import train

    config = train.ModelConfig(model="explicit", dim=32)
    assert config.task == "digits" and config.depth == 4  # 4 untied blocks
    try:
        train.ModelConfig(dim=30, heads=4)
    except train.ConfigError as error:  # a ValueError naming the options
        assert "--dim (30) must be divisible by --heads (4)" in str(error)
    ```
    """

    model: Literal["deq", "explicit"] = "deq"
    # the task (`TASKS`); "text": a causal byte-level language model over `context` positions
    task: str = "digits"
    context: int = 256
    tokens: Literal["rows", "patches"] = "rows"
    dim: int = 64
    heads: int = 4
    depth: int = 4  # explicit model: blocks
    # DEQ model: the blocks of the map's cell (1: one weight-tied block; see eqattn.nn.DEQBlock)
    cell_depth: int = 1
    # DEQ model: explicit blocks between the embedding and the implicit block (its input)
    stem_depth: int = 0
    # DEQ model: the implicit block's attention reads the state plus the injected input
    attend_input: bool = False
    # explicit model: its width and MLP ratio (None: matched to the DEQ's parameters; a new run
    # records the pair it built, so its checkpoint rebuilds it)
    width: int | None = None
    mlp_ratio: float | None = None
    dropout: float = 0.2
    # Chosen by `python -m benchmarks training` (CPU, 5 seeds; benchmarks/results/
    # training-cpu-cpu.json): with the training budget of TrainConfig, 0.43x the training time
    # of Anderson to rtol 1e-3 with a converged backward solve (97.55% test accuracy against
    # 97.21%; 98.05% in an earlier run of the same case).
    solver: str = "picard"
    adjoint: str = "implicit"
    rtol: float = 1e-2
    max_steps: int = 30
    # implicit adjoint: the backward solver and its step budget (None: max_steps): 4 Anderson
    # steps on (I - J^T) u = g (4 vector-Jacobian products), returning the fifth iterate they
    # pay for: what 5 steps gave before the backward returned that step (CHANGELOG)
    backward_solver: str = "anderson"
    backward_steps: int | None = 4
    # phantom adjoint: backprop through `phantom_steps` damped steps from the fixed point
    phantom_steps: int = 5
    phantom_damping: float = 1.0
    # graphs: the kind of block (eqattn.graphs: "propagation" or "transformer")
    block: str = "propagation"
    # the digits' token count and features per token (set from the data by the task)
    num_tokens: int = 8
    in_features: int = 8

    def __post_init__(self):
        _choice(self, "model", ("deq", "explicit"))
        _choice(self, "task", TASKS)
        _choice(self, "tokens", ("rows", "patches"))
        _choice(self, "solver", SOLVERS)
        _choice(self, "adjoint", ADJOINTS)
        _choice(self, "backward_solver", SOLVERS)
        _choice(self, "block", ("propagation", "transformer"))
        _at_least(self, ("context",), 2)
        _at_least(self, ("dim", "heads", "depth", "cell_depth", "phantom_steps"), 1)
        _at_least(self, ("stem_depth",), 0)
        if self.backward_steps is not None:
            _at_least(self, ("backward_steps",), 1)
        if not 0 < self.phantom_damping <= 1:
            raise ConfigError(f"--phantom-damping must be in (0, 1]; got {self.phantom_damping}")
        if self.max_steps < 2:
            raise ConfigError(f"--max-steps must be >= 2 ({ONE_EVALUATION}); got {self.max_steps}")
        if self.width is not None and (self.width < 1 or self.width % self.heads):
            raise ConfigError(
                f"width must be a positive multiple of --heads ({self.heads}); got {self.width}"
            )
        if self.mlp_ratio is not None:
            _finite(self, ("mlp_ratio",), positive=True)
        if self.dim % self.heads:
            raise ConfigError(f"--dim ({self.dim}) must be divisible by --heads ({self.heads})")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"--dropout must be in [0, 1); got {self.dropout}")
        _finite(self, ("rtol",), positive=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """The configuration a checkpoint's header or a metrics file records (fields it does not
        record take their defaults; unknown keys are ignored)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in fields})


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimization settings (the model's own are in [`ModelConfig`][eqattn.train.ModelConfig]).

    **Example:**

    ```python
    from eqattn import train

    config = train.TrainConfig(epochs=2, batch_size=32)
    assert config.lr == 3e-3 and config.train_steps == 10  # the DEQ's training solve budget
    ```
    """

    epochs: int = 40
    batch_size: int = 64
    # 3e-3 (was 2e-3): the DEQ's mean test accuracy over 10 seeds rose from 97.05% to 97.88%
    # with the other defaults unchanged; the explicit baseline's did not fall (`python -m
    # benchmarks training`, the rows "at/with the previous learning rate")
    lr: float = 3e-3
    weight_decay: float = 0.05
    clip: float = 1.0  # global gradient-norm clipping; 0 turns it off
    shift: int = 0  # digits augmentation: random translations of up to `shift` pixels
    label_smoothing: float = 0.1
    train_size: int | None = None  # the first N training images only (quick runs)
    seed: int = 0
    # DEQ only: the forward solver's step budget while training (None: the model's max_steps,
    # which evaluation uses), and whether each training example's solve starts from its
    # previous fixed point instead of zeros. 10 steps, with the Anderson backward of
    # ModelConfig: measured by `python -m benchmarks training` (CPU, 5 seeds;
    # benchmarks/results/training-cpu-cpu.json, and the README's table).
    train_steps: int | None = 10
    warm_start: bool = False
    # DEQ only: weight of the Jacobian penalty |df/dz|_F^2 / size at the fixed point (0: none)
    jacobian_weight: float = 0.0
    # DEQ only: the share of each batch's examples (each chunk's windows for text) whose fixed
    # points the penalty probes, the first ceil(share x examples) (batches are drawn at random):
    # the penalty's second-order program costs in proportion, the estimate stays unbiased
    jacobian_share: float = 1.0
    # DEQ only: fixed-point correction, the training solve's budget split into this many pieces,
    # a loss on each piece's end (weights correction_decay ** (pieces left), normalized), each
    # differentiated by a one-step phantom gradient instead of the model's adjoint (0: off)
    corrections: int = 0
    correction_decay: float = 0.8
    # text: optimizer steps per epoch (an epoch ends with the validation score and a
    # checkpoint), and the corpus (files or folders; None: the Python standard library's source)
    epoch_steps: int = 100
    text: tuple[str, ...] | None = None
    # graphs: the training graphs' sizes (nodes, both ends included) and families (None: all)
    graph_sizes: tuple[int, int] = (8, 16)
    families: tuple[str, ...] | None = None

    def __post_init__(self):
        _at_least(self, ("epochs", "batch_size", "epoch_steps"), 1)
        _at_least(self, ("corrections",), 0)
        _finite(self, ("lr",), positive=True)
        _finite(self, ("shift", "weight_decay", "clip", "jacobian_weight"), positive=False)
        if not 0 < self.jacobian_share <= 1:
            raise ConfigError(f"--jacobian-share must be in (0, 1]; got {self.jacobian_share}")
        if not 0 <= self.label_smoothing < 1:
            raise ConfigError(f"--label-smoothing must be in [0, 1); got {self.label_smoothing}")
        if self.train_size is not None:
            _at_least(self, ("train_size",), 1)
        if self.train_steps is not None and self.train_steps < 2:
            raise ConfigError(
                f"--train-steps must be >= 2 ({ONE_EVALUATION}); got {self.train_steps}"
            )
        if not 0 < self.correction_decay <= 1:
            raise ConfigError(f"--correction-decay must be in (0, 1]; got {self.correction_decay}")
        low, high = self.graph_sizes
        if not 2 <= low <= high:
            raise ConfigError(f"--graph-sizes must be two sizes 2 <= low <= high; got {low},{high}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """The configuration a checkpoint's header records (JSON: its lists back to tuples)."""
        fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        return cls(**fields)


def split_fields(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`values` split into `ModelConfig`'s fields and `TrainConfig`'s; a key that is neither's is
    a `TypeError` naming it."""
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = set(values) - model_fields - train_fields
    if unknown:
        raise TypeError(f"no configuration field {', '.join(sorted(unknown))}")
    model = {k: v for k, v in values.items() if k in model_fields}
    return model, {k: v for k, v in values.items() if k in train_fields}
