"""The prefix-sums task of `eqattn train`: the DEQ or its explicit twin trained on short strings
(`mixed_loss`), scored on strings up to 16 times longer, where a DEQ's solve runs as many steps
as the string is long."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import numpy as np

from .. import nn, train
from ..train import (
    AbstractTask,
    ConfigError,
    Headline,
    apply,
    budget_sweep,
    progress_bar,
    run_line,
)
from ._config import PrefixSumsConfig
from ._data import draw_batch, draw_bits, prefix_parity
from ._model import PrefixSumsModel
from ._training import mixed_loss, score

LONGER = 4
"""The final test also scores strings this many times the longest training length."""


def budget_for(n: int) -> int:
    """The DEQ's solver budget on strings of `n` bits: `4 n + 100` (a step carries the parity
    one bit further; the margin lets the solve settle).

    **Example:**

    ```python
    from eqattn import prefix_sums

    assert prefix_sums.budget_for(512) == 2148
    ```
    """
    return 4 * n + 100


def shaped(config: PrefixSumsConfig) -> PrefixSumsConfig:
    """`config` with the explicit twin's `width` and `mlp_ratio` filled in when not given:
    [`PrefixSumsModel.matched`][eqattn.prefix_sums.PrefixSumsModel.matched]'s shape (what a run
    records, so that its checkpoint rebuilds the same model)."""
    if config.model != "explicit" or config.width is not None:
        return config
    deq = eqx.filter_eval_shape(
        lambda: PrefixSumsModel.deq(config.dim, config.heads, key=jax.random.key(0))
    )
    assert config.depth is not None  # resolved by the configuration
    dim, _, hidden = deq.reasoner.twin_shape(config.depth)
    return dataclasses.replace(config, width=dim, mlp_ratio=hidden / dim)


def build(config: PrefixSumsConfig, key, dtype=None) -> PrefixSumsModel:
    """The DEQ of `config`, or its explicit twin (`shaped`)."""
    if config.model == "deq":
        return PrefixSumsModel.deq(
            config.dim,
            config.heads,
            key=key,
            solver=config.deq_solver(),
            adjoint=config.deq_adjoint(),
            dtype=dtype,
        )
    config = shaped(config)
    assert config.width is not None and config.mlp_ratio is not None and config.depth
    hidden = max(1, round(config.mlp_ratio * config.width))
    heads = nn.GraphReasoner.twin_heads(config.width, config.heads)
    return PrefixSumsModel.explicit(
        config.width, heads, depth=config.depth, key=key, hidden=hidden, dtype=dtype
    )


def _strings(seed: int, count: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    bits = draw_bits(np.random.default_rng(seed), count, n)
    return bits, prefix_parity(bits)


def evaluate_lengths(
    model: PrefixSumsModel,
    config: PrefixSumsConfig,
    budgets=None,
    *,
    tick=None,
    sweep: bool = True,
) -> list[dict[str, Any]]:
    """One row per length of `test_lengths`: `test_strings` strings (drawn from the length as
    seed) scored at the budget rule (`budget_for`), and for a DEQ, with `sweep`, against the
    solver budget (`budgets`, default `n / 2`, `n`, `2 n` and the rule; stopped once every
    solve converged).

    **Example:**

    ```python
    import jax
    from eqattn import prefix_sums

    config = prefix_sums.PrefixSumsConfig(dim=8, heads=2, test_lengths=(6,), test_strings=4)
    model = prefix_sums.PrefixSumsTask.build_model(config, jax.random.key(0))
    (row,) = prefix_sums.evaluate_lengths(model, config)
    assert row["n"] == 6 and row["budget_rule"] == 124 and 0 <= row["at_rule"]["strings"] <= 1
    ```
    """
    rows = []
    for n in config.test_lengths:
        bits, targets = _strings(10_000 + n, config.test_strings, n)
        row: dict[str, Any] = dict(n=n, strings=len(bits), budget_rule=budget_for(n))
        row["at_rule"] = score(model, bits, targets, budget=budget_for(n))
        if model.is_deq and sweep:
            steps = budgets or [max(2, n // 2), n, 2 * n, budget_for(n)]
            row["sweep"], _ = budget_sweep(
                sorted(set(steps)), lambda b: score(model, bits, targets, budget=b)
            )
        rows.append(row)
        if tick is not None:
            tick()
    return rows


class PrefixSumsTask(AbstractTask):
    """Bit strings of `lengths` bits drawn afresh for every step; after each epoch a fixed set
    of strings of the longest training length is scored (the validation score keeps
    `best.eqx`), at the end another, and strings `LONGER` times as long. `evaluate` scores
    `test_lengths` (32 to 512 bits by default) against the solver's budget. A string counts
    only if every output bit is right.

    **Example:**

    ```python
    from eqattn import prefix_sums

    task = prefix_sums.PrefixSumsTask(prefix_sums.PrefixSumsConfig(lengths=(4, 8)))
    bits, targets = task.example_batch()
    assert [b.shape for b in bits] == [(8, 4), (8, 8)] and task.batch == 16
    ```
    """

    name = "prefix-sums"
    description = "a bit string's running parity, trained on short strings and tested on long"
    config_type = PrefixSumsConfig
    score = "train_accuracy"
    bar_name = "acc"
    headline = Headline("validation_accuracy", "val", ".3f", ".2%", higher_is_better=True)
    config: PrefixSumsConfig

    def __init__(self, config: PrefixSumsConfig):
        if jax.process_count() > 1:
            raise ConfigError("the prefix-sums task runs in one process")
        self.config = config
        self.batch = config.batch_size * len(config.lengths)
        self.steps_per_epoch = config.epoch_steps
        self.examples = self.batch * self.steps_per_epoch
        n = max(config.lengths)
        self.validation = _strings(1, config.test_strings, n)
        self.test = _strings(2, config.test_strings, n)
        self.longer = _strings(3, config.test_strings, LONGER * n)

    @classmethod
    def with_shape(cls, config):
        """The twin's shape by [`PrefixSumsModel.matched`][eqattn.prefix_sums.PrefixSumsModel.matched]'s
        rule (`shaped`)."""
        return shaped(config)

    @classmethod
    def build_model(cls, config, key, *, dtype=None):
        """A [`PrefixSumsModel`][eqattn.prefix_sums.PrefixSumsModel]: the DEQ, or its twin."""
        return build(config, key, dtype)

    def example_batch(self):
        rng = np.random.default_rng(0)
        return draw_batch(rng, self.config.batch_size, self.config.lengths)

    def batches(self, rng, place):
        for _ in range(self.steps_per_epoch):
            yield draw_batch(rng, self.config.batch_size, self.config.lengths), None

    @classmethod
    def train_step(cls, config, optimizer):
        def step(model, opt_state, bits, targets, key, z0):
            del z0  # no warm start
            (loss, stats), grads = eqx.filter_value_and_grad(
                lambda m: mixed_loss(m, bits, targets, key, extra=config.train_steps),
                has_aux=True,
            )(model)
            return *apply(optimizer, model, opt_state, grads), loss, stats, None

        return step

    def _score(self, model, strings) -> dict[str, float]:
        bits, targets = strings
        return score(model, bits, targets, budget=budget_for(bits.shape[1]))

    def test_metrics(self, model, final):
        out = dict(validation_accuracy=self._score(model, self.validation)["strings"])
        if final:
            test, longer = self._score(model, self.test), self._score(model, self.longer)
            out.update(
                test_accuracy=test["strings"],
                test_bit_accuracy=test["bits"],
                test_mean_solver_steps=test["steps"],
                test_converged=test["converged"],
                test_accuracy_longer=longer["strings"],
                test_converged_longer=longer["converged"],
            )
        return out

    def record(self, *, steps, train_time):
        m = self.config
        shape: dict[str, Any] = {"dim": m.dim, "heads": m.heads}
        if m.model == "explicit":
            shape = {"depth": m.depth, "width": m.width, "mlp_ratio": m.mlp_ratio}
        return dict(
            model_shape=shape,
            lengths=list(m.lengths),
            longer_bits=LONGER * max(m.lengths),
            train_strings=steps * self.batch,
            test_strings=m.test_strings,
        )

    @classmethod
    def default_budgets(cls, config) -> list[int] | None:
        return None  # per length (`evaluate_lengths`)

    @classmethod
    def evaluate(cls, model, config, header, budgets, progress):
        total = len(config.test_lengths)
        with progress_bar(total, "evaluate", progress, "length") as bar:
            rows = evaluate_lengths(model, config, budgets, tick=bar.update)
        return {
            "model": config.model,
            "trained_epochs": header.get("epoch"),
            "trained_lengths": list(config.lengths),
            "budget_rule": "4 n + 100",
            "lengths": rows,
        }

    @classmethod
    def summary(cls, metrics):
        low, high = min(metrics["lengths"]), max(metrics["lengths"])
        return (
            f"{metrics['config']['model']}: strings right {metrics['test_accuracy']:.2%} at "
            f"{high} bits ({metrics['test_strings']} strings; trained on {low}-{high} bits), "
            f"{metrics['test_accuracy_longer']:.2%} at {metrics['longer_bits']} bits "
            f"| {run_line(metrics)}"
        )

    @classmethod
    def evaluation_report(cls, result):
        deq = result["model"] == "deq"
        low, high = min(result["trained_lengths"]), max(result["trained_lengths"])
        lines = [
            f"prefix sums ({result['model']} model, trained on {low}-{high} bits): strings with "
            "every bit right"
            + (f", at the solver budget rule {result['budget_rule']}" if deq else ""),
            "   bits  strings  budget  steps  converged  strings right  bits right",
        ]
        for r in result["lengths"]:
            a = r["at_rule"]
            solve = (
                train.solve_cells(r["budget_rule"], a["steps"], a["converged"])
                if deq
                else train.solve_cells(None, None, None)
            )
            lines.append(
                f"{r['n']:>7} {r['strings']:>8} {solve} {a['strings']:>14.2%} {a['bits']:>11.2%}"
            )
            if deq and len(r["sweep"]) > 1:
                cells = [f"{s['max_steps']}: {s['strings']:.1%}" for s in r["sweep"]]
                lines.append("    against the budget: " + ", ".join(cells))
        return lines

    @classmethod
    def comparison(cls, runs):
        """Each run's strings right at every test length (at the budget rule), side by side."""
        scored = {}
        for model, run in runs.items():
            loaded = train.load_model(Path(run), cls)
            rows = evaluate_lengths(loaded.model, loaded.config, sweep=False)
            scored[model] = {r["n"]: r["at_rule"]["strings"] for r in rows}
        low, high = min(loaded.config.lengths), max(loaded.config.lengths)
        lines = [f"trained on strings of {low}-{high} bits; strings with every bit right:"]
        for n in loaded.config.test_lengths:
            cells = ", ".join(f"{m} {s[n]:.2%}" for m, s in scored.items())
            lines.append(f"{n:>6} bits: {cells}")
        return lines


def load_model(run: str | os.PathLike, *, max_steps: int | None = None) -> eqx.Module:
    """The model of a prefix-sums run (its directory, or a checkpoint file: the run's `best.eqx`
    is its best validated model), its DEQ's step limit raised to `max_steps` if given.

    **Example:**

    ```python
    from eqattn import prefix_sums, train

    try:
        prefix_sums.load_model("no/such/run")
    except train.RunError as error:
        assert str(error).startswith("checkpoint not found")
    ```
    """
    return train.load_model(Path(run), PrefixSumsTask, max_steps).model
