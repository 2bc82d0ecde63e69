"""The training runtime's entry points: `train` a task, `resume` a run, `load_model` and
`evaluate` a checkpoint (what each task's Python API and the `eqattn` command call)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any, NamedTuple

import equinox as eqx
import jax

from .._errors import ConfigError, RunError
from ._checkpoint import CHECKPOINT, load_checkpoint, read_header
from ._config import Config
from ._evaluation import check_budgets
from ._models import initial_key
from ._run import RunDirectory
from ._task import AbstractTask
from ._trainer import Trainer, run_clock


def train(
    task: AbstractTask,
    out_dir: str | Path,
    *,
    progress: bool | str | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Train `task`'s model, checkpoint every epoch to `out_dir/checkpoint.eqx` and write
    `out_dir/metrics.json`.

    The directory is locked for the run; one that holds a run is refused unless `overwrite` (the
    old run is moved into `replaced-<time>/`; [`resume`][eqattn.train.resume] continues one). A
    refused run leaves the file system as it found it. Every file is written atomically and
    durably. A task with a validation split (the text and graph tasks) also keeps the model of
    its best validated epoch as `best.eqx`; the digits have none (a model chosen on the test set
    would overstate).

    With several processes (after `jax.distributed.initialize`), each process runs this with
    the same arguments: every batch is split over all processes' devices (data parallel), and
    only process 0 writes the checkpoint and metrics.

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
    from eqattn import digits, train

    out = tempfile.mkdtemp()
    config = digits.DigitsConfig(dim=16, heads=2, epochs=1, train_size=64, batch_size=32)
    metrics = train.train(digits.DigitsTask(config), out, progress=False)
    assert metrics["status"] == "done" and 0 <= metrics["test_accuracy"] <= 1
    loaded = train.load_model(out, digits.DigitsTask)  # the model, its configuration, the header
    assert loaded.config.dim == 16 and loaded.header["epoch"] == 1
    ```
    """
    clock = run_clock()
    with RunDirectory(out_dir, overwrite=overwrite, writer=jax.process_index() == 0) as run:
        if run.moved_to is not None:
            print(f"moved the previous run to {run.moved_to}", file=sys.stderr)
        return Trainer(task, run.path, clock=clock).run(progress)


def resume(
    out_dir: str | Path,
    task_type: type[AbstractTask],
    *,
    epochs: int | None = None,
    progress: bool | str | None = None,
) -> dict[str, Any]:
    """Continue the run in `out_dir` from its last epoch boundary, with its saved configuration,
    optimizer state, data order and random keys: it ends where the uninterrupted run would.
    `epochs` sets the run's length anew, a finished run's too: the learning-rate schedule becomes
    the one of a run of that length, at the step reached (an extended run's rate rises again
    from its end value). A run of another task than `task_type` is refused.

    **Example:**

    ```python
    import tempfile
    from eqattn import digits, train

    out = tempfile.mkdtemp()
    config = digits.DigitsConfig(model="explicit", dim=16, heads=2, epochs=1, train_size=32)
    train.train(digits.DigitsTask(config), out, progress=False)
    metrics = train.resume(out, digits.DigitsTask, epochs=2, progress=False)
    assert metrics["epochs_done"] == 2 and metrics["config"]["epochs"] == 2
    ```
    """
    clock = run_clock()
    out = Path(out_dir)
    header = resumable(out, epochs)
    config = config_of(out / CHECKPOINT, header, task_type)
    if epochs is not None:
        config = dataclasses.replace(config, epochs=epochs)
    task = task_type(config)  # loads its data and checks it before the directory is touched
    with RunDirectory(out, resume=True, writer=jax.process_index() == 0) as run:
        return Trainer(task, run.path, header=header, clock=clock).run(progress)


def resumable(out: Path, epochs: int | None = None) -> dict[str, Any]:
    """The header of the checkpoint in `out`, if it holds a run to resume (or to extend to
    `epochs`)."""
    ckpt = out / CHECKPOINT
    if not ckpt.is_file():
        raise RunError(f"nothing to resume: no checkpoint in {str(out)!r}")
    _, header = read_header(ckpt)
    if "resume" not in header:
        raise RunError(f"checkpoint {str(ckpt)!r} holds no training state to resume from")
    done, planned = header["resume"]["epoch"], header["config"]["epochs"]
    if epochs is not None and epochs <= done:
        raise ConfigError(
            f"`epochs` ({epochs}) must be above the {done} epoch{'s' * (done != 1)} the run in "
            f"{str(out)!r} has done"
        )
    if epochs is None and done >= planned:
        raise RunError(
            f"the run in {str(out)!r} is complete ({planned} epoch{'s' * (planned != 1)}); "
            f"nothing to resume (`epochs` above {done} extends it)"
        )
    return header


def config_of(path: Path, header: dict[str, Any], task_type: type[AbstractTask]) -> Config:
    """The configuration a checkpoint's header records, checked to be `task_type`'s."""
    if header.get("task") != task_type.name:
        raise RunError(
            f"{str(path)!r} holds a {header.get('task', 'unknown')} model, not a "
            f"{task_type.name} model"
        )
    try:
        return task_type.config_type.from_dict(header["config"])
    except (KeyError, TypeError, ValueError) as e:
        raise RunError(f"checkpoint {str(path)!r} has an unusable configuration: {e}") from None


class LoadedModel(NamedTuple):
    """A checkpoint's model, the configuration it was built from and the checkpoint's header
    (format, eqattn version, task, epoch, the score at saving, the corpus's SHA-256 for text):
    what [`load_model`][eqattn.train.load_model] returns; it unpacks as a tuple.

    **Example:**

    ```python
    from eqattn import train

    assert train.LoadedModel._fields == ("model", "config", "header")
    ```
    """

    model: eqx.Module
    config: Config
    header: dict[str, Any]


def load_model(
    path: str | Path, task_type: type[AbstractTask], max_steps: int | None = None
) -> LoadedModel:
    """The model of a checkpoint file or of a run's directory (its `checkpoint.eqx`; its best
    validated model is `best.eqx` beside it) of `task_type`, with its configuration and header.
    `max_steps` raises a DEQ's solver step limit above the trained one (a static setting, not a
    saved array, so the same leaves load into either). Each task's `load_model` calls this.

    **Example:**

    ```python
    from eqattn import digits, train

    try:
        train.load_model("no/such/run", digits.DigitsTask)
    except train.RunError as error:
        assert str(error).startswith("checkpoint not found")
    ```
    """
    path, header = read_header(path)
    config = config_of(path, header, task_type)
    skeleton = config if max_steps is None else dataclasses.replace(config, max_steps=max_steps)
    # the checkpoint's dtype, whatever JAX's default float is now (jax_enable_x64 or not);
    # shapes only: nothing is initialised that the checkpoint's leaves replace
    like = eqx.filter_eval_shape(
        lambda: task_type.build_model(skeleton, jax.random.key(0), dtype=header.get("dtype"))
    )
    return LoadedModel(load_checkpoint(path, like), config, header)


def evaluate(
    checkpoint: str | Path,
    task_type: type[AbstractTask],
    budgets: list[int] | None = None,
    *,
    progress: bool | None = None,
) -> dict[str, Any]:
    """A checkpoint's test scores at its trained solver budget and, for a DEQ, its solver steps
    and the scores against the solver's budget at test time (`budgets`, by default the task's:
    1, 2, 4, ... and twice the trained budget): a DEQ's compute-at-test-time knob. The sweep
    stops at the first budget within which every solve converged (larger ones give the same
    results; the result's `sweep_converged_at`). An explicit model has no budget: `budgets` is
    then refused. `progress`: a bar on stderr (None: when stderr is a terminal).

    **Example:**

    ```python
    import tempfile
    from eqattn import digits, train

    out = tempfile.mkdtemp()
    config = digits.DigitsConfig(dim=16, heads=2, epochs=1, train_size=32)
    train.train(digits.DigitsTask(config), out, progress=False)
    result = train.evaluate(out, digits.DigitsTask, [2, 4], progress=False)
    assert [row["max_steps"] for row in result["budget_sweep"]][0] == 2
    print("\\n".join(digits.DigitsTask.evaluation_report(result)))
    ```
    """
    path, header = read_header(checkpoint)
    recorded = config_of(path, header, task_type)
    if budgets is not None and recorded.model != "deq":
        raise ConfigError(f"`budgets` are a DEQ's: {str(path)!r} holds an explicit model")
    if budgets is None:
        budgets = task_type.default_budgets(recorded)
    else:
        budgets = check_budgets(budgets)
    model, config, header = load_model(path, task_type, max([*(budgets or []), recorded.max_steps]))
    result = task_type.evaluate(model, config, header, budgets, progress)
    return dict(checkpoint=str(checkpoint), task=task_type.name, **result)


def initial_model(task: type[AbstractTask], config: Config, *, dtype=None) -> eqx.Module:
    """The model a run of `config` starts from, before any training: the task's model at the
    run's initialisation key, its explicit twin shaped by the task's own rule
    (`task.with_shape`, as the [`Trainer`][eqattn.train.Trainer] does). What a trained model's
    figures stand beside as the untrained control.

    **Example:**

    ```python
    import equinox as eqx, jax
    from eqattn import graphs, train

    config = graphs.GraphConfig(algorithm="mst", seed=3)
    model = train.initial_model(graphs.GraphTask, config)
    again = train.initial_model(graphs.GraphTask, config)
    assert eqx.tree_equal(model, again)  # the same seed, the same start
    ```
    """
    config = task.with_shape(config)
    return task.build_model(config, initial_key(config)[1], dtype=dtype)
