"""A run's settings. `Config` declares what every task's run sets (the model's kind and shape, the
DEQ's solve, the optimization); a task's configuration subclasses it with its own fields and gives
every default once (`eqattn.digits.DigitsConfig`, `eqattn.text.TextConfig`,
`eqattn.graphs.GraphConfig`). `TransformerConfig` adds what the transformer models read.

Each field's `metadata["help"]` says what it sets (the `eqattn` command's help is made from it);
`metadata["choices"]` lists a string field's values. A bad value is a
[`ConfigError`][eqattn.train.ConfigError] naming the parameter (`dim`, not a command-line flag)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

import equinox as eqx

from .. import nn
from .._errors import ConfigError
from .._solve import ADJOINTS, SOLVERS, AbstractAdjoint, named_adjoint, named_solver

MODELS = ("deq", "explicit")


def setting(
    default: Any = dataclasses.MISSING, help: str = "", *, choices: tuple[str, ...] | None = None
) -> Any:
    """A configuration field with its default (none: each task's configuration gives it), what
    it sets (`help`) and, for a string, its `choices`."""
    metadata = {"help": help} | ({} if choices is None else {"choices": choices})
    return dataclasses.field(default=default, metadata=metadata)


def field_metadata(cls: type, name: str) -> dict[str, Any]:
    """The `metadata` of field `name` where it was first declared: a task's configuration sets a
    default with a plain `name: type = value`, and the help and choices stay the base's."""
    for klass in cls.__mro__:
        found = getattr(klass, "__dataclass_fields__", {}).get(name)
        if found is not None and found.metadata:
            return dict(found.metadata)
    return {}


def check_choice(config, name: str) -> None:
    """A field with `choices`: its value (each value, for a tuple; None where allowed) is one."""
    choices = field_metadata(type(config), name).get("choices")
    value = getattr(config, name)
    if choices is None or value is None:
        return
    values = value if isinstance(value, tuple) else (value,)
    if not values or any(v not in choices for v in values):
        got = ", ".join(map(str, values)) if isinstance(value, tuple) else repr(value)
        what = "each of" if isinstance(value, tuple) else "one of"
        raise ConfigError(f"`{name}` must be {what} {', '.join(choices)}; got {got or 'none'}")


def at_least(config, names: tuple[str, ...], low: int) -> None:
    """Each field of `names` is an integer >= `low` (None where the field allows it)."""
    for name in names:
        value = getattr(config, name)
        if value is not None and value < low:
            raise ConfigError(f"`{name}` must be >= {low}; got {value}")


def in_range(config, name: str, low: float, high: float, *, closed: str) -> None:
    """The field is finite and in the interval `closed` describes ("[]", "(]", "[)", "()")."""
    value = getattr(config, name)
    above = value >= low if closed[0] == "[" else value > low
    below = value <= high if closed[1] == "]" else value < high
    if not (math.isfinite(value) and above and below):
        raise ConfigError(
            f"`{name}` must be in {closed[0]}{low:g}, {high:g}{closed[1]}; got {value}"
        )


def non_negative(config, names: tuple[str, ...], *, positive: bool = False) -> None:
    """Each field of `names` is finite and >= 0 (> 0 if `positive`)."""
    for name in names:
        value = getattr(config, name)
        if not (math.isfinite(value) and (value > 0 if positive else value >= 0)):
            raise ConfigError(
                f"`{name}` must be finite and {'> 0' if positive else '>= 0'}; got {value}"
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """What every task's run sets: the model (`model`: the DEQ or its explicit twin, matched to
    the DEQ's parameters), the DEQ's solve, and the optimization (AdamW with warm-up and cosine
    decay, [`optimizer_of`][eqattn.train.optimizer_of]). A task's configuration subclasses it and
    gives the defaults; an explicit run records the `width` and `mlp_ratio` it was built with.

    The DEQ's training solve gets `train_steps` steps, at most `max_steps` (its evaluation
    budget): `training_budget`.

    **Example:**

    ```python
    from eqattn import graphs, train

    config = graphs.GraphConfig(dim=16, epochs=2)
    assert isinstance(config, train.Config) and config.training_budget == 40
    try:
        graphs.GraphConfig(max_steps=1)
    except train.ConfigError as error:  # a ValueError naming the parameter
        assert str(error).startswith("`max_steps` must be >= 2")
    ```
    """

    model: Literal["deq", "explicit"] = setting(
        "deq", "the weight-tied DEQ, or its explicit twin of equal parameters", choices=MODELS
    )
    dim: int = setting(help="the DEQ's width")
    depth: int = setting(help="explicit: blocks (its width matches the DEQ's parameters)")
    width: int | None = setting(None, "explicit: its width (None: matched to the DEQ's parameters)")
    mlp_ratio: float | None = setting(None, "explicit: its MLP ratio (None: matched with `width`)")
    solver: str = setting(help="DEQ: the forward solver", choices=tuple(SOLVERS))
    adjoint: str = setting(help="DEQ: how the fixed point is differentiated", choices=ADJOINTS)
    rtol: float = setting(help="DEQ: the solver's tolerance (relative residual)")
    max_steps: int = setting(help="DEQ: the solver's step limit (evaluation's budget)")
    train_steps: int = setting(
        help="DEQ: the solver's step limit while training, capped at `max_steps`"
    )
    backward_solver: str = setting(
        "anderson", "DEQ, implicit adjoint: the backward solver", choices=tuple(SOLVERS)
    )
    backward_steps: int | None = setting(
        4, "DEQ, implicit adjoint: the backward solve's step limit (None: `max_steps`)"
    )
    phantom_steps: int = setting(5, "DEQ, phantom adjoint: the damped steps it backpropagates")
    phantom_damping: float = setting(1.0, "DEQ, phantom adjoint: their damping, in (0, 1]")
    epochs: int = setting(help="epochs")
    batch_size: int = setting(help="examples per optimizer step")
    lr: float = setting(help="peak learning rate (warm-up, cosine decay)")
    weight_decay: float = setting(help="AdamW's weight decay")
    clip: float = setting(1.0, "global gradient-norm clipping (0: off)")
    seed: int = setting(0, "random seed (initialization, data order, dropout)")

    def __post_init__(self):
        for f in dataclasses.fields(self):
            check_choice(self, f.name)
        at_least(self, ("dim", "depth", "phantom_steps", "backward_steps"), 1)
        at_least(self, ("epochs", "batch_size"), 1)
        for name in self.step_limits:
            if getattr(self, name) < 2:
                raise ConfigError(
                    f"`{name}` must be >= 2 (a budget of 1 evaluates the map at the solve's start "
                    f"only and returns the start); got {getattr(self, name)}"
                )
        in_range(self, "phantom_damping", 0.0, 1.0, closed="(]")
        if self.width is not None and (self.width < 1 or self.width % self.width_step):
            raise ConfigError(
                f"`width` must be a positive multiple of {self.width_step}; got {self.width}"
            )
        if self.mlp_ratio is not None:
            non_negative(self, ("mlp_ratio",), positive=True)
        non_negative(self, ("rtol", "lr"), positive=True)
        non_negative(self, ("weight_decay", "clip"))

    @property
    def width_step(self) -> int:
        """What a model's width must be a multiple of (the explicit twin's width is searched in
        these steps): 1 here, the attention heads of a transformer."""
        return 1

    @property
    def step_limits(self) -> tuple[str, ...]:
        """The settings that are solver step limits, each checked to be >= 2: `max_steps` and
        `train_steps` here; a task that gives `train_steps` another meaning checks it itself."""
        return ("max_steps", "train_steps")

    @property
    def training_budget(self) -> int:
        """The DEQ's solver steps while training: `train_steps`, at most `max_steps`."""
        return min(self.train_steps, self.max_steps)

    def deq_solver(self):
        """The DEQ's forward solver, by name, with `rtol` and `max_steps`."""
        return named_solver(self.solver, rtol=self.rtol, max_steps=self.max_steps)

    def deq_adjoint(self) -> AbstractAdjoint:
        """How the DEQ's fixed point is differentiated (`adjoint`, with its settings)."""
        return named_adjoint(
            self.adjoint,
            rtol=self.rtol,
            max_steps=self.max_steps,
            backward_solver=self.backward_solver,
            backward_steps=self.backward_steps,
            phantom_steps=self.phantom_steps,
            phantom_damping=self.phantom_damping,
        )

    def to_dict(self) -> dict[str, Any]:
        """The fields, as a checkpoint's header and metrics.json record them (JSON)."""
        return {
            k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()
        }

    @classmethod
    def from_dict(cls, recorded: dict[str, Any]):
        """The configuration `to_dict` recorded (lists back to tuples); an unknown field is a
        `ConfigError` naming it."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(recorded) - names)
        if unknown:
            raise ConfigError(f"{cls.__name__} has no field {', '.join(unknown)}")
        fields: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in recorded.items()
        }
        return cls(**fields)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransformerConfig(Config):
    """What the transformer models read beyond `Config`: the DEQ transformer's cell and stem
    ([`eqattn.nn.DEQTransformer`][]), dropout, and the Jacobian penalty of the DEQ's training.
    `transformer` builds either model.

    **Example:**

    ```python
    import jax
    from eqattn import digits, nn, train

    config = digits.DigitsConfig(dim=16, heads=2)  # the digits and text configurations are these
    assert isinstance(config, train.TransformerConfig)
    model = config.transformer(10, jax.random.key(0), in_features=8, max_len=8)
    assert isinstance(model, nn.DEQTransformer) and model.block.depth == config.cell_depth
    ```
    """

    heads: int = setting(help="attention heads")
    cell_depth: int = setting(1, "DEQ: blocks of the map, iterated together to the fixed point")
    stem_depth: int = setting(
        0, "DEQ: explicit blocks between the embedding and the implicit block"
    )
    attend_input: bool = setting(
        False, "DEQ: the implicit block's attention reads its state plus the injected input"
    )
    dropout: float = setting(help="dropout rate (one mask per solve)")
    jacobian_weight: float = setting(
        help="DEQ: weight of the Jacobian penalty |df/dz|_F^2 (0: off)"
    )
    jacobian_share: float = setting(help="DEQ: the share of a batch whose fixed points it probes")

    def __post_init__(self):
        at_least(self, ("heads",), 1)
        if self.dim % self.heads:
            raise ConfigError(f"`dim` ({self.dim}) must be divisible by `heads` ({self.heads})")
        super().__post_init__()
        at_least(self, ("cell_depth",), 1)
        at_least(self, ("stem_depth",), 0)
        in_range(self, "dropout", 0.0, 1.0, closed="[)")
        non_negative(self, ("jacobian_weight",))
        in_range(self, "jacobian_share", 0.0, 1.0, closed="(]")

    @property
    def width_step(self) -> int:
        return self.heads

    def transformer(self, num_outputs: int, key, *, dtype=None, **io) -> eqx.Module:
        """The DEQ transformer, or the explicit one of `depth` blocks of `width` and `mlp_ratio`
        (set: `explicit_shape`), with `io` ([`eqattn.nn.TokenEmbedding`][]'s and the pooling's
        settings)."""
        if self.model == "deq":
            return nn.DEQTransformer(
                num_outputs,
                self.dim,
                self.heads,
                key=key,
                solver=self.deq_solver(),
                adjoint=self.deq_adjoint(),
                dropout=self.dropout,
                depth=self.cell_depth,
                stem_depth=self.stem_depth,
                attend_input=self.attend_input,
                dtype=dtype,
                **io,
            )
        assert self.width is not None, "the explicit model's shape is set first"
        return nn.Transformer(
            num_outputs,
            self.width,
            self.heads,
            self.depth,
            key=key,
            dropout=self.dropout,
            mlp_ratio=2.0 if self.mlp_ratio is None else self.mlp_ratio,
            dtype=dtype,
            **io,
        )
