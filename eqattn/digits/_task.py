"""The digits task: classify the scikit-learn digits, 8 x 8 images read as 8 row tokens (or 16
patches of 2 x 2), scored by test accuracy."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from .. import nn, train
from ..train import (
    AbstractTask,
    Headline,
    apply,
    budget_sweep,
    on_host,
    penalties,
    probed,
    progress_bar,
    run_line,
    sweep_note,
    with_shape,
)
from ._config import DigitsConfig
from ._data import load_digits, tokenize

NUM_CLASSES = 10
TOKENS = {"rows": (8, 8), "patches": (16, 4)}
"""Tokens per image and features per token, by `DigitsConfig.tokens`."""


def shift_images(images: np.ndarray, shift: int, rng: np.random.Generator) -> np.ndarray:
    """Translate each image by a random offset in [-shift, shift]^2 (zero fill)."""
    if shift == 0:
        return images
    n, h, w = images.shape
    padded = np.pad(images, ((0, 0), (shift, shift), (shift, shift)))
    dy, dx = rng.integers(0, 2 * shift + 1, (2, n))
    rows = dy[:, None] + np.arange(h)
    cols = dx[:, None] + np.arange(w)
    return padded[np.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]]


def correction_segments(budget: int, pieces: int) -> tuple[int, ...]:
    """`budget` solver steps split into `pieces` nearly equal pieces (of at least 2 steps where
    `budget >= 2 * pieces`, which `DigitsConfig` checks)."""
    return tuple(budget // pieces + (i < budget % pieces) for i in range(pieces))


def predict_corrected(model: nn.DEQTransformer, x, segments: Sequence[int], key=None, z0=None):
    """As `model.predict`, the solve in `segments` pieces (fixed-point correction): `logits
    [pieces, ...]`, one per piece's end; the statistics are the whole solve's."""
    logits, pieces = model.trajectory(x, segments, key=key, inference=key is None, z0=z0)
    last = pieces[-1]
    steps = jnp.sum(jnp.stack([eq.steps for eq in pieces]))
    return nn.Prediction(
        jnp.stack(logits), steps, last.relative_residual, last.converged, last.value
    )


def make_train_step(config: DigitsConfig, optimizer):
    """The digits' optimizer step (`Step`), with the DEQ levers of `config` (training step
    budget, warm start from `z0` (None: zeros), Jacobian penalty, fixed-point correction).
    `stats` = (accuracy, mean solver steps, mean relative residual, fraction converged)."""
    deq = config.model == "deq"
    regularize = deq and config.jacobian_weight > 0
    segments = None
    if deq and config.corrections:
        segments = correction_segments(config.training_budget, config.corrections)
        weights = config.correction_decay ** jnp.arange(len(segments) - 1, -1, -1.0)
        weights = weights / weights.sum()

    def loss_fn(model, x, y, key, z0):
        def one(xi, ki, zi):
            if segments is not None:
                return predict_corrected(model, xi, segments, key=ki, z0=zi)
            return model.predict(xi, budget=config.training_budget, key=ki, z0=zi)

        keys = jax.random.split(key, (2, len(x)))
        p = jax.vmap(one)(x, keys[0], z0)
        targets = optax.smooth_labels(jax.nn.one_hot(y, NUM_CLASSES), config.label_smoothing)
        if segments is None:
            loss = optax.softmax_cross_entropy(p.logits, targets).mean()
        else:  # logits [batch, pieces, classes]
            losses = optax.softmax_cross_entropy(p.logits, targets[:, None]).mean(0)
            loss = jnp.dot(weights, losses)
            p = p._replace(logits=p.logits[:, -1])
        if regularize:
            penalty = penalties(model, x, p.fixed_point, keys, probed(config, len(x)))
            loss = loss + config.jacobian_weight * penalty.mean()
        acc = jnp.mean(jnp.argmax(p.logits, -1) == y)
        stats = (acc, p.steps.mean(), p.residual.mean(), p.converged.mean())
        return loss, (stats, p.fixed_point)

    def step(model, opt_state, x, y, key, z0):
        (loss, (stats, z)), grads = eqx.filter_value_and_grad(loss_fn, has_aux=True)(
            model, x, y, key, z0
        )
        return *apply(optimizer, model, opt_state, grads), loss, stats, z

    return step


@eqx.filter_jit
def _classify(model, x, budget):
    p = jax.vmap(lambda xi: model.predict(xi, budget=budget))(x)
    return jnp.argmax(p.logits, -1), p.steps, p.residual, p.converged


def _scores(model, x, labels, budget) -> dict[str, Any]:
    """Accuracy and the solves' statistics at a solver budget (an array: one compilation for
    every budget)."""
    preds, used, residual, converged = (on_host(a) for a in _classify(model, x, budget))
    return dict(
        test_accuracy=float(np.mean(preds == labels)),
        mean_steps=float(used.mean()),
        converged=float(converged.mean()),
        mean_relative_residual=float(residual.mean()),
        steps=used,
    )


class DigitsTask(AbstractTask):
    """The scikit-learn digits: a fixed, stratified split of 1,438 training and 359 test
    images; a DEQ transformer or its explicit twin classifies the token sequence.

    **Example:**

    ```python
    from eqattn import digits

    task = digits.DigitsTask(digits.DigitsConfig(tokens="patches", train_size=64))
    x, y = task.example_batch()  # 64 images as 16 patches of 2 x 2
    assert x.shape == (64, 16, 4) and y.shape == (64,)
    ```
    """

    name = "digits"
    description = "classify the scikit-learn digits"
    config_type = DigitsConfig
    score = "train_accuracy"
    bar_name = "acc"
    headline = Headline("test_accuracy", "test", ".3f", ".2%", higher_is_better=True)
    processes = True
    config: DigitsConfig

    def __init__(self, config: DigitsConfig):
        self.digits = digits = load_digits()
        images, labels = digits.train_images, digits.train_labels
        if config.train_size is not None:
            images, labels = images[: config.train_size], labels[: config.train_size]
        self.images, self.labels, self.tokens = images, labels, config.tokens
        self.test_x = tokenize(digits.test_images, self.tokens)
        self.config = config
        self.examples = len(labels)
        self.batch = min(config.batch_size, self.examples)
        self.steps_per_epoch = self.examples // self.batch

    @property
    def label(self):
        return self.tokens

    @property
    def warm_start(self) -> bool:
        return self.config.warm_start

    @classmethod
    def build_model(cls, config, key, *, dtype=None):
        config = with_shape(cls.build_model, config)
        tokens, features = TOKENS[config.tokens]
        io = dict(in_features=features, max_len=tokens)
        return config.transformer(NUM_CLASSES, key, dtype=dtype, **io)

    def example_batch(self):
        x0 = jnp.asarray(tokenize(self.images[: self.batch], self.tokens))
        return x0, self.labels[: self.batch]

    def batches(self, rng, place):
        perm = rng.permutation(self.examples)
        x_all = tokenize(shift_images(self.images, self.config.shift, rng), self.tokens)
        for i in range(self.steps_per_epoch):
            idx = perm[i * self.batch : (i + 1) * self.batch]
            if place is None:
                yield (x_all[idx], self.labels[idx]), idx
            else:
                yield tuple(place.batch(x_all, self.labels, idx)), idx

    @classmethod
    def train_step(cls, config, optimizer):
        return make_train_step(config, optimizer)

    def test_metrics(self, model, final):
        s = _scores(model, self.test_x, self.digits.test_labels, None)
        return dict(
            test_accuracy=s["test_accuracy"],
            test_mean_solver_steps=s["mean_steps"],
            test_mean_relative_residual=s["mean_relative_residual"],
            test_converged=s["converged"],
        )

    def record(self, *, steps, train_time):
        return dict(train_examples=self.examples, test_examples=len(self.digits.test_labels))

    @classmethod
    def evaluate(cls, model, config, header, budgets, progress):
        digits = load_digits()
        x = jnp.asarray(tokenize(digits.test_images, config.tokens))
        labels = digits.test_labels
        deq = config.model == "deq"
        with progress_bar(1 + deq * len(budgets), "evaluate", progress, "budget") as bar:
            trained = _scores(model, x, labels, jnp.asarray(config.max_steps))
            bar.update()
            result: dict[str, Any] = {
                "model": config.model,
                "test_examples": len(labels),
                "test_accuracy": trained["test_accuracy"],
                "trained_epochs": header.get("epoch"),
                "accuracy_at_save": header.get("test_accuracy"),
            }
            if not deq:
                return result
            used = trained["steps"]
            result["solver_steps"] = {
                "max_steps": config.max_steps,
                "mean": float(used.mean()),
                "median": float(np.median(used)),
                "p90": float(np.percentile(used, 90)),
                "max": int(used.max()),
                "converged": trained["converged"],
                "mean_relative_residual": trained["mean_relative_residual"],
                "per_example": used.tolist(),
            }

            def row(budget):
                bar.update()
                scores = _scores(model, x, labels, jnp.asarray(budget))
                del scores["steps"]
                return scores

            result["budget_sweep"], result["sweep_converged_at"] = budget_sweep(budgets, row)
        return result

    @classmethod
    def summary(cls, metrics):
        return (
            f"{metrics['config']['model']}: test accuracy {metrics['test_accuracy']:.2%} "
            f"({metrics['test_examples']} images) | {run_line(metrics)}"
        )

    @classmethod
    def evaluation_report(cls, r):
        lines = [
            f"test accuracy {r['test_accuracy']:.2%} ({r['test_examples']} images, "
            f"{r['model']} model)"
        ]
        if "solver_steps" not in r:
            return lines
        s = r["solver_steps"]
        lines.append(
            f"solver steps per example: mean {s['mean']:.1f}, median {s['median']:.0f}, "
            f"90th percentile {s['p90']:.0f}, max {s['max']} (limit {s['max_steps']}); "
            f"{s['converged']:.1%} converged"
        )
        lines.append("max steps  accuracy  mean steps  converged  rel. residual")
        for row in r["budget_sweep"]:
            lines.append(
                f"{row['max_steps']:>9}  {row['test_accuracy']:>8.2%}  {row['mean_steps']:>10.1f}  "
                f"{row['converged']:>9.1%}  {row['mean_relative_residual']:>13.1e}"
            )
        return lines + sweep_note(r)


def load_model(run: str | os.PathLike, *, max_steps: int | None = None) -> eqx.Module:
    """The model of a digits run (its directory, or a checkpoint file), its DEQ's step limit
    raised to `max_steps` if given ([`eqattn.train.load_model`][] gives the configuration and
    header too).

    **Example:**

    ```python
    from eqattn import digits

    try:
        digits.load_model("no/such/run")
    except digits.RunError as error:
        assert str(error).startswith("checkpoint not found")
    ```
    """
    return train.load_model(Path(run), DigitsTask, max_steps).model
