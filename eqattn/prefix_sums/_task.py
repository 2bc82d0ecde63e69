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
from ..train import ConfigError, ReasoningTask, run_line
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
    try:
        dim, _, hidden = deq.reasoner.twin_shape(config.depth)
    except ValueError as error:  # no twin of the DEQ's parameters at this depth
        raise ConfigError(str(error)) from None
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
    return PrefixSumsTask.evaluate_sizes(model, config, budgets, tick=tick, sweep=sweep)


class PrefixSumsTask(ReasoningTask):
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
    unit, part, part_metric = "strings", "bits", "test_bit_accuracy"
    count_setting = "test_strings"
    budget_rule = "4 n + 100"
    config: PrefixSumsConfig

    @classmethod
    def sizes(cls, config):
        return config.lengths

    @classmethod
    def test_sizes(cls, config):
        return config.test_lengths

    @classmethod
    def draw(cls, config, rng):
        return draw_batch(rng, config.batch_size, config.lengths)

    @classmethod
    def held_out(cls, config, seed, size):
        return _strings(seed, config.test_strings, size)

    @classmethod
    def score_set(cls, model, instances, budget):
        bits, targets = instances
        return score(model, bits, targets, budget=budget)

    @classmethod
    def budget_for(cls, size):
        return budget_for(size)

    @classmethod
    def longer_size(cls, size):
        return LONGER * size

    @classmethod
    def sweep_budgets(cls, size):
        return [max(2, size // 2), size, 2 * size, budget_for(size)]

    @classmethod
    def loss(cls, config, model, data, key):
        bits, targets = data
        return mixed_loss(model, bits, targets, key, extra=config.train_steps)

    @classmethod
    def with_shape(cls, config):
        """The twin's shape by [`PrefixSumsModel.matched`][eqattn.prefix_sums.PrefixSumsModel.matched]'s
        rule (`shaped`)."""
        return shaped(config)

    @classmethod
    def build_model(cls, config, key, *, dtype=None):
        """A [`PrefixSumsModel`][eqattn.prefix_sums.PrefixSumsModel]: the DEQ, or its twin."""
        return build(config, key, dtype)

    def record(self, *, steps, train_time):
        m = self.config
        return dict(
            model_shape=self.model_shape(m),
            lengths=list(m.lengths),
            longer_bits=LONGER * max(m.lengths),
            train_strings=steps * self.batch,
            test_strings=m.test_strings,
        )

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
        low, high = min(result["trained_sizes"]), max(result["trained_sizes"])
        lines = [
            f"prefix sums ({result['model']} model, trained on {low}-{high} bits): strings with "
            "every bit right"
            + (f", at the solver budget rule {result['budget_rule']}" if deq else ""),
            "   bits  strings  budget  steps  converged  strings right  bits right",
        ]
        for r in result["sizes"]:
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
    def trained_on(cls, config):
        low, high = min(config.lengths), max(config.lengths)
        return f"trained on strings of {low}-{high} bits; strings with every bit right:"

    @classmethod
    def size_label(cls, n):
        return f"{n:>6} bits"


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
