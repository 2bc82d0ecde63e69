"""`eqattn train --task text`: a causal byte-level language model (DEQ or explicit) on a corpus
of documents (`eqattn.text`), scored in bits per byte. The run directory, checkpoints,
`--resume`, the lock and the progress are those of the digits (`_train._Training`); this module
holds what differs: the data, the loss and the evaluation protocol."""

from __future__ import annotations

import math
import platform
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from .. import text
from ._errors import CommandError, UsageError
from ._models import explicit_shape, predict
from ._step import penalties, probed
from ._train import _Training

VALIDATION_WINDOWS = 64
"""Windows of the validation split scored after each epoch (spread over the whole split)."""
EVAL_BATCH = 32
"""Windows per evaluation call (the last call is padded with unscored windows)."""


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
    }


TOKENS_PER_GRADIENT = 4096
"""A text step differentiates at most this many tokens at a time: the batch's windows in
chunks whose gradients are summed (the same step; the memory of one chunk). `--context 4096`
at batch 16 takes 16 chunks of one window."""


def windows_per_chunk(batch: int, context: int, tokens: int = TOKENS_PER_GRADIENT) -> int:
    """The largest divisor of `batch` whose windows hold at most `tokens` tokens (at least 1)."""
    most = max(1, tokens // context)
    return max(d for d in range(1, min(batch, most) + 1) if batch % d == 0)


def make_text_train_step(model_config, config, optimizer, tokens=TOKENS_PER_GRADIENT):
    """`step(model, opt_state, x, (targets, weights), key, z0) -> (model, opt_state, loss,
    stats, None)`: one optimizer step on windows; the loss is the mean cross-entropy (nats) of
    the scored positions; `stats` = (bits per byte, solver steps, relative residual, converged).
    The gradient is summed over chunks of at most `tokens` tokens (`windows_per_chunk`)."""

    regularize = model_config.model == "deq" and config.jacobian_weight > 0

    def chunk_loss(model, x, labels, keys, scored, windows, penalized):
        """The chunk's share of the batch's loss and statistics: sums over its windows,
        divided by the batch's scored positions and windows (the penalty's, over the batch's
        `penalized` windows)."""
        targets, weights = labels
        p = jax.vmap(lambda xi, ki: predict(model, xi, config.train_steps, key=ki))(x, keys[0])
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
        params = eqx.filter(model, eqx.is_inexact_array)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return eqx.apply_updates(model, updates), opt_state, loss, stats, None

    return step


def make_text_evaluator():
    """`evaluate(model, windows, max_steps) -> (bits, scored, steps, residual, converged)`:
    summed bits and scored bytes of a batch of windows, and the solves' statistics per window."""

    @eqx.filter_jit
    def evaluate(model, x, targets, weights, max_steps):
        p = jax.vmap(lambda xi: predict(model, xi, max_steps))(x)
        nats = optax.softmax_cross_entropy_with_integer_labels(p.logits, targets)
        bits = jnp.sum(nats * weights) / math.log(2)
        return bits, jnp.sum(weights), p.steps, p.residual, p.converged

    return evaluate


def bits_per_byte(evaluate, model, windows: text.Windows, max_steps=None) -> dict[str, Any]:
    """Bits per byte of `windows` (in batches of `EVAL_BATCH`, the last padded) and the mean
    statistics of the solves."""
    n = len(windows.inputs)
    pad = -n % EVAL_BATCH
    arrays = [np.concatenate([a, np.zeros((pad, *a.shape[1:]), a.dtype)]) for a in windows]
    bits = scored = 0.0
    steps, residual, converged = [], [], []
    for i in range(0, n + pad, EVAL_BATCH):
        chunk = [jnp.asarray(a[i : i + EVAL_BATCH]) for a in arrays]
        b, s, st, r, c = evaluate(model, *chunk, max_steps)
        real = slice(0, min(EVAL_BATCH, n - i))
        bits, scored = bits + float(b), scored + float(s)
        steps.append(np.asarray(st)[real])
        residual.append(np.asarray(r)[real])
        converged.append(np.asarray(c)[real])
    return dict(
        bits_per_byte=bits / scored,
        scored_bytes=int(scored),
        mean_solver_steps=float(np.concatenate(steps).mean()),
        mean_relative_residual=float(np.concatenate(residual).mean()),
        converged=float(np.concatenate(converged).mean()),
    )


def _spread(windows: text.Windows, count: int) -> text.Windows:
    """`count` windows spread evenly over `windows` (all of them if fewer)."""
    idx = np.unique(np.linspace(0, len(windows.inputs) - 1, count).astype(int))
    return text.Windows(*(a[idx] for a in windows))


class TextTraining(_Training):
    """A text run: each epoch is `epoch_steps` optimizer steps on random windows of the
    training documents; after it, bits per byte on `VALIDATION_WINDOWS` validation windows; the
    metrics' test bits per byte score the whole test split when the run is done (not when
    Ctrl-C stops it, which must end promptly: `eqattn evaluate` scores any checkpoint)."""

    FIELDS = ("loss", "train_bits_per_byte", "solver_steps", "relative_residual", "converged")
    HEADLINE = ("validation_bits_per_byte", "val", ".3f", ".3f")
    BAR = "bpb"

    def _data(self, model_config, config) -> None:
        if config.warm_start:
            raise UsageError("--warm-start is for the digits (text windows are drawn afresh)")
        if config.corrections:
            raise UsageError("--corrections is for the digits (not yet for --task text)")
        if jax.process_count() > 1:
            raise UsageError("--task text runs in one process")
        try:
            self.corpus = text.load_corpus(config.text)
        except (ValueError, FileNotFoundError) as error:
            raise UsageError(str(error)) from None
        if max(len(d) for d in self.corpus.train) < 2:
            raise UsageError("the corpus's training documents are all shorter than 2 bytes")
        self.model_config = model_config
        self.batch = config.batch_size
        self.steps_per_epoch = config.epoch_steps
        self.total = self.steps_per_epoch * config.epochs
        self.n_train = self.corpus.info["bytes"]["train"]
        context = model_config.context
        windows = text.evaluation_windows(self.corpus.validation, context)
        self.validation = _spread(windows, VALIDATION_WINDOWS)
        self.test_windows = text.evaluation_windows(self.corpus.test, context)

    def _example_batch(self):
        w = text.training_batch(
            self.corpus.train, np.random.default_rng(0), self.batch, self.model_config.context
        )
        return jnp.asarray(w.inputs), (w.targets, w.weights)

    def _batches(self, epoch: int):
        for _ in range(self.steps_per_epoch):
            w = text.training_batch(
                self.corpus.train, self.rng, self.batch, self.model_config.context
            )
            yield (w.inputs, (w.targets, w.weights)), None

    def _make_step(self, optimizer):
        return make_text_train_step(self.model_config, self.config, optimizer)

    def _make_evaluator(self):
        return make_text_evaluator()

    def _test_metrics(self, final: bool) -> dict[str, Any]:
        validation = bits_per_byte(self.evaluate, self.model, self.validation)
        out = dict(validation_bits_per_byte=validation["bits_per_byte"])
        if final:
            test = bits_per_byte(self.evaluate, self.model, self.test_windows)
            out.update(
                test_bits_per_byte=test["bits_per_byte"],
                test_scored_bytes=test["scored_bytes"],
                test_mean_solver_steps=test["mean_solver_steps"],
                test_mean_relative_residual=test["mean_relative_residual"],
                test_converged=test["converged"],
            )
        return out

    def _header(self) -> dict[str, Any]:
        return {"corpus_sha256": self.corpus.info["sha256"]}

    def _sizes(self) -> dict[str, Any]:
        info = dict(self.corpus.info)
        if info["source"] != "--text":
            info["python"] = platform.python_version()
        steps = len(self.history) * self.steps_per_epoch
        tokens = steps * self.batch * self.model_config.context
        m = self.model_config
        shape = {
            "dim": m.dim,
            "cell_depth": m.cell_depth,
            "stem_depth": m.stem_depth,
            "attend_input": m.attend_input,
        }
        if m.model == "explicit":  # its width matches the DEQ's parameters
            width, mlp_ratio = explicit_shape(m)
            shape = {"depth": m.depth, "width": width, "mlp_ratio": mlp_ratio}
        return dict(
            task="text",
            model_shape=shape,
            corpus=info,
            evaluation=protocol(self.model_config.context),
            train_tokens_per_s=tokens / self.train_time if self.train_time else None,
            windows_per_gradient_chunk=windows_per_chunk(self.batch, self.model_config.context),
            validation_windows=len(self.validation.inputs),
        )


def corpus_of(header: dict[str, Any]) -> text.Corpus:
    """The corpus a text checkpoint was trained on (its `--text` paths, else the default), checked
    against the SHA-256 its run recorded when the header has it."""
    saved = header.get("resume", {}).get("train_config", {})
    try:
        corpus = text.load_corpus(saved.get("text"))
    except (ValueError, FileNotFoundError) as error:
        raise CommandError(f"cannot load the checkpoint's corpus: {error}") from None
    expected = header.get("corpus_sha256")
    if expected is not None and expected != corpus.info["sha256"]:
        raise CommandError(
            "the corpus has changed since this checkpoint was trained (its SHA-256 differs): "
            "its bits per byte would not be comparable"
        )
    return corpus


def evaluate_text(model, config, header, steps: list[int]) -> dict[str, Any]:
    """`eqattn evaluate` on a text checkpoint: test bits per byte at the trained solver budget,
    and for the DEQ model bits per byte against the budget (the test-time compute knob)."""
    corpus = corpus_of(header)
    windows = text.evaluation_windows(corpus.test, config.context)
    run = make_text_evaluator()
    trained = bits_per_byte(run, model, windows, jnp.asarray(config.max_steps))
    result: dict[str, Any] = {
        "task": "text",
        "model": config.model,
        "test_bits_per_byte": trained["bits_per_byte"],
        "test_scored_bytes": trained["scored_bytes"],
        "corpus": corpus.info,
        "evaluation": protocol(config.context),
        "trained_epochs": header.get("epoch"),
    }
    if config.model == "deq":
        result["solver_steps"] = {
            "max_steps": config.max_steps,
            "mean": trained["mean_solver_steps"],
            "converged": trained["converged"],
            "mean_relative_residual": trained["mean_relative_residual"],
        }
        result["budget_sweep"] = [
            dict(max_steps=b, **bits_per_byte(run, model, windows, jnp.asarray(b))) for b in steps
        ]
    return result
