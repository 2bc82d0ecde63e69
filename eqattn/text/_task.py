"""The text task: a causal byte-level language model (DEQ or explicit) on a corpus of
documents, scored in bits per byte."""

from __future__ import annotations

import math
import os
import platform
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from .. import train
from ..train import (
    AbstractTask,
    ConfigError,
    Headline,
    RunError,
    apply,
    budget_sweep,
    penalties,
    probed,
    progress_bar,
    read_metrics,
    run_line,
    sweep_note,
    with_shape,
)
from ._config import TextConfig
from ._corpus import BYTES, Corpus, load_corpus
from ._scores import batches, bits_per_byte, cached_batches, reported_bits_per_byte, spread
from ._windows import evaluation_windows, training_batch

VALIDATION_WINDOWS = 64
"""Windows of the validation split scored after each epoch (spread over the whole split)."""
TOKENS_PER_GRADIENT = 4096
"""A text step differentiates at most this many tokens at a time: the batch's windows in
chunks whose gradients are summed (the same step; the memory of one chunk). A context of 4096
at batch 16 takes 16 chunks of one window."""


def protocol(context: int) -> dict[str, Any]:
    """The evaluation protocol, as metrics.json records it."""
    return {
        "documents": "each file (or piece) on its own: no context across documents",
        "context": context,
        "stride": context // 2,
        "scored": "every byte of the split exactly once, after START and the bytes before it in "
        "its document; a byte past a document's first window has at least context - stride "
        "bytes of history",
        "unit": "bits per byte: mean of -log2 p(byte | history)",
        "causal": "a DEQ's test figure solves each scored byte's row against the earlier rows' "
        "fixed points (its equilibrium cache), so no prediction reads a later byte; its "
        "validation figure and the budget sweep solve a window's rows jointly, which lets "
        "later bytes move earlier predictions within the solver's tolerance",
    }


def windows_per_chunk(batch: int, context: int, tokens: int = TOKENS_PER_GRADIENT) -> int:
    """The largest divisor of `batch` whose windows hold at most `tokens` tokens (at least 1)."""
    most = max(1, tokens // context)
    return max(d for d in range(1, min(batch, most) + 1) if batch % d == 0)


def make_text_train_step(config: TextConfig, optimizer, tokens=TOKENS_PER_GRADIENT):
    """`step(model, opt_state, x, (targets, weights), key, z0)`: one optimizer step on windows
    (`Step`); the loss is the mean cross-entropy (nats) of the scored positions; `stats` =
    (bits per byte, solver steps, relative residual, converged). The gradient is summed over
    chunks of at most `tokens` tokens (`windows_per_chunk`)."""

    regularize = config.model == "deq" and config.jacobian_weight > 0

    def chunk_loss(model, x, labels, keys, scored, windows, penalized):
        """The chunk's share of the batch's loss and statistics: sums over its windows,
        divided by the batch's scored positions and windows (the penalty's, over the batch's
        `penalized` windows)."""
        targets, weights = labels
        budget = config.training_budget
        p = jax.vmap(lambda xi, ki: model.predict(xi, budget=budget, key=ki))(x, keys[0])
        nats = optax.softmax_cross_entropy_with_integer_labels(p.logits, targets)
        loss = jnp.sum(nats * weights) / scored
        stats = tuple(jnp.sum(a) / windows for a in (p.steps, p.residual, p.converged))
        stats = (loss / math.log(2), *stats)
        if regularize:  # the Jacobian penalty at each window's fixed point (same dropout masks)
            penalty = penalties(model, x, p.fixed_point, keys, probed(config, len(x)))
            loss = loss + config.jacobian_weight * jnp.sum(penalty) / penalized
        return loss, stats

    grad = eqx.filter_value_and_grad(chunk_loss, has_aux=True)

    def step(model, opt_state, x, labels, key, z0):
        del z0  # no warm start for text
        batch, context = x.shape
        keys = jax.random.split(key, (2, batch))
        per = windows_per_chunk(batch, context, tokens)
        penalized = probed(config, per) * (batch // per)
        totals = (jnp.maximum(jnp.sum(labels[1]), 1), batch, penalized)
        if per == batch:
            (loss, stats), grads = grad(model, x, labels, keys, *totals)
        else:  # a scan over chunks: one chunk's memory, the gradients summed
            split = lambda a: a.reshape(batch // per, per, *a.shape[1:])  # noqa: E731
            chunks = (split(x), jax.tree.map(split, labels), jnp.moveaxis(split(keys.T), 2, 1))

            def add(total, chunk):
                return jax.tree.map(jnp.add, total, grad(model, *chunk, *totals)), None

            first = jax.tree.map(lambda a: a[0], chunks)
            shapes = eqx.filter_eval_shape(grad, model, *first, *totals)
            zero = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
            ((loss, stats), grads), _ = jax.lax.scan(add, zero, chunks)
        return *apply(optimizer, model, opt_state, grads), loss, stats, None

    return step


def corpus_of(header: dict[str, Any]) -> Corpus:
    """The corpus a text checkpoint was trained on (its `text` paths, else the default), checked
    against the SHA-256 its run recorded when the header has it."""
    try:
        corpus = load_corpus(header["config"]["text"])
    except (ValueError, FileNotFoundError) as error:
        raise RunError(f"cannot load the checkpoint's corpus: {error}") from None
    expected = header.get("corpus_sha256")
    if expected is not None and expected != corpus.info["sha256"]:
        raise RunError(
            "the corpus has changed since this checkpoint was trained (its SHA-256 differs): "
            "its bits per byte would not be comparable"
        )
    return corpus


class TextTask(AbstractTask):
    """Each epoch is `epoch_steps` optimizer steps on random windows of the training documents;
    after it, bits per byte on `VALIDATION_WINDOWS` validation windows; the metrics' test bits
    per byte score the whole test split when the run is done (not when Ctrl-C stops it, which
    must end promptly: `eqattn.train.evaluate` scores any checkpoint).

    **Example:**

    ```python
    import pathlib, tempfile
    from eqattn import text

    folder = pathlib.Path(tempfile.mkdtemp())
    for i in range(40):
        (folder / f"{i}.txt").write_text(f"line {i}\\n" * 4)
    config = text.TextConfig(model="explicit", context=16, text=(str(folder),))
    x, (targets, weights) = text.TextTask(config).example_batch()  # 16 windows of 16 bytes
    assert x.shape == targets.shape == (16, 16)
    ```
    """

    name = "text"
    description = "a causal byte-level language model on a corpus of files"
    config_type = TextConfig
    score = "train_bits_per_byte"
    bar_name = "bpb"
    headline = Headline("validation_bits_per_byte", "val", ".3f", ".3f", higher_is_better=False)
    config: TextConfig

    def __init__(self, config: TextConfig):
        if jax.process_count() > 1:
            raise ConfigError("the text task runs in one process")
        try:
            self.corpus = load_corpus(config.text)
        except (ValueError, FileNotFoundError) as error:
            raise ConfigError(str(error)) from None
        if max(len(d) for d in self.corpus.train) < 2:
            raise ConfigError("the corpus's training documents are all shorter than 2 bytes")
        self.config = config
        self.batch = config.batch_size
        self.steps_per_epoch = config.epoch_steps
        self.examples = self.corpus.info["bytes"]["train"]
        windows = evaluation_windows(self.corpus.validation, config.context)
        self.validation = spread(windows, VALIDATION_WINDOWS)
        self.test_windows = evaluation_windows(self.corpus.test, config.context)

    @classmethod
    def build_model(cls, config, key, *, dtype=None):
        config = with_shape(cls.build_model, config)
        io = dict(vocab_size=BYTES + 1, max_len=config.context, pooling="none", causal=True)
        return config.transformer(BYTES, key, dtype=dtype, **io)

    def example_batch(self):
        rng = np.random.default_rng(0)
        w = training_batch(self.corpus.train, rng, self.batch, self.config.context)
        return jnp.asarray(w.inputs), (w.targets, w.weights)

    def batches(self, rng, place):
        for _ in range(self.steps_per_epoch):
            w = training_batch(self.corpus.train, rng, self.batch, self.config.context)
            yield (w.inputs, (w.targets, w.weights)), None

    @classmethod
    def train_step(cls, config, optimizer):
        return make_text_train_step(config, optimizer)

    def test_metrics(self, model, final):
        validation = bits_per_byte(model, self.validation)
        out = dict(validation_bits_per_byte=validation["bits_per_byte"])
        if final:
            test = reported_bits_per_byte(model, self.test_windows)
            out.update(
                test_bits_per_byte=test["bits_per_byte"],
                test_scored_bytes=test["scored_bytes"],
                test_mean_solver_steps=test["mean_solver_steps"],
                test_mean_relative_residual=test["mean_relative_residual"],
                test_converged=test["converged"],
            )
        return out

    def header(self):
        return {"corpus_sha256": self.corpus.info["sha256"]}

    def record(self, *, steps, train_time):
        info = dict(self.corpus.info)
        if info["source"] != "paths":
            info["python"] = platform.python_version()
        m = self.config
        shape: dict[str, Any] = {
            "dim": m.dim,
            "cell_depth": m.cell_depth,
            "stem_depth": m.stem_depth,
            "attend_input": m.attend_input,
        }
        if m.model == "explicit":  # its width matches the DEQ's parameters
            shape = {"depth": m.depth, "width": m.width, "mlp_ratio": m.mlp_ratio}
        tokens = steps * self.batch * m.context
        return dict(
            model_shape=shape,
            corpus=info,
            evaluation=protocol(m.context),
            train_tokens_per_s=tokens / train_time if train_time else None,
            windows_per_gradient_chunk=windows_per_chunk(self.batch, m.context),
            validation_windows=len(self.validation.inputs),
        )

    @classmethod
    def evaluate(cls, model, config, header, budgets, progress):
        corpus = corpus_of(header)
        windows = evaluation_windows(corpus.test, config.context)
        deq = config.model == "deq"
        total = (cached_batches(windows) if deq else 0) + batches(windows) * (deq * len(budgets))
        with progress_bar(total or batches(windows), "evaluate", progress) as bar:
            budget = jnp.asarray(config.max_steps)
            trained = reported_bits_per_byte(model, windows, budget, bar.update)
            result: dict[str, Any] = {
                "model": config.model,
                "test_bits_per_byte": trained["bits_per_byte"],
                "test_scored_bytes": trained["scored_bytes"],
                "corpus": corpus.info,
                "evaluation": protocol(config.context),
                "trained_epochs": header.get("epoch"),
            }
            if not deq:
                return result
            result["solver_steps"] = {
                "max_steps": config.max_steps,
                "mean": trained["mean_solver_steps"],
                "converged": trained["converged"],
                "mean_relative_residual": trained["mean_relative_residual"],
            }

            def row(budget):
                return bits_per_byte(model, windows, jnp.asarray(budget), bar.update)

            result["budget_sweep"], result["sweep_converged_at"] = budget_sweep(budgets, row)
        return result

    @classmethod
    def summary(cls, metrics):
        documents = metrics["corpus"]["documents"]["test"]
        return (
            f"{metrics['config']['model']}: test {metrics['test_bits_per_byte']:.3f} bits "
            f"per byte ({metrics['test_scored_bytes']:,} bytes of {documents} "
            f"document{'s' * (documents != 1)}) | {run_line(metrics)}"
        )

    @classmethod
    def comparison(cls, runs):
        cells = [
            f"{model} {m['test_bits_per_byte']:.3f} ({m['params']:,} parameters, "
            f"{m['train_time_s']:.0f} s training)"
            for model, m in read_metrics(runs).items()
        ]
        return ["test bits per byte: " + ", ".join(cells)]

    @classmethod
    def evaluation_report(cls, r):
        lines = [
            f"test {r['test_bits_per_byte']:.4f} bits per byte ({r['test_scored_bytes']:,} "
            f"bytes, {r['model']} model; windows of {r['evaluation']['context']}, stride "
            f"{r['evaluation']['stride']}"
            + (
                "; each byte's row solved against the cache: exactly causal)"
                if "solver_steps" in r
                else ")"
            )
        ]
        if "solver_steps" not in r:
            return lines
        s = r["solver_steps"]
        lines.append(
            f"solver steps per window: mean {s['mean']:.1f} (limit {s['max_steps']}); "
            f"{s['converged']:.1%} converged"
        )
        lines.append("against the budget, each window's rows solved jointly (not exactly causal):")
        lines.append("max steps  bits/byte  mean steps  converged  rel. residual")
        for row in r["budget_sweep"]:
            lines.append(
                f"{row['max_steps']:>9}  {row['bits_per_byte']:>9.4f}  "
                f"{row['mean_solver_steps']:>10.1f}  {row['converged']:>9.1%}  "
                f"{row['mean_relative_residual']:>13.1e}"
            )
        return lines + sweep_note(r)


def load_model(run: str | os.PathLike, *, max_steps: int | None = None) -> eqx.Module:
    """The language model of a text run (its directory, or a checkpoint file: the run's
    `best.eqx` is its best validated model), its DEQ's step limit raised to `max_steps` if
    given, for [`generate`][eqattn.text.generate] ([`eqattn.train.load_model`][] gives the
    configuration and header too).

    **Example:**

    ```python
    from eqattn import text

    try:
        text.load_model("no/such/run")
    except text.RunError as error:
        assert str(error).startswith("checkpoint not found")
    ```
    """
    return train.load_model(Path(run), TextTask, max_steps).model
