"""The `eqattn` command line: `train`, `evaluate`, `retrieve`, `info`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence

from ._errors import CommandError, Interrupted, UsageError
from ._models import ADJOINTS, SOLVERS, ModelConfig


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas; got {text!r}")


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas; got {text!r}")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="eqattn", description="Equilibrium attention on the scikit-learn digits.")
    p.add_argument(
        "--debug",
        action="store_true",
        help="show the Python traceback of an error (also: EQATTN_DEBUG=1)",
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    tr = sub.add_parser("train", help="train a DEQ transformer (or --model explicit) on digits")
    _model_options(tr)
    _training_options(tr)
    _run_options(tr)
    _evaluate_options(
        sub.add_parser(
            "evaluate", help="test accuracy of a checkpoint and its test-time compute knob"
        )
    )
    _retrieve_options(
        sub.add_parser("retrieve", help="Hopfield retrieval of digits from corrupted queries")
    )
    sub.add_parser("info", help="versions, devices and solver backends")
    for command in sub.choices.values():  # --help shows every default
        for action in command._actions:
            if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
                action.help = (action.help or "") + " (default: %(default)s)"
    return p


def _model_options(tr) -> None:
    """`eqattn train`'s model and solver options (`ModelConfig`)."""
    m = ModelConfig()
    tr.add_argument("--model", choices=("deq", "explicit"), default=m.model)
    tr.add_argument(
        "--tokens",
        choices=("rows", "patches"),
        default=m.tokens,
        help="8 rows of 8 pixels, or 16 patches of 2x2",
    )
    tr.add_argument("--dim", type=int, default=m.dim, help="width of the DEQ model")
    tr.add_argument("--heads", type=int, default=m.heads)
    tr.add_argument(
        "--depth",
        type=int,
        default=m.depth,
        help="blocks of the explicit model (its width matches the DEQ's parameters)",
    )
    tr.add_argument(
        "--dropout", type=float, default=m.dropout, help="dropout rate (one mask per solve)"
    )
    tr.add_argument("--solver", choices=tuple(SOLVERS), default=m.solver)
    tr.add_argument("--adjoint", choices=ADJOINTS, default=m.adjoint)
    tr.add_argument(
        "--rtol", type=float, default=m.rtol, help="solver tolerance (relative residual)"
    )
    tr.add_argument("--max-steps", type=int, default=m.max_steps, help="solver step limit")
    tr.add_argument(
        "--backward-solver",
        choices=tuple(SOLVERS),
        default=m.backward_solver,
        help="implicit adjoint: the solver of the backward linear system",
    )
    tr.add_argument(
        "--backward-steps",
        type=int,
        default=m.backward_steps,
        help="implicit adjoint: the backward solve's step limit",
    )


def _training_options(tr) -> None:
    """`eqattn train`'s optimisation and DEQ training options (`TrainConfig`)."""
    t = _train_defaults()
    tr.add_argument("--epochs", type=int, default=t.epochs)
    tr.add_argument("--batch-size", type=int, default=t.batch_size)
    tr.add_argument(
        "--lr", type=float, default=t.lr, help="peak learning rate (warm-up, cosine decay)"
    )
    tr.add_argument("--weight-decay", type=float, default=t.weight_decay)
    tr.add_argument("--clip", type=float, default=t.clip, help="gradient-norm clipping (0: off)")
    tr.add_argument(
        "--shift",
        type=int,
        default=t.shift,
        help="augmentation: random shifts of up to this many pixels",
    )
    tr.add_argument("--label-smoothing", type=float, default=t.label_smoothing)
    tr.add_argument(
        "--train-size", type=int, default=None, help="use only the first N training images"
    )
    tr.add_argument("--seed", type=int, default=t.seed)
    tr.add_argument(
        "--train-steps",
        type=int,
        default=None,
        help=f"DEQ: the solver's step limit while training, at most --max-steps (which "
        f"evaluation uses; default: {t.train_steps}, or --max-steps if lower)",
    )
    tr.add_argument(
        "--warm-start",
        action=argparse.BooleanOptionalAction,
        default=t.warm_start,
        help="DEQ: start each training example's solve from its previous fixed point",
    )
    tr.add_argument(
        "--jacobian-weight",
        type=float,
        default=t.jacobian_weight,
        help="DEQ: weight of the Jacobian penalty |df/dz|_F^2 at the fixed point (0: off)",
    )
    tr.add_argument(
        "--corrections",
        type=int,
        default=t.corrections,
        help="DEQ: fixed-point correction, a loss at the end of each of this many pieces of the "
        "training solve, each with a one-step phantom gradient (0: off)",
    )
    tr.add_argument(
        "--correction-decay",
        type=float,
        default=t.correction_decay,
        help="DEQ: weight decay of earlier pieces' losses (--corrections)",
    )


def _run_options(tr) -> None:
    """`eqattn train`'s run directory, progress and process options."""
    tr.add_argument(
        "--out", default="runs/digits", help="output directory (checkpoint.eqx, metrics.json)"
    )
    tr.add_argument(
        "--no-progress",
        action="store_true",
        help="one plain line per epoch instead of a progress bar (the default off a terminal)",
    )
    tr.add_argument(
        "--overwrite",
        action="store_true",
        help="if --out holds a run, move it into --out/replaced-<time>/ and start afresh",
    )
    tr.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its last full epoch (its saved settings)",
    )
    dist = tr.add_argument_group(
        "several processes (data parallel over all their devices; process 0 writes --out)"
    )
    dist.add_argument(
        "--coordinator",
        default=None,
        metavar="HOST:PORT",
        help="address of process 0, where the processes meet (jax.distributed.initialize)",
    )
    dist.add_argument("--num-processes", type=int, default=None, help="with --coordinator")
    dist.add_argument("--process-id", type=int, default=None, help="with --coordinator: 0 .. N-1")
    dist.add_argument(
        "--cluster",
        action="store_true",
        help="join the processes of this cluster job as JAX detects it (SLURM, Open MPI, "
        "Cloud TPU): jax.distributed.initialize() with no arguments",
    )


def _evaluate_options(ev) -> None:
    ev.add_argument(
        "--checkpoint", required=True, help="checkpoint.eqx, or the directory holding it"
    )
    ev.add_argument(
        "--steps", type=_ints, default=None, help="solver step budgets to try, e.g. 2,4,8,16"
    )
    ev.add_argument("--json", default=None, help="also write the results to this JSON file")


def _retrieve_options(re) -> None:
    re.add_argument("--patterns", type=int, default=200, help="images stored")
    re.add_argument("--corruption", choices=("mask", "noise"), default="mask")
    re.add_argument("--amount", type=float, default=0.5, help="fraction masked, or noise std")
    re.add_argument(
        "--betas", type=_floats, default=None, help="inverse temperatures, e.g. 1,4,16,64"
    )
    re.add_argument("--steps", type=int, default=1, help="Hopfield updates per query")
    re.add_argument("--seed", type=int, default=0)
    re.add_argument("--out", default="runs/retrieval", help="output directory (retrieval.png)")


def _train_defaults():
    from ._step import TrainConfig

    return TrainConfig()


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


def _cmd_train(a) -> None:
    from ._step import TrainConfig
    from ._train import train

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
    steps = (
        f" | solver steps {metrics['test_mean_solver_steps']:.1f} (mean), "
        f"{metrics['test_converged']:.1%} converged"
        if model_config.model == "deq"
        else ""
    )
    import jax

    if jax.process_index() != 0:  # process 0 reports
        return
    mem = metrics["step_temp_memory_mb"]
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
    if a.json:
        try:
            with open(a.json, "w") as f:
                json.dump(r, f, indent=2)
        except OSError as e:
            raise CommandError(f"cannot write {a.json!r}: {e.strerror}") from None


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
