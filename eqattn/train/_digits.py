"""`eqattn train --task digits` (the default): classify the scikit-learn digits, 8 x 8 images
read as 8 row tokens (or 16 patches of 2 x 2), scored by test accuracy."""

from __future__ import annotations

import dataclasses
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from .. import data, nn
from ._config import ModelConfig, TrainConfig
from ._evaluation import budget_sweep, progress_bar, sweep_note
from ._models import (
    correction_segments,
    deq_options,
    explicit_shape,
    predict,
    predict_corrected,
)
from ._placement import on_host
from ._step import apply, penalties, probed
from ._task import AbstractTask, Headline, run_line

NUM_CLASSES = 10


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


def make_train_step(model_config: ModelConfig, config: TrainConfig, optimizer):
    """The digits' optimizer step (`Step`), with the DEQ levers of `config` (training step
    budget, warm start from `z0` (None: zeros), Jacobian penalty, fixed-point correction).
    `stats` = (accuracy, mean solver steps, mean relative residual, fraction converged)."""
    deq = model_config.model == "deq"
    regularize = deq and config.jacobian_weight > 0
    segments = None
    if deq and config.corrections:
        budget = min(config.train_steps or model_config.max_steps, model_config.max_steps)
        segments = correction_segments(budget, config.corrections)
        weights = config.correction_decay ** jnp.arange(len(segments) - 1, -1, -1.0)
        weights = weights / weights.sum()

    def loss_fn(model, x, y, key, z0):
        def one(xi, ki, zi):
            if segments is not None:
                return predict_corrected(model, xi, segments, key=ki, z0=zi)
            return predict(model, xi, config.train_steps, key=ki, z0=zi)

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
    p = jax.vmap(lambda xi: predict(model, xi, budget))(x)
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
    """The scikit-learn digits: a fixed, stratified split of 1,437 training and 359 test
    images; a DEQ transformer or its explicit baseline classifies the token sequence.

    **Example:**

    ```python
    from eqattn import train

    task = train.DigitsTask(train.ModelConfig(tokens="patches"), train.TrainConfig(train_size=64))
    x, y = task.example_batch()  # 64 images as 16 patches of 2 x 2
    assert x.shape == (64, 16, 4) and task.model_config.num_tokens == 16
    ```
    """

    name = "digits"
    description = "classify the scikit-learn digits"
    options = frozenset(
        ("tokens", "num_tokens", "in_features", "shift", "train_size", "warm_start")
        + ("corrections", "correction_decay")
    )
    score = "train_accuracy"
    bar_name = "acc"
    headline = Headline("test_accuracy", "test", ".3f", ".2%", higher_is_better=True)
    warm_start = True
    processes = True

    def __init__(self, model_config: ModelConfig, config: TrainConfig):
        self.digits = digits = data.load_digits()
        images, labels = digits.train_images, digits.train_labels
        if config.train_size is not None:
            images, labels = images[: config.train_size], labels[: config.train_size]
        self.images, self.labels, self.tokens = images, labels, model_config.tokens
        self.test_x = data.tokenize(digits.test_images, self.tokens)
        self.config = config
        self.examples = len(labels)
        self.batch = min(config.batch_size, self.examples)
        self.steps_per_epoch = self.examples // self.batch
        shape = data.tokenize(images[:1], self.tokens).shape
        self.model_config = dataclasses.replace(
            model_config, num_tokens=shape[1], in_features=shape[2]
        )

    @property
    def label(self):
        return self.tokens

    @classmethod
    def build_model(cls, config, key, *, width=None, mlp_ratio=2.0, dtype=None):
        io = dict(in_features=config.in_features, max_len=config.num_tokens, dtype=dtype)
        if config.model == "deq":
            return nn.DEQTransformer(
                NUM_CLASSES, config.dim, config.heads, key=key, **deq_options(config), **io
            )
        if width is None:
            width, mlp_ratio = explicit_shape(cls.build_model, config)
        return nn.Transformer(
            NUM_CLASSES,
            width,
            config.heads,
            config.depth,
            key=key,
            dropout=config.dropout,
            mlp_ratio=mlp_ratio,
            **io,
        )

    def example_batch(self):
        x0 = jnp.asarray(data.tokenize(self.images[: self.batch], self.tokens))
        return x0, self.labels[: self.batch]

    def batches(self, rng, place):
        perm = rng.permutation(self.examples)
        x_all = data.tokenize(shift_images(self.images, self.config.shift, rng), self.tokens)
        for i in range(self.steps_per_epoch):
            idx = perm[i * self.batch : (i + 1) * self.batch]
            if place is None:
                yield (x_all[idx], self.labels[idx]), idx
            else:
                yield tuple(place.batch(x_all, self.labels, idx)), idx

    @classmethod
    def train_step(cls, model_config, config, optimizer):
        return make_train_step(model_config, config, optimizer)

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
        digits = data.load_digits()
        x = jnp.asarray(data.tokenize(digits.test_images, config.tokens))
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
            f"{metrics['model_config']['model']}: test accuracy {metrics['test_accuracy']:.2%} "
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
