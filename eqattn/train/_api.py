"""The training runtime's entry points: `train`, `evaluate`, `load_model` and the tasks'
configurations (what the `eqattn` command calls)."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any, Literal, NamedTuple

import equinox as eqx
import jax

from .._checkpoint import CHECKPOINT, load_checkpoint, read_header
from .._errors import ConfigError, RunError
from ._config import ModelConfig, TrainConfig, split_fields
from ._evaluation import check_budgets
from ._run import RunDirectory
from ._tasks import build_model, config_of, task_of, with_shape
from ._trainer import Trainer, process_age


def train(
    model_config: ModelConfig,
    config: TrainConfig,
    out_dir: str | Path,
    *,
    progress: bool | str | None = None,
    overwrite: bool = False,
    resume: bool = False,
    epochs: int | None = None,
) -> dict[str, Any]:
    """Train, checkpoint every epoch to `out_dir/checkpoint.eqx`, write `out_dir/metrics.json`.

    The directory is locked for the run; one that holds a run is refused unless `overwrite`
    (the old run is moved into `replaced-<time>/`) or `resume` (the run continues from its last
    epoch boundary with its saved configuration, optimizer state, data order and random keys, and
    ends where the uninterrupted run would; `model_config` and `config` are then ignored).
    `epochs` (with `resume`) sets the run's length in epochs anew, a finished run's too: the
    learning-rate schedule becomes the one of a run of that length, at the step reached (an
    extended run's rate rises again from its end value). A refused run leaves the file system
    as it found it. Every file is written atomically and durably. A task with a validation split
    (text) also keeps the model of its best validated epoch as `best.eqx`.

    With several processes (after `jax.distributed.initialize`), each process runs this with
    the same arguments: every batch is split over all processes' devices (data parallel), and
    only process 0 writes the checkpoint and metrics (the others only read, for `resume`).

    `progress`: `True` or `"bar"`, a tqdm bar on stderr; `"lines"`, one plain line per epoch on
    stdout; `False`, neither; `None` (default), the bar when stderr is a terminal, else the lines.
    Returns the metrics, with the run's wall time split into start-up and data, compile, training
    and evaluation (`time_split_s`, over every session of a resumed run).
    Ctrl-C saves the model as it stands (and the last epoch boundary's state, for `resume`) and
    raises [`Interrupted`][eqattn.train.Interrupted]; a loss that turns NaN raises
    [`RunError`][eqattn.train.RunError] (the last epoch's checkpoint stays).

    **Example:**

    ```python
    import tempfile
    from eqattn import train

    out = tempfile.mkdtemp()
    model_config = train.ModelConfig(dim=16, heads=2)
    config = train.TrainConfig(epochs=1, train_size=64, batch_size=32)
    metrics = train.train(model_config, config, out, progress=False)
    assert metrics["status"] == "done" and 0 <= metrics["test_accuracy"] <= 1
    loaded = train.load_model(out)  # the model, its configuration and the header
    assert loaded.config.dim == 16 and loaded.header["epoch"] == 1
    ```
    """
    t_enter, before = time.perf_counter(), process_age() or 0.0
    out = Path(out_dir)
    header = None
    if overwrite and resume:
        raise ConfigError("--overwrite and --resume exclude each other")
    if resume:
        header = _resumable(out, epochs)
        model_config = config_of(header["config"])
        config = TrainConfig.from_dict(header["resume"]["train_config"])
        if epochs is not None:
            config = dataclasses.replace(config, epochs=epochs)
    else:
        budget = config.train_steps
        if model_config.model == "deq" and (budget or 0) > model_config.max_steps:
            raise ConfigError(
                f"--train-steps ({budget}) must be at most --max-steps ({model_config.max_steps}), "
                "the solver's step limit the model is built with"
            )
        model_config = with_shape(model_config)  # the explicit model's shape, recorded
    # the task loads its data and checks its settings before the directory is touched
    task = task_of(model_config.task)(model_config, config)
    writer = jax.process_index() == 0
    with RunDirectory(out, overwrite=overwrite, resume=resume, writer=writer) as run:
        if run.moved_to is not None:
            print(f"moved the previous run to {run.moved_to}", file=sys.stderr)
        trainer = Trainer(task, run.path, header=header, clock=(t_enter, before))
        return trainer.run(progress)


def _resumable(out: Path, epochs: int | None) -> dict[str, Any]:
    """The header of the checkpoint in `out`, if it holds a run to resume (or to extend to
    `epochs`)."""
    ckpt = out / CHECKPOINT
    if not ckpt.is_file():
        raise RunError(f"nothing to resume: no checkpoint in {str(out)!r}")
    _, header = read_header(ckpt)
    if "resume" not in header:
        raise RunError(f"checkpoint {str(ckpt)!r} holds no training state to resume from")
    done, planned = header["resume"]["epoch"], header["resume"]["train_config"]["epochs"]
    if epochs is not None and epochs <= done:
        raise ConfigError(
            f"--epochs ({epochs}) must be above the {done} epoch{'s' * (done != 1)} the run in "
            f"{str(out)!r} has done"
        )
    if epochs is None and done >= planned:
        raise RunError(
            f"the run in {str(out)!r} is complete ({planned} epoch{'s' * (planned != 1)}); "
            f"nothing to resume (--epochs N above {done} extends it)"
        )
    return header


class LoadedModel(NamedTuple):
    """A checkpoint's model, the configuration it was built from and the checkpoint's header
    (format, eqattn version, epoch, the score at saving, the corpus's SHA-256 for text): what
    [`load_model`][eqattn.train.load_model] returns; it unpacks as a tuple.

    **Example:**

    ```python
    from eqattn import train

    assert train.LoadedModel._fields == ("model", "config", "header")
    ```
    """

    model: eqx.Module
    config: ModelConfig
    header: dict[str, Any]


def load_model(path: str | Path, max_steps: int | None = None) -> LoadedModel:
    """The model of a checkpoint file or of a run's directory (its `checkpoint.eqx`; its best
    validated model is `best.eqx` beside it), with its configuration and header. `max_steps`
    raises a DEQ's solver step limit above the trained one (a static setting, not a saved
    array, so the same leaves load into either).

    **Example:**

    ```python
    import tempfile
    from eqattn import train

    out = tempfile.mkdtemp()
    model_config = train.ModelConfig(model="explicit", dim=16, heads=2)
    train.train(model_config, train.TrainConfig(epochs=1, train_size=32), out, progress=False)
    model, model_config, header = train.load_model(out)  # a named tuple
    assert model_config.model == "explicit" and header["format"] == "eqattn-checkpoint-2"
    ```
    """
    path, header = read_header(path)
    try:
        config = config_of(header["config"])
    except (KeyError, TypeError, ValueError) as e:
        raise RunError(f"checkpoint {str(path)!r} has an unusable configuration: {e}") from None
    skeleton = config if max_steps is None else dataclasses.replace(config, max_steps=max_steps)
    # the checkpoint's dtype, whatever JAX's default float is now (jax_enable_x64 or not)
    like = build_model(skeleton, jax.random.key(0), dtype=header.get("dtype"))
    return LoadedModel(load_checkpoint(path, like), config, header)


def evaluate(
    checkpoint: str | Path, steps: list[int] | None = None, *, progress: bool | None = None
) -> dict[str, Any]:
    """A checkpoint's test scores at its trained solver budget and, for a DEQ, its solver steps
    and the scores against the solver's budget at test time (`steps`, default 1, 2, 4, ... and
    twice the trained budget): a DEQ's compute-at-test-time knob. The sweep stops at the first
    budget within which every solve converged (larger ones give the same results; the result's
    `sweep_converged_at`). `progress`: a bar on stderr (None: when stderr is a terminal).

    **Example:**

    ```python
    import tempfile
    from eqattn import train

    out = tempfile.mkdtemp()
    model_config = train.ModelConfig(dim=16, heads=2)
    train.train(model_config, train.TrainConfig(epochs=1, train_size=32), out, progress=False)
    result = train.evaluate(out, [2, 4], progress=False)
    assert [row["max_steps"] for row in result["budget_sweep"]][0] == 2
    print("\\n".join(train.task_of(result["task"]).evaluation_report(result)))
    ```
    """
    path, header = read_header(checkpoint)
    try:
        recorded = ModelConfig.from_dict(header["config"])
    except (KeyError, TypeError, ValueError) as e:
        raise RunError(f"checkpoint {str(path)!r} has an unusable configuration: {e}") from None
    task = task_of(recorded.task)
    steps = task.default_budgets(recorded) if steps is None else check_budgets(steps)
    model, config, header = load_model(checkpoint, max([*(steps or []), recorded.max_steps]))
    result = task.evaluate(model, config, header, steps, progress)
    return dict(checkpoint=str(checkpoint), task=task.name, **result)


def configs(
    task: str = "digits", model: Literal["deq", "explicit"] = "deq", **fields
) -> tuple[ModelConfig, TrainConfig]:
    """The configurations of `eqattn train --task TASK --model MODEL`: the task's defaults (where
    they differ from the dataclasses', which are the digits'), with `fields` set in whichever of
    the two configurations has them.

    **Example:**

    ```python
    from eqattn import train

    model_config, config = train.configs("text", "deq", context=128, epochs=2)
    assert model_config.task == "text" and model_config.dropout == 0.0
    assert (config.epochs, config.batch_size, config.jacobian_weight) == (2, 16, 0.1)
    assert model_config.adjoint == "jacobian-free" and config.jacobian_share == 0.125
    ```
    """
    model_fields, train_fields = split_fields({**task_of(task).settings(model), **fields})
    return ModelConfig(model=model, task=task, **model_fields), TrainConfig(**train_fields)


def text_configs(
    model: Literal["deq", "explicit"] = "deq", **fields
) -> tuple[ModelConfig, TrainConfig]:
    """`configs("text", model, **fields)`: the text task's configurations.

    **Example:**

    ```python
    from eqattn import train

    model_config, config = train.text_configs("explicit", context=64)
    assert (model_config.task, model_config.context, config.lr) == ("text", 64, 1e-2)
    ```
    """
    return configs("text", model, **fields)
