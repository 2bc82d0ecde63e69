"""`eqattn train`: a classifier on the scikit-learn digits, with checkpoints and a metrics file."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import resource
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import data
from ._checkpoint import FILENAME, load_train_state, read_header, save_checkpoint
from ._errors import CommandError, Interrupted, UsageError
from ._models import ModelConfig, build_model, predict
from ._placement import on_host, placement, saved_points
from ._run import RunDirectory, atomic_write, failpoint
from ._step import TrainConfig, make_evaluator, make_train_step, optimizer_of, shift_images


def train(
    model_config: ModelConfig,
    config: TrainConfig,
    out_dir: str | Path,
    *,
    progress: bool | str | None = None,
    overwrite: bool = False,
    resume: bool = False,
) -> dict[str, Any]:
    """Train, checkpoint every epoch to `out_dir/checkpoint.eqx`, write `out_dir/metrics.json`.

    The directory is locked for the run; one that holds a run is refused unless `overwrite`
    (the old run is moved into `replaced-<time>/`) or `resume` (the run continues from its last
    epoch boundary with its saved configuration, optimizer state, data order and random keys, and
    ends where the uninterrupted run would; `model_config` and `config` are then ignored).
    Every file is written atomically and durably.

    With several processes (after `jax.distributed.initialize`), each process runs this with
    the same arguments: every batch is split over all processes' devices (data parallel), and
    only process 0 writes the checkpoint and metrics (the others only read, for `resume`).

    `progress`: `True` or `"bar"`, a tqdm bar on stderr; `"lines"`, one plain line per epoch on
    stdout; `False`, neither; `None` (default), the bar when stderr is a terminal, else the lines.
    Returns the metrics, with the run's wall time split into start-up and data, compile, training
    and evaluation (`time_split_s`).
    Ctrl-C saves the model as it stands (and the last epoch boundary's state, for `--resume`) and
    raises `Interrupted`; a loss that turns NaN raises `CommandError` (the last epoch's
    checkpoint stays).
    """
    budget = config.train_steps
    if not resume and model_config.model == "deq" and (budget or 0) > model_config.max_steps:
        raise UsageError(
            f"train_steps ({budget}) must be at most max_steps ({model_config.max_steps}), the "
            "solver's step limit the model is built with"
        )
    if not resume:  # the explicit model's shape, recorded (refused here, before the directory)
        model_config = model_config.with_shape()
    writer = jax.process_index() == 0
    with RunDirectory(out_dir, overwrite=overwrite, resume=resume, writer=writer) as run:
        if run.moved_to is not None:
            print(f"moved the previous run to {run.moved_to}", file=sys.stderr)
        return _train(model_config, config, run.path, progress=progress, resume=resume)


def _process_age() -> float | None:
    """Seconds since this process started (Linux), for the start-up share of the wall time."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def _train(model_config, config, out: Path, *, progress, resume) -> dict[str, Any]:
    t_enter = time.perf_counter()
    before = _process_age() or 0.0  # interpreter start-up and imports
    header = None
    if resume:
        header = _resumable_header(out)
        model_config = ModelConfig.from_dict(header["config"])
        config = TrainConfig(**header["resume"]["train_config"])
    if model_config.task == "text":
        from ._text import TextTraining as task
    else:
        task = _Training
    return task(model_config, config, out, header, clock=(t_enter, before)).run(progress)


def _resumable_header(out: Path) -> dict[str, Any]:
    """The header of the checkpoint in `out`, if it holds an unfinished run to resume."""
    ckpt = out / FILENAME
    _, header = read_header(ckpt)
    if "resume" not in header:
        raise CommandError(f"checkpoint {str(ckpt)!r} holds no training state to resume from")
    epochs = header["resume"]["train_config"]["epochs"]
    if header["resume"]["epoch"] >= epochs:
        raise CommandError(
            f"the run in {str(out)!r} is complete ({epochs} epochs); nothing to resume"
        )
    return header


class _Training:
    """One training run's state: the data, the model and optimizer state, the random streams,
    the history; `run` trains the epochs left, writing the checkpoint and metrics after each."""

    FIELDS = ("loss", "train_accuracy", "solver_steps", "relative_residual", "converged")

    def __init__(self, model_config, config, out: Path, header, *, clock):
        # `clock`: (perf_counter at entry, seconds the process had run before it)
        self.out, self.ckpt, self.config, self.clock = out, out / FILENAME, config, clock
        self.eval_s, self.metrics = 0.0, {}
        self._data(model_config, config)
        key, init_key = jax.random.split(jax.random.key(config.seed))
        self.model = build_model(self.model_config, init_key)
        leaves = jax.tree.leaves(eqx.filter(self.model, eqx.is_inexact_array))
        self.n_params = sum(x.size for x in leaves)
        optimizer = optimizer_of(config, self.total)
        self.opt_state = optimizer.init(eqx.filter(self.model, eqx.is_inexact_array))
        self.deq = self.model_config.model == "deq"
        self.warm = self.deq and config.warm_start
        self.step = self._make_step(optimizer)
        self.writer = jax.process_index() == 0
        self.place = placement(self.warm, self.batch)
        if self.place is not None:
            self.test_x = np.asarray(self.test_x)  # the same in every process: replicated
        self.rng = np.random.default_rng(config.seed)
        self.x0, self.y0 = self._example_batch()
        # Each training example's last fixed point (zeros until its first solve), when warm.
        self.fixed_points, self.z_batch = None, None
        if self.warm:
            state = eqx.filter_eval_shape(lambda: predict(self.model, self.x0[0]).fixed_point)
            self.fixed_points = np.zeros((self.n_train, *state.shape), state.dtype)
            self.z_batch = jnp.asarray(self.fixed_points[: self.batch])
        self.key, self.history, self.train_time, self.first_epoch = key, [], 0.0, 1
        if header is not None:
            self._restore(header)
        self._compile()
        self.evaluate = self._make_evaluator()
        self.boundary = self.snapshot(self.first_epoch - 1)

    # The task's hooks (the digits here; eqattn.cli._text overrides them for text): the data,
    # a batch to compile the step with, one epoch's batches' arguments and the test metrics.
    HEADLINE = ("test_accuracy", "test", ".3f", ".2%")  # metric, short name, bar, line formats
    BAR = "acc"  # the bar's name of FIELDS[1]

    def _make_step(self, optimizer):
        return make_train_step(self.model_config, self.config, optimizer)

    def _make_evaluator(self):
        return make_evaluator()

    def _example_batch(self):
        x0 = jnp.asarray(data.tokenize(self.train_images[: self.batch], self.tokens))
        return x0, self.train_labels[: self.batch]

    def _test_metrics(self, final: bool) -> dict[str, Any]:
        """The test set's metrics (accuracy and the solves' statistics); `final`: the run is
        done (a task whose test set is costly scores it then only: Ctrl-C must end promptly)."""
        results = self.evaluate(self.model, self.test_x, None)
        preds, steps, residual, converged = (on_host(a) for a in results)
        return dict(
            test_accuracy=float(np.mean(preds == self.digits.test_labels)),  # as `evaluate` does
            test_mean_solver_steps=float(steps.mean()),
            test_mean_relative_residual=float(residual.mean()),
            test_converged=float(converged.mean()),
        )

    def _header(self) -> dict[str, Any]:
        """What the checkpoint's header records beyond the configuration."""
        return {}

    def _sizes(self) -> dict[str, Any]:
        return dict(train_examples=self.n_train, test_examples=len(self.digits.test_labels))

    def _data(self, model_config, config) -> None:
        self.digits = digits = data.load_digits()
        images, labels = digits.train_images, digits.train_labels
        if config.train_size is not None:
            images, labels = images[: config.train_size], labels[: config.train_size]
        self.train_images, self.train_labels, self.tokens = images, labels, model_config.tokens
        self.test_x = jnp.asarray(data.tokenize(digits.test_images, self.tokens))
        self.n_train = len(labels)
        self.batch = min(config.batch_size, self.n_train)
        self.steps_per_epoch = self.n_train // self.batch
        self.total = self.steps_per_epoch * config.epochs
        shape = data.tokenize(images[:1], self.tokens).shape
        self.model_config = dataclasses.replace(
            model_config, num_tokens=shape[1], in_features=shape[2]
        )

    def _restore(self, header) -> None:
        """The state saved at the last epoch boundary (`--resume`)."""
        points = saved_points(self.fixed_points)
        like = (self.model, self.opt_state, jax.random.key_data(self.key), points)
        (self.model, self.opt_state, key_data, points), _ = load_train_state(self.ckpt, like)
        self.key = jax.random.wrap_key_data(key_data)
        self.fixed_points = np.array(points) if self.warm else None
        saved = header["resume"]
        self.rng.bit_generator.state = saved["rng"]
        self.history, self.train_time = saved["history"], saved["train_time_s"]
        self.first_epoch = saved["epoch"] + 1

    def _compile(self) -> None:
        t_compile = time.perf_counter()
        batch, place = self.batch, self.place
        if place is not None:  # every process compiles for the global batch over all devices
            self.model, self.opt_state = place.replicate((self.model, self.opt_state))
            args = (*place.batch(self.x0, self.y0, np.arange(batch)), place.replicate(self.key))
        else:
            args = (self.x0, self.y0, self.key)
        lowered = eqx.filter_jit(self.step).lower(self.model, self.opt_state, *args, self.z_batch)
        self.compiled = lowered.compile()
        self.compile_s = time.perf_counter() - t_compile
        memory = self.compiled.compiled.memory_analysis()
        self.step_temp_mb = None if memory is None else memory.temp_size_in_bytes / 2**20

    def snapshot(self, epoch):
        """What `--resume` needs to continue from the end of `epoch` (arrays are immutable, so
        holding them costs nothing; the mutable ones are copied)."""
        return dict(
            arrays=(
                self.model,
                self.opt_state,
                jax.random.key_data(self.key),
                saved_points(self.fixed_points),
            ),
            resume=dict(
                epoch=epoch,
                rng=self.rng.bit_generator.state,
                history=[dict(h) for h in self.history],
                train_time_s=self.train_time,
                train_config=dataclasses.asdict(self.config),
            ),
        )

    def write_metrics(self, status: str, epoch: int, at_boundary: bool) -> dict[str, Any]:
        """Evaluate on the test set, then save the checkpoint and metrics.json (at an epoch's
        end, with that epoch's state for `--resume`)."""
        t_eval = time.perf_counter()
        tested = self._test_metrics(final=status == "done")
        headline = self.HEADLINE[0]
        self.eval_s += time.perf_counter() - t_eval
        if at_boundary:
            self.history[-1].update({headline: tested[headline], "time_s": self.train_time})
            self.boundary = self.snapshot(epoch)
        self.metrics.update(status=status, epochs_done=epoch, **tested, **self._record())
        if not self.writer:  # process 0 writes
            return self.metrics
        save_checkpoint(
            self.ckpt,
            self.model,
            dataclasses.asdict(self.model_config),
            train_state=self.boundary["arrays"],
            resume=self.boundary["resume"],
            epoch=epoch,
            **{headline: tested[headline]},
            **self._header(),
            dtype=jnp.dtype(self.model.readout.head.weight.dtype).name,
        )
        text = json.dumps(self.metrics, indent=2) + "\n"
        atomic_write(self.out / "metrics.json", text.encode())
        return self.metrics

    def _record(self) -> dict[str, Any]:
        """The run's description and times, for metrics.json."""
        t_enter, before = self.clock
        total_s = before + time.perf_counter() - t_enter
        return dict(
            params=int(self.n_params),
            **self._sizes(),
            train_time_s=self.train_time,
            compile_time_s=self.compile_s,
            time_split_s=dict(
                startup_and_data=total_s - self.compile_s - self.train_time - self.eval_s,
                compile=self.compile_s,
                training=self.train_time,
                evaluation=self.eval_s,
                total=total_s,
            ),
            step_temp_memory_mb=self.step_temp_mb,
            peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            device=str(jax.devices()[0].device_kind),
            backend=jax.default_backend(),
            model_config=dataclasses.asdict(self.model_config),
            train_config=dataclasses.asdict(self.config),
            checkpoint=str(self.ckpt),
            history=self.history,
        )

    def _batches(self, epoch: int):
        """Per optimizer step: the step's data arguments (inputs, targets) and the indices of
        its examples (for the warm start)."""
        perm = self.rng.permutation(self.n_train)
        shifted = shift_images(self.train_images, self.config.shift, self.rng)
        x_all = data.tokenize(shifted, self.tokens)
        for i in range(self.steps_per_epoch):
            idx = perm[i * self.batch : (i + 1) * self.batch]
            if self.place is None:
                yield (x_all[idx], self.train_labels[idx]), idx
            else:
                yield tuple(self.place.batch(x_all, self.train_labels, idx)), idx

    def train_epoch(self, epoch: int, bar, test_acc: float) -> np.ndarray:
        """One epoch's optimizer steps; returns the means of `FIELDS` over them."""
        sums = np.zeros(len(self.FIELDS))
        _, short, bar_format, _ = self.HEADLINE
        for i, (batch, idx) in enumerate(self._batches(epoch)):
            failpoint(f"step:{epoch}:{i + 1}")
            self.key, sub = jax.random.split(self.key)
            z0 = self.fixed_points[idx] if self.warm else None
            sub = sub if self.place is None else self.place.replicate(sub)
            model, state, loss, aux, z = self.compiled(self.model, self.opt_state, *batch, sub, z0)
            if self.warm:
                self.fixed_points[idx] = np.asarray(z)
            values = np.array([float(loss), *(float(a) for a in aux)])
            if not math.isfinite(values[0]):
                raise CommandError(
                    f"training diverged in epoch {epoch}, step {i + 1} (loss {values[0]}); try a "
                    f"smaller --lr. Last good checkpoint: {self.ckpt if epoch > 1 else 'none'}"
                )
            self.model, self.opt_state = model, state
            sums += values
            m = sums / (i + 1)
            solver = f" steps {m[2]:.1f} res {m[3]:.1e}" if self.deq else ""  # DEQ only
            scored = f" {short} {test_acc:{bar_format}}" if math.isfinite(test_acc) else ""
            bar.set_postfix_str(
                f"loss {m[0]:.3f} {self.BAR} {m[1]:{bar_format}}{solver}{scored}", refresh=False
            )
            bar.update()
        return sums / self.steps_per_epoch

    def run(self, progress) -> dict[str, Any]:
        from tqdm.auto import tqdm

        config, deq = self.config, self.deq
        c = self.model_config
        desc = f"{c.model} {'text' if c.task == 'text' else c.tokens}"
        if progress is None:
            progress = "bar" if sys.stderr.isatty() else "lines"
        progress = {True: "bar", False: "off"}.get(progress, progress) if self.writer else "off"
        if progress not in ("bar", "lines", "off"):
            raise ValueError(f"`progress` must be a bool, 'bar', 'lines' or None; got {progress!r}")
        bar = tqdm(
            total=self.total, desc=desc, unit="step", disable=progress != "bar", file=sys.stderr
        )
        bar.update(self.steps_per_epoch * (self.first_epoch - 1))
        epoch = self.first_epoch - 1
        metric, short, bar_format, line_format = self.HEADLINE
        test_acc = self.history[-1][metric] if self.history else float("nan")
        try:
            for epoch in range(self.first_epoch, config.epochs + 1):
                bar.set_description(f"{desc} epoch {epoch}/{config.epochs}")
                t0 = time.perf_counter()
                means = self.train_epoch(epoch, bar, test_acc)
                epoch_s = time.perf_counter() - t0
                self.train_time += epoch_s
                eval_before = self.eval_s
                self.history.append(dict(epoch=epoch, **dict(zip(self.FIELDS, means))))
                status = "done" if epoch == config.epochs else "running"
                test_acc = self.write_metrics(status, epoch, at_boundary=True)[metric]
                if progress == "lines":
                    h = self.history[-1]
                    solver = f", solver steps {h['solver_steps']:.1f}" if deq else ""
                    second = self.FIELDS[1]
                    print(
                        f"epoch {epoch}/{config.epochs}: loss {h['loss']:.4f}, "
                        f"{second.replace('_', ' ')} {h[second]:{line_format}}, "
                        f"{metric.replace('_', ' ')} {test_acc:{line_format}}{solver} "
                        f"({epoch_s:.1f} s training, {self.eval_s - eval_before:.1f} s "
                        "evaluation)",
                        flush=True,
                    )
        except KeyboardInterrupt:
            bar.close()
            # Epochs whose training finished (an interrupt can land after the last one's
            # steps, while its checkpoint is being written): the model saved has done that many.
            self.write_metrics("interrupted", len(self.history), at_boundary=False)
            raise Interrupted(
                f"interrupted in epoch {epoch}; the model as it stood is saved: {self.ckpt} "
                f"(eqattn train --resume --out {shlex.quote(str(self.out))} continues from the "
                "last full epoch)"
            ) from None
        finally:
            bar.close()
        return self.metrics
