"""The `eqattn` command line: `train`, `evaluate`, `generate`, `retrieve`, `info`. It parses,
calls `eqattn.train` (and `eqattn.text`), prints and sets the exit status; the library's
`ConfigError` is a usage error (exit 2), its `RunError` a failure (exit 1)."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from ..train import ConfigError, Interrupted, RunError
from ._parser import SETTINGS, defaults, parser


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


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _settings(a) -> dict:
    """The run's settings: those given, checked to apply to `--task`, and the task's defaults
    for the rest."""
    from ..train import tasks

    given = {name: getattr(a, name) for name in SETTINGS if getattr(a, name) is not None}
    others = (task.options for name, task in tasks().items() if name != a.task)
    foreign = sorted(set(given).intersection(set().union(*others)) - tasks()[a.task].options)
    if foreign:
        raise ConfigError(
            f"{', '.join(map(_option, foreign))} {'is' if len(foreign) == 1 else 'are'} not for "
            f"--task {a.task}"
        )
    values = {**{k: v for k, v in defaults(a.task, a.model).items() if k in SETTINGS}, **given}
    if "text" in given:
        values["text"] = tuple(given["text"])
    if "train_steps" not in given:
        values["train_steps"] = min(defaults(a.task, a.model)["train_steps"], values["max_steps"])
    return values


def _cmd_train(a) -> None:
    from ..train import configs, task_of, train

    out = a.out or f"runs/{a.task}"
    if a.resume:
        given = [n for n in SETTINGS if getattr(a, n) is not None and n != "epochs"]
        if given:
            raise ConfigError(
                f"--resume continues the run with its saved settings: "
                f"{', '.join(map(_option, given))} cannot change (--epochs can)"
            )
        _distributed(a)
        metrics = train(
            *configs(),
            out,
            progress=_progress(a),
            overwrite=a.overwrite,
            resume=True,
            epochs=a.epochs,
        )
    else:
        values = _settings(a)
        _distributed(a)
        model_config, config = configs(a.task, a.model, **values)
        metrics = train(model_config, config, out, progress=_progress(a), overwrite=a.overwrite)
    import jax

    if jax.process_index() != 0:  # process 0 reports
        return
    print(task_of(metrics["task"]).summary(metrics))
    split = metrics["time_split_s"]
    print(
        f"wall time {split['total']:.0f} s: start-up and data {split['startup_and_data']:.0f} s, "
        f"compile {split['compile']:.0f} s, training {split['training']:.0f} s, evaluation "
        f"{split['evaluation']:.0f} s"
    )
    print(f"checkpoint: {metrics['checkpoint']}")
    print(f"metrics:    {out.rstrip('/')}/metrics.json")


def _progress(a) -> str | None:
    return "lines" if a.no_progress else None


def _checkpoint(a) -> str:
    """The checkpoint `--checkpoint` and `--best` name."""
    from ..train import BEST

    path = Path(a.checkpoint)
    if not a.best:
        return a.checkpoint
    if not path.is_dir():
        raise ConfigError("--best takes a run's directory as --checkpoint (it reads its best.eqx)")
    if not (path / BEST).is_file():
        raise RunError(
            f"{str(path)!r} has no {BEST}: only runs of a task with a validation split (text) "
            "keep one"
        )
    return str(path / BEST)


def _cmd_evaluate(a) -> None:
    from ..train import evaluate, task_of

    progress = False if a.no_progress else None
    r = evaluate(_checkpoint(a), list(a.steps) if a.steps else None, progress=progress)
    print("\n".join(task_of(r["task"]).evaluation_report(r)))
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
    from ..train import load_model, task_of

    _check_generate(a)
    path = _checkpoint(a)
    model, config, _ = load_model(path, a.max_steps)
    if not task_of(config.task).language_model:
        raise RunError(
            f"{path!r} holds a {config.task} model, not a language model: train one with "
            "eqattn train --task text"
        )
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
    from ..train import retrieve

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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status (0 ok, 1 failure, 2 bad usage, 130 interrupted).
    Errors are one line on stderr; `--debug` or `EQATTN_DEBUG=1` raises them with a traceback."""
    args, unknown = parser().parse_known_args(argv)
    if unknown:  # named by the subcommand's parser, which points at its own --help
        args.subcommands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    debug = args.debug or os.environ.get("EQATTN_DEBUG", "") not in ("", "0")
    if threading.current_thread() is threading.main_thread():
        # Ctrl-C must reach the training loop (which saves a checkpoint) even when this process
        # was started with SIGINT ignored, as background jobs of a shell are.
        signal.signal(signal.SIGINT, signal.default_int_handler)
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
        print(
            f"eqattn {args.command}: error: {e} (see eqattn {args.command} --help)", file=sys.stderr
        )
        return 2
    except (RunError, ImportError) as e:
        if debug:
            raise
        print(f"eqattn {args.command}: error: {e}", file=sys.stderr)
        return 1
    except Interrupted as e:
        print(f"eqattn {args.command}: {e}", file=sys.stderr)
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
