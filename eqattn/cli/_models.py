"""The classifiers the command trains: the DEQ transformer and its explicit baseline."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Literal, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import nn, text
from .._solve import (
    Anderson,
    Broyden,
    ImplicitAdjoint,
    JacobianFree,
    Phantom,
    Picard,
    SharedInverse,
    Unrolled,
)
from ._errors import UsageError

SOLVERS = {"anderson": Anderson, "picard": Picard, "broyden": Broyden}
# `--task text`'s own defaults of the options that differ from the digits' (measured on a 2-core
# CPU, default corpus, context 256, seed 0; then `python -m benchmarks text` over seeds 0-2):
# 500 steps of 16 windows end in about 3 minutes in all. The learning rate: the explicit
# model's bits per byte were 3.28 at the digits' 3e-3, 3.01 at 1e-2, 2.96 at 2e-2, and 4.67
# (no learning past the byte frequencies) at 4e-2; 1e-2 keeps a factor of 4 from that cliff.
# The DEQ's shape (the explicit model matches its parameters): one explicit block before the DEQ
# block (`stem_depth` 1) at width 52 has the parameters of one block at width 64 (86,844
# against 86,916); over seeds 0-2 it reached 3.245, 3.192, 3.204 bits per byte against the
# single block's 3.315, 3.325, 3.332 (the explicit model: 3.012, 3.006, 3.063), in 1.22x the
# explicit model's training time (the single block 0.99x), its test solves all converged (the
# benchmark at 99c4a2d; at ec72cf9 the same bits per byte in 1.13x and 0.90x). Two stem blocks
# at width 44 (83,164): 3.116, 3.176, 3.115 in 1.20x;
# kept at one so that most of the model stays the implicit block (the benchmark's candidates
# measure both). A pre-norm block instead of the stem: 3.325 (seed 0).
TEXT_DEFAULTS = {
    "dim": 52,
    "stem_depth": 1,
    "epochs": 5,
    "batch_size": 16,
    "lr": 1e-2,
    "label_smoothing": 0.0,
    "dropout": 0.0,
}
# The DEQ's own. Picard's solves diverged mid-run at learning rates >= 6e-3 whatever the
# penalty's weight (0.1-1) or share (0.125-0.5); Anderson's converged. The implicit backward
# (4 Anderson steps) left 36% of the test solves unconverged at 1e-2 (64% converged); the
# Jacobian-free one (one VJP) converged them all, in about the explicit model's training time. The Jacobian
# penalty probes an eighth of each batch's windows (the same bits per byte as all of them, at
# an eighth of its cost); its weight trades bits per byte against solver steps (seed 0):
# 3.35 at 0.3, 3.31 at 0.1 (all training solves converged within 10 steps), 3.29 at 0.03 (half
# of them at the end of training). The block's attention reads its input too (`attend_input`):
# with the stem, 3.127, 3.128, 3.128 over seeds 0-2 (3.117 on seed 3) against 3.245, 3.192,
# 3.204 reading the state alone, in 1.12x the explicit model's training time against 1.18x
# (the benchmark at 3fde144); without the stem 3.307 against 3.324 (the benchmark).
TEXT_DEQ_DEFAULTS = {
    "solver": "anderson",
    "adjoint": "jacobian-free",
    "jacobian_weight": 0.1,
    "jacobian_share": 0.125,
    "attend_input": True,
}


def text_defaults(model: str) -> dict[str, Any]:
    """The options of `eqattn train --task text --model MODEL` whose defaults are not the
    digits' (the dataclasses' own)."""
    return {**TEXT_DEFAULTS, **(TEXT_DEQ_DEFAULTS if model == "deq" else {})}


# A solve's budget counts evaluations of the map; the first one tests the starting point, so a
# budget of 1 returns the start itself (zeros, or a warm start): a model whose output does not
# depend on its input.
ONE_EVALUATION = "a budget of 1 evaluates the map at the solve's start only and returns the start"
ADJOINTS = ("implicit", "phantom", "jacobian-free", "unrolled", "shared-inverse")
NUM_CLASSES = 10


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """What a checkpoint needs to rebuild its model (saved in the checkpoint's header)."""

    model: Literal["deq", "explicit"] = "deq"
    # "text": a causal byte-level language model over `context` positions (eqattn.text)
    task: Literal["digits", "text"] = "digits"
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
    # explicit model: its width and MLP ratio (None: matched to the DEQ's parameters by
    # `explicit_shape`; a new run records the pair it built, so its checkpoint rebuilds it)
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
    num_tokens: int = 8
    in_features: int = 8

    def __post_init__(self):
        if self.model not in ("deq", "explicit"):
            raise UsageError(f"--model must be 'deq' or 'explicit'; got {self.model!r}")
        if self.task not in ("digits", "text"):
            raise UsageError(f"--task must be 'digits' or 'text'; got {self.task!r}")
        if self.context < 2:
            raise UsageError(f"--context must be >= 2; got {self.context}")
        if self.solver not in SOLVERS:
            raise UsageError(f"--solver must be one of {', '.join(SOLVERS)}; got {self.solver!r}")
        if self.adjoint not in ADJOINTS:
            raise UsageError(
                f"--adjoint must be one of {', '.join(ADJOINTS)}; got {self.adjoint!r}"
            )
        if self.backward_solver not in SOLVERS:
            raise UsageError(
                f"--backward-solver must be one of {', '.join(SOLVERS)}; got "
                f"{self.backward_solver!r}"
            )
        if self.backward_steps is not None and self.backward_steps < 1:
            raise UsageError(f"--backward-steps must be >= 1; got {self.backward_steps}")
        if not 0 < self.phantom_damping <= 1:
            raise UsageError(f"--phantom-damping must be in (0, 1]; got {self.phantom_damping}")
        if self.max_steps < 2:
            raise UsageError(f"--max-steps must be >= 2 ({ONE_EVALUATION}); got {self.max_steps}")
        for name in ("dim", "heads", "depth", "cell_depth", "phantom_steps"):
            if getattr(self, name) < 1:
                raise UsageError(
                    f"--{name.replace('_', '-')} must be >= 1; got {getattr(self, name)}"
                )
        if self.width is not None and (self.width < 1 or self.width % self.heads):
            raise UsageError(
                f"width must be a positive multiple of --heads ({self.heads}); got {self.width}"
            )
        if self.mlp_ratio is not None and not (
            self.mlp_ratio > 0 and math.isfinite(self.mlp_ratio)
        ):
            raise UsageError(f"mlp_ratio must be finite and > 0; got {self.mlp_ratio}")
        if self.stem_depth < 0:
            raise UsageError(f"--stem-depth must be >= 0; got {self.stem_depth}")
        if self.dim % self.heads:
            raise UsageError(f"--dim ({self.dim}) must be divisible by --heads ({self.heads})")
        if not 0 <= self.dropout < 1:
            raise UsageError(f"--dropout must be in [0, 1); got {self.dropout}")
        if not (self.rtol > 0 and math.isfinite(self.rtol)):
            raise UsageError(f"--rtol must be finite and > 0; got {self.rtol}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """The configuration a checkpoint's header or a metrics file records. An explicit model
        saved before its shape was recorded gets the shape it was built with (`explicit_shape`'s
        first rules, the width at most `dim`)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        config = cls(**{k: v for k, v in d.items() if k in fields})
        if config.model == "explicit" and "width" not in d:
            width, mlp_ratio = _matched_shape(config, extended=False)
            config = dataclasses.replace(config, width=width, mlp_ratio=mlp_ratio)
        return config

    def with_shape(self) -> ModelConfig:
        """This configuration with the explicit model's width and MLP ratio filled in (what a new
        run records)."""
        if self.model != "explicit" or self.width is not None:
            return self
        width, mlp_ratio = explicit_shape(self)
        return dataclasses.replace(self, width=width, mlp_ratio=mlp_ratio)


def solver_of(config: ModelConfig):
    return SOLVERS[config.solver](rtol=config.rtol, max_steps=config.max_steps)


def adjoint_of(config: ModelConfig):
    if config.adjoint == "implicit":
        # A truncated backward solve (a training lever chosen by the `training` benchmark); an
        # inexact one is accepted, as the layer's throw=False says.
        steps = config.max_steps if config.backward_steps is None else config.backward_steps
        linear = SOLVERS[config.backward_solver](rtol=config.rtol, max_steps=steps)
        return ImplicitAdjoint(linear)
    if config.adjoint == "shared-inverse":
        return SharedInverse()
    if config.adjoint == "phantom":
        return Phantom(steps=config.phantom_steps, damping=config.phantom_damping)
    return {"jacobian-free": JacobianFree(), "unrolled": Unrolled()}[config.adjoint]


def explicit_shape(config: ModelConfig) -> tuple[int, float]:
    """The explicit baseline's `(width, mlp_ratio)`: the configuration's own when it records
    them, else `depth` blocks with the DEQ model's parameters (`_matched_shape`). A setting
    that cannot come within 5% of them is refused (a `UsageError` naming both counts)."""
    if config.width is not None:
        return config.width, 2.0 if config.mlp_ratio is None else config.mlp_ratio
    return _matched_shape(config, extended=True)


@functools.lru_cache(maxsize=64)
def _matched_shape(config: ModelConfig, *, extended: bool) -> tuple[int, float]:
    """`depth` blocks with about the DEQ model's parameters. The width (a multiple of `heads`, at
    most `dim`) closest at MLP ratio 2; if that is more than 5% off, the closest pair with the
    MLP ratio in 1 to 4 by quarters, and if still more than 5% off, with the width up to
    `2 * dim` and the ratio in 0.25 to 8. Checkpoints that do not record their shape were built
    by the first rule alone (digits) or the first two (text): `extended=False` gives that."""
    target = count_params(dataclasses.replace(config, model="deq"))
    explicit = dataclasses.replace(config, model="explicit", width=None, mlp_ratio=None)
    # each (width, ratio) counted once: the rules and `_closest` revisit the same pairs
    count = functools.cache(lambda w, r: count_params(explicit, width=w, mlp_ratio=r))
    off = lambda wr: abs(count(*wr) - target)  # noqa: E731
    width = min(range(config.heads, config.dim + 1, config.heads), key=lambda w: off((w, 2.0)))
    if off((width, 2.0)) <= 0.05 * target or (config.task != "text" and not extended):
        return width, 2.0
    best = _closest(count, target, config.heads, config.dim, (1.0, 4.0))
    if off(best) <= 0.05 * target or not extended:
        return best
    best = _closest(count, target, config.heads, 2 * config.dim, (0.25, 8.0))
    if off(best) > 0.05 * target:
        raise UsageError(
            f"no explicit model of --depth {config.depth} comes within 5% of the DEQ's "
            f"{target:,} parameters (the closest, width {best[0]} at MLP ratio {best[1]}, has "
            f"{count(*best):,}); choose another --depth or --dim"
        )
    return best


def _closest(count, target: int, heads: int, max_width: int, ratios) -> tuple[int, float]:
    """The `(width, ratio)` whose `count` is closest to `target`: widths multiples of `heads` up
    to `max_width`, ratios by quarters within `ratios`. The count is affine in the ratio, so two
    counts per width give its best ratio."""
    pairs = []
    for w in range(heads, max_width + 1, heads):
        one, two = count(w, 1.0), count(w, 2.0)
        ratio = 1.0 + (target - one) / (two - one) if two != one else 2.0
        pairs.append((w, min(max(round(4 * ratio) / 4, ratios[0]), ratios[1])))
    return min(pairs, key=lambda wr: abs(count(*wr) - target))


def build_model(
    config: ModelConfig, key, *, width: int | None = None, mlp_ratio: float = 2.0, dtype=None
) -> eqx.Module:
    """The model of `config`; `dtype` of its parameters (default: JAX's default float). The
    text task's is a causal byte-level language model: `START` and the bytes in, one
    distribution over the next byte out per position."""
    common = dict(in_features=config.in_features, max_len=config.num_tokens, dtype=dtype)
    outputs = NUM_CLASSES
    if config.task == "text":
        outputs = text.BYTES
        common = dict(
            vocab_size=text.BYTES + 1,
            max_len=config.context,
            pooling="none",
            causal=True,
            dtype=dtype,
        )
    if config.model == "deq":
        return nn.DEQTransformer(
            outputs,
            config.dim,
            config.heads,
            key=key,
            solver=solver_of(config),
            adjoint=adjoint_of(config),
            dropout=config.dropout,
            depth=config.cell_depth,
            stem_depth=config.stem_depth,
            attend_input=config.attend_input,
            **common,
        )
    width, mlp_ratio = explicit_shape(config) if width is None else (width, mlp_ratio)
    return nn.Transformer(
        outputs,
        width,
        config.heads,
        config.depth,
        key=key,
        dropout=config.dropout,
        mlp_ratio=mlp_ratio,
        **common,
    )


def count_params(config: ModelConfig, *, width: int | None = None, mlp_ratio=2.0) -> int:
    shapes = eqx.filter_eval_shape(
        lambda: build_model(
            config, jax.random.key(0), width=width or config.dim, mlp_ratio=mlp_ratio
        )
    )
    return sum(x.size for x in jax.tree.leaves(shapes) if isinstance(x, jax.ShapeDtypeStruct))


class Prediction(NamedTuple):
    """One example's logits `[10]` and, for the DEQ model, its solve: steps, relative residual,
    convergence and the fixed point (a warm start for the next solve of this example)."""

    logits: jax.Array
    steps: jax.Array
    residual: jax.Array
    converged: jax.Array
    fixed_point: jax.Array | None


def predict(model: eqx.Module, x, max_steps=None, key=None, z0=None) -> Prediction:
    """`key` (training) draws dropout masks, without it the model runs in inference mode; `z0`
    warm-starts the DEQ model's solve."""
    inference = key is None
    if isinstance(model, nn.DEQTransformer):
        logits, eq = model.forward(x, key=key, inference=inference, max_steps=max_steps, z0=z0)
        return Prediction(logits, eq.steps, eq.relative_residual, eq.converged, eq.value)
    logits = model(x, key=key, inference=inference)
    return Prediction(logits, jnp.array(0), jnp.array(0.0), jnp.array(True), None)


def correction_segments(budget: int, pieces: int) -> tuple[int, ...]:
    """`budget` solver steps split into `pieces` nearly equal pieces of at least 2 steps."""
    if budget < 2 * pieces:
        raise UsageError(
            f"--corrections {pieces} needs a training budget of at least {2 * pieces} solver "
            f"steps (--train-steps, --max-steps); got {budget}"
        )
    return tuple(budget // pieces + (i < budget % pieces) for i in range(pieces))


def predict_corrected(model: eqx.Module, x, segments, key=None, z0=None) -> Prediction:
    """As `predict` for the DEQ model solved in `segments` pieces (fixed-point correction):
    `logits [pieces, 10]`, one per piece's end; the statistics are the whole solve's."""
    if not isinstance(model, nn.DEQTransformer):
        raise UsageError("fixed-point correction (--corrections) needs the DEQ model")
    logits, pieces = model.trajectory(x, segments, key=key, inference=key is None, z0=z0)
    last = pieces[-1]
    steps = sum(eq.steps for eq in pieces)
    return Prediction(jnp.stack(logits), steps, last.relative_residual, last.converged, last.value)
