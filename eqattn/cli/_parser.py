"""The `eqattn` command line's options: one parser, its option groups and their help."""

from __future__ import annotations

import argparse
import dataclasses
import re
import types
import typing

from .. import digits, graphs, mazes, prefix_sums, text, train

TASKS: dict[str, type[train.AbstractTask]] = {
    t.name: t
    for t in (
        graphs.GraphTask,
        graphs.GenericGraphTask,
        digits.DigitsTask,
        text.TextTask,
        prefix_sums.PrefixSumsTask,
        mazes.MazesTask,
    )
}
"""The tasks `eqattn train --task` knows."""
DEFAULT_TASK = "graphs"

DESCRIPTION = (
    "Equilibrium attention: train DEQ models and their explicit twins of equal size on graphs, "
    "the digits or text, evaluate them against the solver's budget, generate text, and "
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


def _setting_type(hint) -> dict:
    """The argparse keywords of a configuration field of type `hint`."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        hint = next(t for t in typing.get_args(hint) if t is not type(None))
    if hint is bool:
        return dict(action=argparse.BooleanOptionalAction)
    if typing.get_origin(hint) is tuple:
        items = typing.get_args(hint)
        if items[-1] is Ellipsis:
            return dict(nargs="+", type=items[0])
        return dict(nargs=len(items), type=items[0])
    if typing.get_origin(hint) is typing.Literal:
        return dict(type=type(typing.get_args(hint)[0]))
    return dict(type=hint)


def _settings(tr, task: type[train.AbstractTask]) -> None:
    """`eqattn train`'s options for `task`: one per field of its configuration, with the field's
    help, choices and this task's default (each `None` unless given, so the command knows which
    were given)."""
    config_type = task.config_type
    hints = typing.get_type_hints(config_type)
    group = tr.add_argument_group(f"settings of --task {task.name} (its defaults)")
    for f in dataclasses.fields(config_type):
        if f.name in FIXED:
            continue
        meta = train.field_metadata(config_type, f.name)
        kwargs = _setting_type(hints[f.name])
        if "choices" in meta:
            kwargs["choices"] = meta["choices"]
        shown = " ".join(map(str, f.default)) if isinstance(f.default, tuple) else f.default
        help = meta["help"] + ("" if f.default is None else f" (default: {shown})")
        help = re.sub(r"`([a-z_]+)`", lambda m: _flag(m.group(1)), help)  # parameters as options
        metavar = METAVARS.get(f.name)
        group.add_argument(
            _flag(f.name),
            default=None,
            help=help,
            **kwargs,
            **({"metavar": metavar} if metavar else {}),
        )


METAVARS: dict[str, str | tuple[str, ...]] = {
    "text": "PATH",
    "graph_sizes": ("LOW", "HIGH"),
    "families": "FAMILY",
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


FIXED = ("model", "width", "mlp_ratio")
"""Configuration fields that are not options: `--model` is its own, the explicit model's shape
is matched to the DEQ's."""


def settings(task: type[train.AbstractTask]) -> tuple[str, ...]:
    """The configuration fields `eqattn train --task TASK` takes as options."""
    return tuple(f.name for f in dataclasses.fields(task.config_type) if f.name not in FIXED)


def parser(task: str = DEFAULT_TASK) -> argparse.ArgumentParser:
    """The command's parser, `eqattn train`'s settings those of `task`."""
    p = _Parser(prog="eqattn", description=DESCRIPTION)
    p.add_argument(
        "--debug",
        action="store_true",
        help="show the Python traceback of an error (also: EQATTN_DEBUG=1)",
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    tr = sub.add_parser("train", help="train a DEQ and its explicit twin on a task")
    tr.description = (
        f"Train on --task {task} ({TASKS[task].description}). Its settings follow; "
        "`eqattn train --task NAME --help` lists another task's."
    )
    described = "; ".join(f"{name}: {cls.description}" for name, cls in TASKS.items())
    tr.add_argument(
        "--task", choices=tuple(TASKS), default=None, help=f"{described} (default: {DEFAULT_TASK})"
    )
    tr.add_argument(
        "--model",
        choices=("deq", "explicit", "both"),
        default=None,
        help="the weight-tied DEQ, its explicit twin of equal parameters, or both, one after the "
        "other and then side by side (default: both)",
    )
    _settings(tr, TASKS[task])
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


def _run_options(tr) -> None:
    """`eqattn train`'s run directory, progress and process options."""
    tr.add_argument(
        "--out",
        default=None,
        help="the run's directory (checkpoint.eqx, metrics.json; default: runs/TASK/MODEL); "
        "with --model both, the folder of the two runs (default: runs/TASK)",
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
        help="continue the run in --out (or the pair's unfinished runs) from its last full "
        "epoch with its saved settings (--epochs N sets its length anew: a finished run is "
        "extended)",
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
