"""The `eqattn` command line: `train`, `evaluate`, `generate`, `retrieve`, `info`."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence

from ._errors import CommandError, Interrupted, UsageError
from ._models import ModelConfig, text_defaults
from ._parser import TASK_OPTIONS, _train_defaults, parser


def _distributed(a) -> None:
    """Join the other processes of a multi-process run, if asked to (before any JAX work)."""
    given = [a.coordinator, a.num_processes, a.process_id]
    if a.cluster and any(x is not None for x in given):
        raise UsageError("--cluster detects the processes itself: no --coordinator etc. with it")
    if not a.cluster and all(x is None for x in given):
        return
    if not a.cluster and any(x is None for x in given):
        raise UsageError("--coordinator, --num-processes and --process-id go together")
    if not a.cluster and not (a.num_processes >= 1 and 0 <= a.process_id < a.num_processes):
        raise UsageError(
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
        raise CommandError(f"could not join the other processes: {first}") from None


def _task_defaults(a) -> None:
    """Fill the options whose default depends on `--task` (and `--model`) and were not given."""
    defaults = {**dataclasses.asdict(ModelConfig()), **dataclasses.asdict(_train_defaults())}
    defaults["out"] = "runs/digits"
    if a.task == "text":
        defaults.update(text_defaults(a.model), out="runs/text")
    for name in TASK_OPTIONS:
        if getattr(a, name) is None:
            setattr(a, name, defaults[name])
    if a.text is not None and a.task != "text":
        raise UsageError("--text is for --task text")


def _cmd_train(a) -> None:
    from ._step import TrainConfig
    from ._train import train

    _task_defaults(a)
    _distributed(a)
    if a.train_steps is None:
        a.train_steps = min(_train_defaults().train_steps, a.max_steps)
    elif a.model == "deq" and a.train_steps > a.max_steps and not a.resume:
        raise UsageError(
            f"--train-steps ({a.train_steps}) must be at most --max-steps ({a.max_steps}), the "
            "solver's step limit the model is built with"
        )

    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    args = vars(a)
    model_config = ModelConfig(**{k: v for k, v in args.items() if k in model_fields})
    config = TrainConfig(**{k: v for k, v in args.items() if k in train_fields})
    metrics = train(
        model_config,
        config,
        a.out,
        progress="lines" if a.no_progress else None,
        overwrite=a.overwrite,
        resume=a.resume,
    )
    import jax

    if jax.process_index() != 0:  # process 0 reports
        return
    _report(a, metrics)


def _report(a, metrics) -> None:
    """The run's summary (from its metrics: with --resume, the run's own configuration)."""
    model_config = ModelConfig.from_dict(metrics["model_config"])
    steps = (
        f" | solver steps {metrics['test_mean_solver_steps']:.1f} (mean), "
        f"{metrics['test_converged']:.1%} converged"
        if model_config.model == "deq"
        else ""
    )
    mem = metrics["step_temp_memory_mb"]
    if model_config.task == "text":
        corpus = metrics["corpus"]
        print(
            f"{model_config.model}: test {metrics['test_bits_per_byte']:.3f} bits per byte "
            f"({metrics['test_scored_bytes']:,} bytes of {corpus['documents']['test']} "
            f"documents) | {metrics['epochs_done']} epochs in {metrics['train_time_s']:.0f} s "
            f"(+{metrics['compile_time_s']:.0f} s compile, "
            f"{metrics['train_tokens_per_s']:,.0f} tokens/s) | {metrics['params']:,} params"
            + ("" if mem is None else f" | train-step memory {mem:.1f} MB")
            + steps
        )
    else:
        print(
            f"{model_config.model}: test accuracy {metrics['test_accuracy']:.2%} "
            f"({metrics['test_examples']} images) | {metrics['epochs_done']} epochs in "
            f"{metrics['train_time_s']:.0f} s (+{metrics['compile_time_s']:.0f} s compile) | "
            f"{metrics['params']:,} params"
            + ("" if mem is None else f" | train-step memory {mem:.1f} MB")
            + steps
        )
    split = metrics["time_split_s"]
    print(
        f"wall time {split['total']:.0f} s: start-up and data {split['startup_and_data']:.0f} s, "
        f"compile {split['compile']:.0f} s, training {split['training']:.0f} s, evaluation "
        f"{split['evaluation']:.0f} s"
    )
    print(f"checkpoint: {metrics['checkpoint']}")
    print(f"metrics:    {a.out.rstrip('/')}/metrics.json")


def _cmd_evaluate(a) -> None:
    from ._evaluate import evaluate

    r = evaluate(a.checkpoint, list(a.steps) if a.steps else None)
    if r.get("task") == "text":
        _print_text_evaluation(r)
    else:
        _print_evaluation(r)
    if a.json:
        try:
            with open(a.json, "w") as f:
                json.dump(r, f, indent=2)
        except OSError as e:
            raise CommandError(f"cannot write {a.json!r}: {e.strerror}") from None


def _print_evaluation(r) -> None:
    print(
        f"test accuracy {r['test_accuracy']:.2%} ({r['test_examples']} images, {r['model']} model)"
    )
    if "solver_steps" in r:
        s = r["solver_steps"]
        print(
            f"solver steps per example: mean {s['mean']:.1f}, median {s['median']:.0f}, "
            f"90th percentile {s['p90']:.0f}, max {s['max']} (limit {s['max_steps']}); "
            f"{s['converged']:.1%} converged"
        )
        print("max steps  accuracy  mean steps  converged  rel. residual")
        for row in r["budget_sweep"]:
            print(
                f"{row['max_steps']:>9}  {row['test_accuracy']:>8.2%}  {row['mean_steps']:>10.1f}  "
                f"{row['converged']:>9.1%}  {row['mean_relative_residual']:>13.1e}"
            )


def _print_text_evaluation(r) -> None:
    print(
        f"test {r['test_bits_per_byte']:.4f} bits per byte ({r['test_scored_bytes']:,} bytes, "
        f"{r['model']} model; windows of {r['evaluation']['context']}, stride "
        f"{r['evaluation']['stride']})"
    )
    if "solver_steps" in r:
        s = r["solver_steps"]
        print(
            f"solver steps per window: mean {s['mean']:.1f} (limit {s['max_steps']}); "
            f"{s['converged']:.1%} converged"
        )
        print("max steps  bits/byte  mean steps  converged  rel. residual")
        for row in r["budget_sweep"]:
            print(
                f"{row['max_steps']:>9}  {row['bits_per_byte']:>9.4f}  "
                f"{row['mean_solver_steps']:>10.1f}  {row['converged']:>9.1%}  "
                f"{row['mean_relative_residual']:>13.1e}"
            )


def _cmd_generate(a) -> None:
    import codecs
    import warnings

    import jax
    import numpy as np

    from .. import text

    if a.tokens < 0:
        raise UsageError(f"--tokens must be >= 0; got {a.tokens}")
    model = text.load_model(a.checkpoint, a.max_steps)
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
        print(
            f"warning: {int(np.sum(~out.converged))} of {a.tokens} tokens' solves did not "
            "converge (--max-steps raises the limit)",
            file=sys.stderr,
        )


def _cmd_retrieve(a) -> None:
    from ._retrieve import BETAS, retrieve

    r = retrieve(
        a.out,
        patterns=a.patterns,
        corruption=a.corruption,
        amount=a.amount,
        betas=a.betas or BETAS,
        steps=a.steps,
        seed=a.seed,
    )
    print(
        f"{r['patterns']} stored digits; queries with {r['corruption']} {r['amount']:g}; "
        f"{r['steps']} update(s); nearest stored pattern to the raw query is right for "
        f"{r['nearest_neighbour_of_query']:.1%}"
    )
    print("    beta  pattern acc.  class acc.  mean error")
    for row in r["rows"]:
        print(
            f"{row['beta']:>8g}  {row['pattern_accuracy']:>12.1%}  {row['class_accuracy']:>10.1%}"
            f"  {row['mean_error']:>10.3f}"
        )
    print(f"figure: {r['figure']} (beta = {r['best_beta']:g})")


def _cmd_info(a) -> None:
    from ._info import format_info, info

    print(format_info(info()))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status (0 ok, 1 failure, 2 bad usage, 130 interrupted).
    Errors are one line on stderr; `--debug` or `EQATTN_DEBUG=1` raises them with a traceback."""
    args = parser().parse_args(argv)
    debug = args.debug or os.environ.get("EQATTN_DEBUG", "") not in ("", "0")
    if threading.current_thread() is threading.main_thread():
        # Ctrl-C must reach the training loop (which saves a checkpoint) even when this process
        # was started with SIGINT ignored, as background jobs of a shell are.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        {
            "train": _cmd_train,
            "evaluate": _cmd_evaluate,
            "retrieve": _cmd_retrieve,
            "generate": _cmd_generate,
            "info": _cmd_info,
        }[args.command](args)
    except UsageError as e:
        if debug:
            raise
        print(
            f"eqattn {args.command}: error: {e} (see eqattn {args.command} --help)", file=sys.stderr
        )
        return 2
    except (CommandError, ImportError) as e:
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
