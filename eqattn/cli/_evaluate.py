"""`eqattn evaluate`: test accuracy of a checkpoint, its solver steps per example, and accuracy
against the solver's step budget at test time (a DEQ's "compute at test time" knob)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import data
from ._checkpoint import load_checkpoint, read_header
from ._errors import CommandError
from ._models import ModelConfig, build_model
from ._step import make_evaluator


def load_model(path: str | Path, max_steps: int | None = None):
    """`(model, model_config, header)` from a checkpoint file or a directory holding one;
    `max_steps` raises the solver's step limit above the trained one (a static setting, not a
    saved array, so the same leaves load into either)."""
    path, header = read_header(path)
    try:
        config = ModelConfig.from_dict(header["config"])
    except (KeyError, TypeError, CommandError) as e:
        raise CommandError(f"checkpoint {str(path)!r} has an unusable configuration: {e}") from None
    skeleton = config if max_steps is None else dataclasses.replace(config, max_steps=max_steps)
    # the checkpoint's dtype, whatever JAX's default float is now (jax_enable_x64 or not)
    like = build_model(skeleton, jax.random.key(0), dtype=header.get("dtype"))
    return load_checkpoint(path, like), config, header


def budgets(max_steps: int) -> list[int]:
    """Step budgets around the trained one: 1, 2, 4, ... and 2x the training budget."""
    out = [b for b in (1, 2, 4, 8, 16, 32) if b < max_steps]
    return out + [max_steps, 2 * max_steps]


def evaluate(checkpoint: str | Path, steps: list[int] | None = None) -> dict[str, Any]:
    """Accuracy at the trained budget, per-example solver steps, and accuracy per budget."""
    _, header = read_header(checkpoint)
    trained = int(header.get("config", {}).get("max_steps", 1))
    steps = budgets(trained) if steps is None else steps
    if any(b < 1 for b in steps):
        raise CommandError(f"--steps must be >= 1; got {steps}")
    model, config, header = load_model(checkpoint, max(max(steps), trained))
    if config.task == "text":
        from ._text import evaluate_text

        return dict(checkpoint=str(checkpoint), **evaluate_text(model, config, header, steps))
    digits = data.load_digits()
    x = jnp.asarray(data.tokenize(digits.test_images, config.tokens))
    labels = digits.test_labels
    run = make_evaluator()
    trained_budget = jnp.asarray(config.max_steps)
    preds, used, residual, converged = (np.asarray(a) for a in run(model, x, trained_budget))
    result: dict[str, Any] = {
        "checkpoint": str(checkpoint),
        "model": config.model,
        "test_examples": len(labels),
        "test_accuracy": float(np.mean(preds == labels)),
        "trained_epochs": header.get("epoch"),
        "accuracy_at_save": header.get("test_accuracy"),
    }
    if config.model == "deq":
        result["solver_steps"] = {
            "max_steps": config.max_steps,
            "mean": float(used.mean()),
            "median": float(np.median(used)),
            "p90": float(np.percentile(used, 90)),
            "max": int(used.max()),
            "converged": float(converged.mean()),
            "mean_relative_residual": float(residual.mean()),
            "per_example": used.tolist(),
        }
        sweep = []
        for b in steps:  # an array budget: one compilation for the whole sweep
            p, u, r, c = (np.asarray(a) for a in run(model, x, jnp.asarray(b)))
            sweep.append(
                {
                    "max_steps": b,
                    "test_accuracy": float(np.mean(p == labels)),
                    "mean_steps": float(u.mean()),
                    "converged": float(c.mean()),
                    "mean_relative_residual": float(r.mean()),
                }
            )
        result["budget_sweep"] = sweep
    return result
