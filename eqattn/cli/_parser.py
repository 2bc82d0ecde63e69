"""The `eqattn` command line's options: one parser, its option groups and their defaults."""

from __future__ import annotations

import argparse

from ._models import ADJOINTS, SOLVERS, ModelConfig, text_defaults


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
    _solver_options(tr)
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
    _generate_options(
        sub.add_parser("generate", help="continue a prompt with a text checkpoint's model")
    )
    sub.add_parser("info", help="versions, devices and solver backends")
    for command in sub.choices.values():  # --help shows every default
        for action in command._actions:
            if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
                action.help = (action.help or "") + " (default: %(default)s)"
    return p


def _model_options(tr) -> None:
    """`eqattn train`'s task and model options (`ModelConfig`)."""
    m = ModelConfig()
    tr.add_argument(
        "--task",
        choices=("digits", "text"),
        default=m.task,
        help="digits: classify the scikit-learn digits; text: a causal byte-level language model",
    )
    tr.add_argument("--model", choices=("deq", "explicit"), default=m.model)
    tr.add_argument(
        "--context",
        type=int,
        default=m.context,
        help="text: positions per window (the model's context, in bytes)",
    )
    tr.add_argument(
        "--text",
        nargs="+",
        default=None,
        metavar="PATH",
        help="text: the corpus's files or folders (default: the Python standard library's "
        "source of this interpreter)",
    )
    tr.add_argument(
        "--tokens",
        choices=("rows", "patches"),
        default=m.tokens,
        help="8 rows of 8 pixels, or 16 patches of 2x2",
    )
    tr.add_argument(
        "--dim", type=int, default=None, help=f"width of the DEQ model ({_by_task('dim')})"
    )
    tr.add_argument("--heads", type=int, default=m.heads)
    tr.add_argument(
        "--depth",
        type=int,
        default=m.depth,
        help="blocks of the explicit model (its width matches the DEQ's parameters)",
    )
    tr.add_argument(
        "--cell-depth",
        type=int,
        default=m.cell_depth,
        help="blocks of the DEQ model's map, iterated together to the fixed point (1: one "
        "weight-tied block)",
    )
    tr.add_argument(
        "--stem-depth",
        type=int,
        default=None,
        help="explicit blocks between the DEQ model's embedding and its implicit block "
        f"({_by_task('stem_depth')})",
    )
    tr.add_argument(
        "--attend-input",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="DEQ: the implicit block's attention reads its state plus the injected input "
        f"({_by_task('attend_input')})",
    )
    tr.add_argument(
        "--dropout",
        type=float,
        default=None,
        help=f"dropout rate (one mask per solve; {_by_task('dropout')})",
    )


def _solver_options(tr) -> None:
    """`eqattn train`'s DEQ solver and adjoint options (`ModelConfig`)."""
    m = ModelConfig()
    tr.add_argument("--solver", choices=tuple(SOLVERS), default=None, help=_by_task("solver"))
    tr.add_argument("--adjoint", choices=ADJOINTS, default=None, help=_by_task("adjoint"))
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
    tr.add_argument(
        "--phantom-steps",
        type=int,
        default=m.phantom_steps,
        help="phantom adjoint: the damped steps from the fixed point it backpropagates through",
    )
    tr.add_argument(
        "--phantom-damping",
        type=float,
        default=m.phantom_damping,
        help="phantom adjoint: the damping of those steps, in (0, 1]",
    )


def _training_options(tr) -> None:
    """`eqattn train`'s optimisation and DEQ training options (`TrainConfig`)."""
    t = _train_defaults()
    tr.add_argument("--epochs", type=int, default=None, help=_by_task("epochs"))
    tr.add_argument(
        "--epoch-steps",
        type=int,
        default=t.epoch_steps,
        help="text: optimizer steps per epoch (each epoch ends with validation and a checkpoint)",
    )
    tr.add_argument("--batch-size", type=int, default=None, help=_by_task("batch_size"))
    tr.add_argument(
        "--lr",
        type=float,
        default=None,
        help=f"peak learning rate (warm-up, cosine decay; {_by_task('lr')})",
    )
    tr.add_argument("--weight-decay", type=float, default=t.weight_decay)
    tr.add_argument("--clip", type=float, default=t.clip, help="gradient-norm clipping (0: off)")
    tr.add_argument(
        "--shift",
        type=int,
        default=t.shift,
        help="augmentation: random shifts of up to this many pixels",
    )
    tr.add_argument("--label-smoothing", type=float, default=None, help=_by_task("label_smoothing"))
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
        default=None,
        help="DEQ: weight of the Jacobian penalty |df/dz|_F^2 at the fixed point (0: off; "
        + _by_task("jacobian_weight")
        + ")",
    )
    tr.add_argument(
        "--jacobian-share",
        type=float,
        default=None,
        help="DEQ: the share of each batch's examples whose fixed points the Jacobian penalty "
        f"probes ({_by_task('jacobian_share')})",
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
        "--out",
        default=None,
        help="output directory (checkpoint.eqx, metrics.json; default: runs/digits or runs/text)",
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


def _generate_options(ge) -> None:
    ge.add_argument(
        "--checkpoint", required=True, help="a text run's checkpoint.eqx, or its directory"
    )
    ge.add_argument("--prompt", default="", help="the text to continue (UTF-8)")
    ge.add_argument("--tokens", type=int, default=200, help="bytes to generate")
    ge.add_argument(
        "--temperature", type=float, default=0.8, help="sampling temperature (0: greedy)"
    )
    ge.add_argument("--top-k", type=int, default=None, help="sample among the k likeliest bytes")
    ge.add_argument("--seed", type=int, default=0)
    ge.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="DEQ: the solver's step limit (default: trained)",
    )


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


TASK_OPTIONS = (
    *("epochs", "batch_size", "label_smoothing", "dropout", "lr", "solver", "adjoint"),
    *("jacobian_weight", "jacobian_share", "dim", "stem_depth", "attend_input", "out"),
)
"""`eqattn train`'s options whose default depends on `--task` and `--model` (`None` in the
parser; `eqattn.cli._main` fills them)."""


def _by_task(name: str) -> str:
    """`name`'s defaults for the digits and for text (the DEQ's: those that differ by model
    are DEQ options), as a help text's end."""
    model = ModelConfig()
    digits = getattr(model if hasattr(model, name) else _train_defaults(), name)
    return f"default: {digits} for digits, {text_defaults('deq').get(name, digits)} for text"


def _train_defaults():
    from ._step import TrainConfig

    return TrainConfig()
