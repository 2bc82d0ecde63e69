"""The classifiers the command trains: the DEQ transformer and its explicit baseline."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import nn
from .._solve import Anderson, Broyden, ImplicitAdjoint, JacobianFree, Phantom, Picard, Unrolled
from ._errors import CommandError

SOLVERS = {"anderson": Anderson, "picard": Picard, "broyden": Broyden}
ADJOINTS = ("implicit", "phantom", "jacobian-free", "unrolled")
NUM_CLASSES = 10


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """What a checkpoint needs to rebuild its model (saved in the checkpoint's header)."""

    model: Literal["deq", "explicit"] = "deq"
    tokens: Literal["rows", "patches"] = "rows"
    dim: int = 64
    heads: int = 4
    depth: int = 4  # explicit model: blocks
    dropout: float = 0.2
    solver: str = "anderson"
    adjoint: str = "implicit"
    rtol: float = 1e-3
    max_steps: int = 30
    num_tokens: int = 8
    in_features: int = 8

    def __post_init__(self):
        if self.model not in ("deq", "explicit"):
            raise CommandError(f"--model must be 'deq' or 'explicit'; got {self.model!r}")
        if self.solver not in SOLVERS:
            raise CommandError(f"--solver must be one of {', '.join(SOLVERS)}; got {self.solver!r}")
        if self.adjoint not in ADJOINTS:
            raise CommandError(
                f"--adjoint must be one of {', '.join(ADJOINTS)}; got {self.adjoint!r}"
            )
        for name in ("dim", "heads", "depth", "max_steps"):
            if getattr(self, name) < 1:
                raise CommandError(
                    f"--{name.replace('_', '-')} must be >= 1; got {getattr(self, name)}"
                )
        if self.dim % self.heads:
            raise CommandError(f"--dim ({self.dim}) must be divisible by --heads ({self.heads})")
        if not 0 <= self.dropout < 1:
            raise CommandError(f"--dropout must be in [0, 1); got {self.dropout}")
        if not self.rtol > 0:
            raise CommandError(f"--rtol must be > 0; got {self.rtol}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in fields})


def solver_of(config: ModelConfig):
    return SOLVERS[config.solver](rtol=config.rtol, max_steps=config.max_steps)


def adjoint_of(config: ModelConfig):
    if config.adjoint == "implicit":
        # Training tolerates an inexact backward solve; the forward residual is what we report.
        return ImplicitAdjoint(Anderson(rtol=config.rtol, max_steps=config.max_steps), throw=False)
    return {"phantom": Phantom(), "jacobian-free": JacobianFree(), "unrolled": Unrolled()}[
        config.adjoint
    ]


def explicit_width(config: ModelConfig) -> int:
    """The explicit baseline's width: `depth` blocks with about the DEQ model's parameters."""
    target = count_params(dataclasses.replace(config, model="deq"))
    widths = range(config.heads, config.dim + 1, config.heads)
    return min(widths, key=lambda w: abs(count_params(config, width=w) - target))


def build_model(config: ModelConfig, key, *, width: int | None = None, dtype=None) -> eqx.Module:
    """The model of `config`; `dtype` of its parameters (default: JAX's default float)."""
    common = dict(in_features=config.in_features, max_len=config.num_tokens, dtype=dtype)
    if config.model == "deq":
        return nn.DEQTransformer(
            NUM_CLASSES,
            config.dim,
            config.heads,
            key=key,
            solver=solver_of(config),
            adjoint=adjoint_of(config),
            dropout=config.dropout,
            **common,
        )
    width = explicit_width(config) if width is None else width
    return nn.Transformer(
        NUM_CLASSES, width, config.heads, config.depth, key=key, dropout=config.dropout, **common
    )


def count_params(config: ModelConfig, *, width: int | None = None) -> int:
    shapes = eqx.filter_eval_shape(
        lambda: build_model(config, jax.random.key(0), width=width or config.dim)
    )
    return sum(x.size for x in jax.tree.leaves(shapes) if isinstance(x, jax.ShapeDtypeStruct))


def predict(model: eqx.Module, x, max_steps: int | None = None, key=None):
    """Logits `[10]`, solver steps, relative residual and convergence of one example; `key`
    (training) draws dropout masks, without it the model runs in inference mode."""
    inference = key is None
    if isinstance(model, nn.DEQTransformer):
        logits, eq = model.forward(x, key=key, inference=inference, max_steps=max_steps)
        return logits, eq.steps, eq.relative_residual, eq.converged
    logits = model(x, key=key, inference=inference)
    return logits, jnp.array(0), jnp.array(0.0), jnp.array(True)
