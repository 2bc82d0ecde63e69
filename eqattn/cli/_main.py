"""The `eqattn` command line: `train`, `evaluate`, `generate`, `retrieve`, `info`. It parses,
calls `eqattn.train` (and `eqattn.text`), prints and sets the exit status; the library's
`ConfigError` is a usage error (exit 2), its `RunError` a failure (exit 1)."""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import shlex
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from .. import train
from ..train import ConfigError, Interrupted, RunError
from ._parser import DEFAULT_TASK, TASKS, parser, settings


def _distributed(a) -> None:
    """Join the other processes of a multi-process run, if asked to (before any JAX work)."""
    given = [a.coordinator, a.num_processes, a.process_id]
    if a.cluster and any(x is not None for x in given):
        raise ConfigError("--cluster detects the processes itself: no --coordinator etc. with it")
    if not a.cluster and all(x is None for x in given):
        return
    if not a.cluster and any(x is None for x in given):
        raise ConfigError("--coordinator, --num-processes and --process-id go together")
    if not a.cluster and not (a.num_processes >= 1 and 0 <= a.process_id < a.num_processes):
        raise ConfigError(
            f"--process-id must be in 0 .. --num-processes - 1; got {a.process_id} of "
            f"{a.num_processes}"
        )
    import jax

    # CPU devices talk over gloo (accelerators use their own collectives).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        if a.cluster:
            jax.distributed.initialize()
        else:
            jax.distributed.initialize(a.coordinator, a.num_processes, a.process_id)
    except (RuntimeError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RunError(f"could not join the other processes: {first}") from None


def _given_settings(a, task: type[train.AbstractTask]) -> dict:
    """The settings given on the command line (lists as the tuples the configuration holds)."""
    values = {name: getattr(a, name) for name in settings(task) if getattr(a, name) is not None}
    return {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}


PAIR = ("deq", "explicit")
"""`--model both`: the DEQ and its explicit twin, trained one after the other."""


def _cmd_train(a) -> None:
    if a.resume and a.overwrite:
        raise ConfigError("`resume` and `overwrite` exclude each other")
    task = TASKS[a.task or DEFAULT_TASK]
    model = a.model or "both"
    folder = f"runs/{task.run_folder(_given_settings(a, task))}"
    out = Path(a.out or folder + ("" if model == "both" else f"/{model}"))
    runs = _resume(a, task, out) if a.resume else _train_new(a, task, model, out)
    import jax

    if jax.process_index() == 0 and len(runs) > 1:  # process 0 reports
        print()
        dirs = {m: Path(metrics["checkpoint"]).parent for m, metrics in runs.items()}
        print("\n".join(TASKS[next(iter(runs.values()))["task"]].comparison(dirs)))


def _train_new(a, task, model: str, out: Path) -> dict[str, dict]:
    """New runs of `task`: `model`'s, or with `both` the DEQ's and its twin's in `out/deq` and
    `out/explicit` (both configurations checked before either starts)."""
    models = PAIR if model == "both" else (model,)
    given = _given_settings(a, task)
    configs = {m: task.config_type(model=m, **given) for m in models}
    _distributed(a)
    runs = {}
    a.run_dir = shlex.quote(str(out))  # named in the hint an interrupt prints
    for m in models:
        run = out / m if model == "both" else out
        runs[m] = train.train(task(configs[m]), run, progress=_progress(a), overwrite=a.overwrite)
        _report(runs[m], run)
    return runs


def _resume(a, task, out: Path) -> dict[str, dict]:
    """The run in `out` continued, or the pair in `out/deq` and `out/explicit` (a finished one
    of the pair is read as it is)."""
    runs: dict[str | None, Path] = {None: out}
    if not (out / train.CHECKPOINT).is_file():
        runs = {m: out / m for m in PAIR if (out / m / train.CHECKPOINT).is_file()}
    if not runs:
        raise RunError(f"nothing to resume: no checkpoint in {str(out)!r}")
    given = {n: v for n, v in _given_settings(a, task).items() if n != "epochs"}
    changed = sorted({n for run in runs.values() for n, v in given.items() if _saved(run, n) != v})
    if changed:  # repeating the run's own settings is no change
        raise ConfigError(
            f"`resume` continues the run with its saved settings: "
            f"{', '.join(f'`{n}`' for n in changed)} cannot change (`epochs` can)"
        )
    recorded = {run: _recorded_run(run) for run in runs.values()}
    for run, (saved_task, saved_model) in recorded.items():
        for name, wanted, saved in (("task", a.task, saved_task), ("model", a.model, saved_model)):
            if wanted not in (None, "both") and wanted != saved:
                raise ConfigError(
                    f"`resume` continues the {saved_model} {saved_task} run in {str(run)!r}: "
                    f"not `{name}` {wanted}"
                )
    done = {run for run in runs.values() if len(runs) > 1 and _finished(run, a.epochs)}
    if len(done) == len(runs):
        train.resumable(next(iter(runs.values())), a.epochs)  # says it is complete
    _distributed(a)
    a.run_dir = shlex.quote(str(out))
    metrics = {}
    for run, (saved_task, saved_model) in recorded.items():
        if run in done:
            metrics[saved_model] = json.loads((run / "metrics.json").read_text())
            continue
        progress = _progress(a)
        metrics[saved_model] = train.resume(
            run, TASKS[saved_task], epochs=a.epochs, progress=progress
        )
        _report(metrics[saved_model], run)
    return metrics


def _saved(run: Path, name: str):
    """The setting `name` as the run in `run` recorded it (lists as the tuples given)."""
    _, header = train.read_header(run)
    value = header["config"].get(name)
    return tuple(value) if isinstance(value, list) else value


def _recorded_run(out: Path) -> tuple[str, str]:
    """The task and model of the run in `out` (its checkpoint's header)."""
    _, header = train.read_header(out)
    if header.get("task") not in TASKS:
        raise RunError(f"{str(out)!r} holds a model of an unknown task {header.get('task')!r}")
    return header["task"], header["config"]["model"]


def _finished(run: Path, epochs: int | None) -> bool:
    """Whether the run in `run` has done its epochs (or `epochs`, when given)."""
    _, header = train.read_header(run)
    return header["resume"]["epoch"] >= (epochs or header["config"]["epochs"])


def _report(metrics: dict, out: Path) -> None:
    """A finished run's lines (process 0 alone prints)."""
    import jax

    if jax.process_index() != 0:
        return
    print(TASKS[metrics["task"]].summary(metrics))
    split = metrics["time_split_s"]
    print(
        f"wall time {split['total']:.0f} s: start-up and data {split['startup_and_data']:.0f} s, "
        f"compile {split['compile']:.0f} s, training {split['training']:.0f} s, evaluation "
        f"{split['evaluation']:.0f} s"
    )
    print(f"checkpoint: {metrics['checkpoint']}")
    print(f"metrics:    {out / 'metrics.json'}")


def _progress(a) -> str | None:
    return "lines" if a.no_progress else None


def _checkpoint(a) -> tuple[str, type[train.AbstractTask]]:
    """The checkpoint `--checkpoint` and `--best` name, and its task."""
    path = Path(a.checkpoint)
    pair = [m for m in PAIR if (path / m / train.CHECKPOINT).is_file()]
    if path.is_dir() and not (path / train.CHECKPOINT).is_file() and pair:
        raise RunError(
            f"{str(path)!r} holds the runs {', '.join(pair)}: name one of them "
            f"(`checkpoint` {str(path / pair[0])!r})"
        )
    if a.best:
        if not path.is_dir():
            raise ConfigError("`best` takes a run's directory as `checkpoint` (its best.eqx)")
        if not (path / train.BEST).is_file():
            raise RunError(
                f"{str(path)!r} has no {train.BEST}: a run keeps its best validated epoch's "
                "model when its task has a validation split (text, graphs; not the digits)"
            )
        path = path / train.BEST
    path, header = train.read_header(path)
    if header.get("task") not in TASKS:
        raise RunError(f"{str(path)!r} holds a model of an unknown task {header.get('task')!r}")
    return str(path), TASKS[header["task"]]


def _cmd_evaluate(a) -> None:
    progress = False if a.no_progress else None
    path, task = _checkpoint(a)
    r = train.evaluate(path, task, list(a.steps) if a.steps else None, progress=progress)
    print("\n".join(task.evaluation_report(r)))
    if a.json:
        try:
            with open(a.json, "w") as f:
                json.dump(r, f, indent=2)
        except OSError as e:
            raise RunError(f"cannot write {a.json!r}: {e.strerror}") from None


def _check_generate(a) -> None:
    """`eqattn generate`'s options, checked before anything loads."""
    if a.tokens < 0:
        raise ConfigError(f"--tokens must be >= 0; got {a.tokens}")
    if not (math.isfinite(a.temperature) and a.temperature >= 0):
        raise ConfigError(f"--temperature must be finite and >= 0 (0: greedy); got {a.temperature}")
    if a.top_k is not None and not 1 <= a.top_k <= 256:
        raise ConfigError(f"--top-k must be in 1 .. 256 (the byte values); got {a.top_k}")
    if a.max_steps is not None and a.max_steps < 2:
        raise ConfigError(f"--max-steps must be >= 2; got {a.max_steps}")


def _cmd_generate(a) -> None:
    import codecs
    import warnings

    import jax
    import numpy as np

    from .. import text

    _check_generate(a)
    path, task = _checkpoint(a)
    if task is not text.TextTask:
        raise RunError(
            f"{path!r} holds a {task.name} model, not a language model: train one with "
            "eqattn train --task text"
        )
    model = text.load_model(path, max_steps=a.max_steps)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    sys.stdout.write(a.prompt)

    def show(new: bytes) -> None:
        sys.stdout.write(decoder.decode(new))
        sys.stdout.flush()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = text.generate(
            model,
            a.prompt,
            a.tokens,
            key=jax.random.key(a.seed),
            temperature=a.temperature,
            top_k=a.top_k,
            on_token=show,
        )
    sys.stdout.write(decoder.decode(b"", final=True) + "\n")
    for w in caught:
        print(f"note: {w.message}", file=sys.stderr)
    if not np.all(out.converged):
        missed = int(np.sum(~out.converged))
        print(
            f"warning: {missed} of {a.tokens} tokens' solves did not converge (--max-steps "
            "raises the limit)",
            file=sys.stderr,
        )


def _cmd_retrieve(a) -> None:
    from ..digits import retrieve

    options = dict(patterns=a.patterns, corruption=a.corruption, amount=a.amount)
    r = retrieve(
        a.out, **options, steps=a.steps, seed=a.seed, **({"betas": a.betas} if a.betas else {})
    )
    print(
        f"{r['patterns']} stored digits; queries with {r['corruption']} {r['amount']:g}; "
        f"{r['steps']} update{'s' * (r['steps'] != 1)}; nearest stored pattern to the raw query "
        f"is right for {r['nearest_neighbour_of_query']:.1%}"
    )
    print("    beta  pattern acc.  class acc.  mean error")
    for row in r["rows"]:
        print(
            f"{row['beta']:>8g}  {row['pattern_accuracy']:>12.1%}  {row['class_accuracy']:>10.1%}"
            f"  {row['mean_error']:>10.3f}"
        )
    print(f"figure: {r['figure']} (beta = {r['best_beta']:g})")


def _cmd_info(a) -> None:
    from .._info import info

    d = info()
    rows = [("python", d["python"])]
    rows += [(k, v or "not installed") for k, v in d["versions"].items()]
    rows += [("backend", d["backend"])] + [("device", x) for x in d["devices"]]
    rows += [("attention", f'implementation="auto" follows {d["attention_auto"]}')]
    rows += [("solvers", f"{k}: {'yes' if v else 'no'}") for k, v in d["solver_backends"].items()]
    print("\n".join(f"{k:<14}{v}" for k, v in rows))


RENAMED = {"budgets": "--steps", "out_dir": "--out"}
"""Python parameters whose option has another name."""


def in_flags(message: str, command: argparse.ArgumentParser) -> str:
    """A library error's message with each parameter it names (`dim`) written as the option
    of `command` that sets it (`--dim`)."""
    options = {a.dest: a.option_strings[0] for a in command._actions if a.option_strings}

    def flag(match: re.Match) -> str:
        name = match.group(1)
        return RENAMED.get(name) or options.get(name, match.group(0))

    return re.sub(r"`([a-z_]+)`", flag, message)


def _task_of(argv: Sequence[str]) -> str:
    """The `--task` given to `eqattn train` in `argv` (its settings' options depend on it)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--task", choices=tuple(TASKS), default=DEFAULT_TASK)
    known, _ = pre.parse_known_args(argv)
    return known.task


def _unraisable(command: str, hook, unraisable) -> None:
    """`sys.unraisablehook` of the command: Ctrl-C that lands where Python cannot raise it (a
    garbage-collection callback, which XLA runs while it compiles) would be printed and lost,
    and the run go on: the command ends there instead, as interrupted (no file of a run is
    half-written: each is written whole, or not at all)."""
    if not issubclass(unraisable.exc_type, KeyboardInterrupt):
        return hook(unraisable)
    print(f"eqattn {command}: interrupted", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status (0 ok, 1 failure, 2 bad usage, 130 interrupted).
    Errors are one line on stderr; `--debug` or `EQATTN_DEBUG=1` raises them with a traceback."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args, unknown = parser(_task_of(argv)).parse_known_args(argv)
    if unknown:  # named by the subcommand's parser, which points at its own --help
        args.subcommands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    debug = args.debug or os.environ.get("EQATTN_DEBUG", "") not in ("", "0")
    if threading.current_thread() is threading.main_thread():
        # Ctrl-C must reach the training loop (which saves a checkpoint) even when this process
        # was started with SIGINT ignored, as background jobs of a shell are.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.unraisablehook = functools.partial(_unraisable, args.command, sys.unraisablehook)
    command = {
        "train": _cmd_train,
        "evaluate": _cmd_evaluate,
        "retrieve": _cmd_retrieve,
        "generate": _cmd_generate,
        "info": _cmd_info,
    }[args.command]
    try:
        command(args)
    except ConfigError as e:
        if debug:
            raise
        line = in_flags(str(e), args.subcommands[args.command])
        print(
            f"eqattn {args.command}: error: {line} (see eqattn {args.command} --help)",
            file=sys.stderr,
        )
        return 2
    except (RunError, ImportError) as e:
        if debug:
            raise
        line = in_flags(str(e), args.subcommands[args.command])
        print(f"eqattn {args.command}: error: {line}", file=sys.stderr)
        return 1
    except Interrupted as e:
        out = getattr(args, "run_dir", None)
        hint = "" if out is None else f" (eqattn train --resume --out {out} continues it)"
        print(f"eqattn {args.command}: {e}{hint}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print(f"eqattn {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug, or a failure nobody foresaw: one line unless debugging
        if debug:
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else "no detail"
        print(
            f"eqattn {args.command}: internal error: {type(e).__name__}: {first} "
            "(--debug or EQATTN_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return 1
    return 0


def run() -> NoReturn:
    """The `eqattn` command as a process: `main()`, then exit with its status. An interrupted
    run ends at once, its line printed and flushed (`os._exit`): the interpreter's usual
    teardown can crash (a segmentation fault) while XLA's threads are still compiling what
    the interrupt cut short, and nothing is left to clean up by then (the run directory was
    released on the way out, and every file of a run is written whole or not at all)."""
    code = main()
    if code == 130:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    sys.exit(code)
