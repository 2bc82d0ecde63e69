"""The one training loop: any task's epochs of optimizer steps, with its checkpoints (the last
epoch's, the best validated epoch's), metrics, progress and `--resume`."""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._errors import Interrupted, RunError
from ._checkpoint import BEST, CHECKPOINT, load_train_state, save_checkpoint
from ._evaluation import progress_bar
from ._files import atomic_write, failpoint
from ._models import initial_key
from ._placement import placement, saved_points
from ._step import optimizer_of
from ._task import AbstractTask

_PARTS = ("startup_and_data", "compile", "training", "evaluation", "total")


def process_age() -> float | None:
    """Seconds since this process started (Linux), for the start-up share of the wall time."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


_CLOCKED: list[float] = []
"""When this process's runs started (`run_clock`)."""


def run_clock() -> tuple[float, float]:
    """`(time.perf_counter(), the seconds before it charged to the run)`: the process's age for
    its first run (its start-up), nothing for a later one (the earlier runs' time is theirs)."""
    before = 0.0 if _CLOCKED else process_age() or 0.0
    _CLOCKED.append(time.perf_counter())
    return _CLOCKED[-1], before


class Trainer:
    """One run of a task: the model, optimizer state, random streams and history; `run` trains
    the epochs left, writing the checkpoint (and the best validated model, where the task has a
    validation split) and metrics.json after each.

    `header`: a checkpoint's header to resume from (its training state is read from `out`);
    `clock`: `(time.perf_counter() at the run's start, seconds the process had run before)`,
    for the wall time's split. [`train`][eqattn.train.train] runs one in a locked directory.

    **Example:**

    ```python
    import pathlib, tempfile
    from eqattn import digits, train

    config = digits.DigitsConfig(model="explicit", dim=16, heads=2, epochs=1, train_size=32)
    metrics = train.Trainer(digits.DigitsTask(config), pathlib.Path(tempfile.mkdtemp())).run(False)
    assert metrics["epochs_done"] == 1 and metrics["task"] == "digits"
    ```
    """

    def __init__(self, task: AbstractTask, out: Path, *, header=None, clock=None):
        # the explicit model's shape, recorded so that the checkpoint rebuilds the same model
        task.config = task.with_shape(task.config)
        self.task, self.config = task, task.config
        self.out, self.ckpt = Path(out), Path(out) / CHECKPOINT
        self.clock = clock or run_clock()
        self.eval_s, self.prior = 0.0, dict.fromkeys(_PARTS, 0.0)
        self.metrics: dict[str, Any] = {}
        self.total = task.steps_per_epoch * self.config.epochs
        key, init_key = initial_key(self.config)
        self.model: Any = task.build_model(self.config, init_key)
        leaves = jax.tree.leaves(eqx.filter(self.model, eqx.is_inexact_array))
        self.n_params = sum(x.size for x in leaves)
        self.optimizer = optimizer_of(self.config, self.total)
        self.opt_state = self.optimizer.init(eqx.filter(self.model, eqx.is_inexact_array))
        self.deq = self.config.model == "deq"
        self.warm = self.deq and task.warm_start
        self.writer = jax.process_index() == 0
        self.place = placement(self.warm, task.batch)
        self.rng = np.random.default_rng(self.config.seed)
        self.example = task.example_batch()
        # Each training example's last fixed point (zeros until its first solve), when warm.
        self.fixed_points, self.z_batch = None, None
        if self.warm:
            first = jax.tree.map(lambda a: a[0], self.example[0])
            state = eqx.filter_eval_shape(lambda: self.model.predict(first).fixed_point)
            self.fixed_points = np.zeros((task.examples, *state.shape), state.dtype)
            self.z_batch = jnp.asarray(self.fixed_points[: task.batch])
        self.history: list[dict[str, Any]] = []
        self.key, self.train_time, self.first_epoch = key, 0.0, 1
        if header is not None:
            self._restore(header)
        self._compile()
        self.boundary = self.snapshot(self.first_epoch - 1)

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
        self.prior.update(saved["time_split_s"])  # the wall time of the sessions before

    def _compile(self) -> None:
        t_compile = time.perf_counter()
        place = self.place
        if place is not None:  # every process compiles for the global batch over all devices
            self.model, self.opt_state = place.replicate((self.model, self.opt_state))
            x0, y0 = self.example
            args = (*place.batch(x0, y0, np.arange(self.task.batch)), place.replicate(self.key))
        else:
            args = (*self.example, self.key)
        step: Any = eqx.filter_jit(self.task.train_step(self.config, self.optimizer))
        self.compiled = step.lower(self.model, self.opt_state, *args, self.z_batch).compile()
        self.compile_s = time.perf_counter() - t_compile
        memory = self.compiled.compiled.memory_analysis()
        self.step_temp_mb = None if memory is None else memory.temp_size_in_bytes / 2**20

    def snapshot(self, epoch: int) -> dict[str, Any]:
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
                time_split_s=self.time_split(),
            ),
        )

    def time_split(self) -> dict[str, float]:
        """The run's wall time so far, over all its sessions (each `--resume` one more): start-up
        and data, compile, training, evaluation, in all."""
        t_enter, before = self.clock
        session = dict(
            total=before + time.perf_counter() - t_enter,
            compile=self.compile_s if hasattr(self, "compile_s") else 0.0,
            training=self.train_time - self.prior["training"],
            evaluation=self.eval_s,
        )
        session["startup_and_data"] = session["total"] - sum(
            session[k] for k in ("compile", "training", "evaluation")
        )
        return {k: self.prior[k] + max(0.0, session[k]) for k in _PARTS}

    def write_metrics(self, status: str, epoch: int, at_boundary: bool) -> dict[str, Any]:
        """Evaluate on the test set, then save the checkpoint and metrics.json (at an epoch's
        end, with that epoch's state for `--resume`, and the model as `best.eqx` when its
        validation score is the best so far)."""
        t_eval = time.perf_counter()
        tested = self.task.test_metrics(self.model, final=status == "done")
        headline = self.task.headline.metric
        self.eval_s += time.perf_counter() - t_eval
        best = False
        if at_boundary:
            best = self._is_best(tested[headline])
            self.history[-1].update({headline: tested[headline], "time_s": self.train_time})
            self.boundary = self.snapshot(epoch)
        self.metrics.update(status=status, epochs_done=epoch, **tested, **self._record())
        if not self.writer:  # process 0 writes
            return self.metrics
        extra = dict(task=self.task.name, epoch=epoch, **{headline: tested[headline]})
        extra.update(self.task.header())
        # the parameters' dtype, so that a checkpoint loads as it was saved
        extra["dtype"] = jnp.dtype(
            jax.tree.leaves(eqx.filter(self.model, eqx.is_inexact_array))[0].dtype
        ).name
        config = self.config.to_dict()
        if best:
            save_checkpoint(self.out / BEST, self.model, config, **extra)
        save_checkpoint(
            self.ckpt,
            self.model,
            config,
            train_state=self.boundary["arrays"],
            resume=self.boundary["resume"],
            **extra,
        )
        text = json.dumps(self.metrics, indent=2) + "\n"
        atomic_write(self.out / "metrics.json", text.encode())
        return self.metrics

    def _is_best(self, score: float) -> bool:
        """Whether `score` beats every earlier epoch's (the task's validation score only: the
        digits have no validation split, and a model chosen on the test set would overstate)."""
        if not self.task.headline.metric.startswith("validation"):
            return False
        earlier = [h[self.task.headline.metric] for h in self.history[:-1]]
        if not earlier:
            return True
        return score > max(earlier) if self.task.headline.higher_is_better else score < min(earlier)

    def _record(self) -> dict[str, Any]:
        """The run's description and times, for metrics.json."""
        split = self.time_split()
        steps = len(self.history) * self.task.steps_per_epoch
        return dict(
            task=self.task.name,
            params=int(self.n_params),
            **self.task.record(steps=steps, train_time=self.train_time),
            train_time_s=self.train_time,
            compile_time_s=self.prior["compile"] + self.compile_s,
            time_split_s=split,
            step_temp_memory_mb=self.step_temp_mb,
            peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            device=str(jax.devices()[0].device_kind),
            backend=jax.default_backend(),
            config=self.config.to_dict(),
            checkpoint=str(self.ckpt),
            history=self.history,
        )

    def train_epoch(self, epoch: int, bar, last: float) -> np.ndarray:
        """One epoch's optimizer steps; returns the means of the step's statistics over them
        (loss, the task's score, solver steps, relative residual, converged)."""
        sums = np.zeros(5)
        short, bar_format = self.task.headline.short, self.task.headline.bar_format
        for i, (batch, idx) in enumerate(self.task.batches(self.rng, self.place)):
            failpoint(f"step:{epoch}:{i + 1}")
            self.key, sub = jax.random.split(self.key)
            z0 = None if self.fixed_points is None else self.fixed_points[idx]
            sub = sub if self.place is None else self.place.replicate(sub)
            model, state, loss, aux, z = self.compiled(self.model, self.opt_state, *batch, sub, z0)
            if self.fixed_points is not None:
                self.fixed_points[idx] = np.asarray(z)
            values = np.array([float(loss), *(float(a) for a in aux)])
            if not math.isfinite(values[0]):
                raise RunError(
                    f"training diverged in epoch {epoch}, step {i + 1} (loss {values[0]}); try a "
                    f"smaller `lr`. Last good checkpoint: {self.ckpt if epoch > 1 else 'none'}"
                )
            self.model, self.opt_state = model, state
            sums += values
            m = sums / (i + 1)
            solver = f" steps {m[2]:.1f} res {m[3]:.1e}" if self.deq else ""  # DEQ only
            scored = f" {short} {last:{bar_format}}" if math.isfinite(last) else ""
            bar.set_postfix_str(
                f"loss {m[0]:.3f} {self.task.bar_name} {m[1]:{bar_format}}{solver}{scored}",
                refresh=False,
            )
            bar.update()
        return sums / self.task.steps_per_epoch

    def _line(self, epoch: int, epoch_s: float, eval_s: float) -> str:
        """The plain line of one epoch (progress `"lines"`)."""
        h, headline = self.history[-1], self.task.headline
        solver = f", solver steps {h['solver_steps']:.1f}" if self.deq else ""
        score = self.task.score
        return (
            f"epoch {epoch}/{self.config.epochs}: loss {h['loss']:.4f}, "
            f"{score.replace('_', ' ')} {h[score]:{headline.line_format}}, "
            f"{headline.metric.replace('_', ' ')} {h[headline.metric]:{headline.line_format}}"
            f"{solver} ({epoch_s:.1f} s training, {eval_s:.1f} s evaluation)"
        )

    def run(self, progress: bool | str | None = None) -> dict[str, Any]:
        """Train the epochs left; returns the metrics. `progress` as in `eqattn.train.train`."""
        if progress is None:
            progress = "bar" if sys.stderr.isatty() else "lines"
        elif isinstance(progress, bool):
            progress = "bar" if progress else "off"
        progress = progress if self.writer else "off"
        if progress not in ("bar", "lines", "off"):
            raise ValueError(f"`progress` must be a bool, 'bar', 'lines' or None; got {progress!r}")
        desc = f"{self.config.model} {self.task.label}"
        bar = progress_bar(self.total, desc, progress == "bar", unit="step")
        bar.update(self.task.steps_per_epoch * (self.first_epoch - 1))
        epoch, metric = self.first_epoch - 1, self.task.headline.metric
        last = self.history[-1][metric] if self.history else float("nan")
        try:
            for epoch in range(self.first_epoch, self.config.epochs + 1):
                bar.set_description(f"{desc} epoch {epoch}/{self.config.epochs}")
                t0 = time.perf_counter()
                means = self.train_epoch(epoch, bar, last)
                epoch_s = time.perf_counter() - t0
                self.train_time += epoch_s
                eval_before = self.eval_s
                fields = ("loss", self.task.score, "solver_steps", "relative_residual", "converged")
                self.history.append(dict(epoch=epoch, **dict(zip(fields, means))))
                status = "done" if epoch == self.config.epochs else "running"
                last = self.write_metrics(status, epoch, at_boundary=True)[metric]
                if progress == "lines":
                    print(self._line(epoch, epoch_s, self.eval_s - eval_before), flush=True)
        except KeyboardInterrupt:
            bar.close()
            # Epochs whose training finished (an interrupt can land after the last one's
            # steps, while its checkpoint is being written): the model saved has done that many.
            self.write_metrics("interrupted", len(self.history), at_boundary=False)
            raise Interrupted(
                f"interrupted in epoch {epoch}; the model as it stood is saved: {self.ckpt} "
                "(resuming continues from the last full epoch)"
            ) from None
        finally:
            bar.close()
        return self.metrics
