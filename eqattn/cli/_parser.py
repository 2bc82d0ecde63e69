"""The `eqattn` command line's options: one parser, its option groups and their help."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from ..train import ADJOINTS, SOLVERS, ModelConfig, TrainConfig, tasks

DESCRIPTION = (
    "Equilibrium attention: train DEQ transformers (and explicit baselines of equal size) on "
    "the digits or on text, evaluate them against the solver's budget, generate text, and "
    "retrieve digits from a Hopfield memory."
)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block
        top = "eqattn --help" if self.prog == "eqattn" else f"{self.prog} --help"
        self.exit(2, f"{self.prog}: error: {message} (see {top})\n")


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas; got {text!r}")


def _budgets(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(t) for t in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"expected solver budgets >= 1 separated by commas, e.g. 2,4,8; got {text!r}"
        )
    return values


def _sizes(text: str) -> tuple[int, int]:
    try:
        low, high = (int(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two sizes LOW,HIGH, e.g. 8,16; got {text!r}")
    return low, high


def _names(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def defaults(task: str, model: str) -> dict[str, Any]:
    """Every setting's default for `--task TASK --model MODEL`."""
    fields = {**dataclasses.asdict(ModelConfig()), **dataclasses.asdict(TrainConfig())}
    return {**fields, **tasks()[task].settings(model)}


def _default(name: str, model: str = "deq") -> str:
    """`name`'s default for `model`, per task where the tasks' differ."""
    by_task = {task: defaults(task, model)[name] for task in tasks()}
    if len(set(map(repr, by_task.values()))) == 1:
        return f"default: {next(iter(by_task.values()))}"
    return "default: " + ", ".join(f"{v} for {task}" for task, v in by_task.items())


def _label(name: str) -> str:
    """`[task]` (or `[task, task]`) for a setting that only some tasks read."""
    owners = [task for task, cls in tasks().items() if name in cls.options]
    return f"[{', '.join(owners)}] " if owners else ""


def _add(group, flag: str, help: str, **kwargs) -> None:
    """A setting's option: `default=None` (so the command knows which were given, and fills the
    rest from the task's defaults), labelled with its task, its default stated."""
    name = flag[2:].replace("-", "_")
    if kwargs.get("action") is None:
        kwargs.setdefault("type", type(defaults("digits", "deq")[name]))
    stated = _default(name, "explicit" if help.startswith("explicit:") else "deq")
    text = f"{_label(name)}{help}" + ("" if stated.endswith("None") else f" ({stated})")
    group.add_argument(flag, default=None, help=text, **kwargs)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="eqattn", description=DESCRIPTION)
    p.add_argument(
        "--debug",
        action="store_true",
        help="show the Python traceback of an error (also: EQATTN_DEBUG=1)",
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    names = ", ".join(tasks())
    tr = sub.add_parser("train", help=f"train a DEQ transformer (or --model explicit): {names}")
    tr.description = "Options marked [task] apply to that task alone; the others to every task."
    _model_options(tr)
    _solver_options(tr)
    _training_options(tr)
    _run_options(tr)
    _evaluate_options(
        sub.add_parser("evaluate", help="a checkpoint's test scores and its test-time compute knob")
    )
    _generate_options(
        sub.add_parser("generate", help="continue a prompt with a text checkpoint's model")
    )
    _retrieve_options(
        sub.add_parser("retrieve", help="Hopfield retrieval of digits from corrupted queries")
    )
    sub.add_parser("info", help="versions, devices and solver backends")
    p.set_defaults(subcommands=sub.choices)
    for command in sub.choices.values():  # --help shows every default given to argparse
        for action in command._actions:
            if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
                action.help = (action.help or "") + " (default: %(default)s)"
    return p


def _model_options(tr) -> None:
    """`eqattn train`'s task and model options (`ModelConfig`)."""
    described = "; ".join(f"{name}: {cls.description}" for name, cls in tasks().items())
    tr.add_argument("--task", choices=tuple(tasks()), default="digits", help=described)
    tr.add_argument("--model", choices=("deq", "explicit"), default="deq")
    _add(tr, "--context", "positions per window (the model's context, in bytes)")
    _add(
        tr,
        "--text",
        "the corpus's files or folders (default: the Python standard library's source of this "
        "interpreter)",
        nargs="+",
        metavar="PATH",
        type=str,
    )
    _add(tr, "--tokens", "8 rows of 8 pixels, or 16 patches of 2x2", choices=("rows", "patches"))
    _add(
        tr,
        "--block",
        "the block: norm-preserving propagation, or a transformer block",
        choices=("propagation", "transformer"),
    )
    _add(tr, "--graph-sizes", "the training graphs' sizes: LOW,HIGH nodes", type=_sizes)
    _add(tr, "--families", "the training graphs' families, comma-separated (all)", type=_names)
    _add(tr, "--dim", "width of the DEQ model")
    _add(tr, "--heads", "attention heads")
    _add(tr, "--depth", "explicit: blocks (its width matches the DEQ's parameters)")
    _add(
        tr,
        "--cell-depth",
        "DEQ: blocks of the map, iterated together to the fixed point (1: one weight-tied block)",
    )
    _add(tr, "--stem-depth", "DEQ: explicit blocks between the embedding and the implicit block")
    _add(
        tr,
        "--attend-input",
        "DEQ: the implicit block's attention reads its state plus the injected input",
        action=argparse.BooleanOptionalAction,
    )
    _add(tr, "--dropout", "dropout rate (one mask per solve)", type=float)


def _solver_options(tr) -> None:
    """`eqattn train`'s DEQ solver and adjoint options (`ModelConfig`)."""
    _add(tr, "--solver", "DEQ: the forward solver", choices=SOLVERS)
    _add(tr, "--adjoint", "DEQ: how the fixed point is differentiated", choices=ADJOINTS)
    _add(tr, "--rtol", "DEQ: solver tolerance (relative residual)")
    _add(tr, "--max-steps", "DEQ: solver step limit (evaluation's budget)")
    _add(tr, "--backward-solver", "DEQ, implicit adjoint: the backward solver", choices=SOLVERS)
    _add(tr, "--backward-steps", "DEQ, implicit adjoint: the backward solve's step limit", type=int)
    _add(tr, "--phantom-steps", "DEQ, phantom adjoint: the damped steps it backpropagates")
    _add(tr, "--phantom-damping", "DEQ, phantom adjoint: their damping, in (0, 1]")


def _training_options(tr) -> None:
    """`eqattn train`'s optimisation and DEQ training options (`TrainConfig`)."""
    _add(tr, "--epochs", "epochs (with --resume: the run's new length)")
    _add(tr, "--epoch-steps", "optimizer steps per epoch (each ends with validation)")
    _add(tr, "--batch-size", "examples per optimizer step")
    _add(tr, "--lr", "peak learning rate (warm-up, cosine decay)")
    _add(tr, "--weight-decay", "AdamW's weight decay")
    _add(tr, "--clip", "gradient-norm clipping (0: off)")
    _add(tr, "--shift", "augmentation: random shifts of up to this many pixels")
    _add(tr, "--label-smoothing", "label smoothing")
    _add(tr, "--train-size", "use only the first N training images (default: all)", type=int)
    _add(tr, "--seed", "random seed (initialization, data order, dropout)")
    _add(
        tr,
        "--train-steps",
        "DEQ: the solver's step limit while training, at most --max-steps (or --max-steps if "
        "lower)",
        type=int,
    )
    _add(
        tr,
        "--warm-start",
        "DEQ: start each training example's solve from its previous fixed point",
        action=argparse.BooleanOptionalAction,
    )
    _add(tr, "--jacobian-weight", "DEQ: weight of the Jacobian penalty |df/dz|_F^2 (0: off)")
    _add(tr, "--jacobian-share", "DEQ: the share of a batch whose fixed points it probes")
    _add(
        tr,
        "--corrections",
        "DEQ: fixed-point correction, a loss at the end of each of this many pieces of the "
        "training solve, each with a one-step phantom gradient (0: off)",
    )
    _add(tr, "--correction-decay", "DEQ: weight decay of earlier pieces' losses")


def _run_options(tr) -> None:
    """`eqattn train`'s run directory, progress and process options."""
    tr.add_argument(
        "--out",
        default=None,
        help="output directory (checkpoint.eqx, metrics.json; default: runs/TASK)",
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
        help="continue the run in --out from its last full epoch with its saved settings "
        "(--epochs N sets its length anew: a finished run is extended)",
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


def _checkpoint_option(parser, what: str) -> None:
    parser.add_argument(
        "--checkpoint", required=True, help=f"{what}: a checkpoint file, or the run's directory"
    )
    parser.add_argument(
        "--best",
        action="store_true",
        help="the run's best validated model (best.eqx) instead of its last (checkpoint.eqx)",
    )


def _evaluate_options(ev) -> None:
    _checkpoint_option(ev, "a run")
    ev.add_argument(
        "--steps", type=_budgets, default=None, help="solver step budgets to try, e.g. 2,4,8,16"
    )
    ev.add_argument("--json", default=None, help="also write the results to this JSON file")
    ev.add_argument(
        "--no-progress", action="store_true", help="no progress bar (the default off a terminal)"
    )


def _generate_options(ge) -> None:
    _checkpoint_option(ge, "a text run")
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


SETTINGS = tuple(
    f.name
    for config in (ModelConfig, TrainConfig)
    for f in dataclasses.fields(config)
    if f.name not in ("model", "task", "width", "mlp_ratio", "num_tokens", "in_features")
)
"""The settings `eqattn train` takes as options (each `None` unless given)."""
