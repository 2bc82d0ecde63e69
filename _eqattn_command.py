"""The `eqattn` command's entry point. It stands outside the `eqattn` package so that it runs
before `import eqattn` (JAX's start-up: the command's first seconds): Ctrl-C there ends the
command with one line and exit status 130, as it does later, instead of a traceback."""

import os
import signal
import sys


def _interrupted_while_starting(signum, frame) -> None:
    # exits at once: raising KeyboardInterrupt inside an extension module's import (numpy's,
    # jaxlib's) surfaces as an ImportError with two tracebacks
    print("eqattn: interrupted while starting", file=sys.stderr, flush=True)
    os._exit(130)


def run() -> None:
    """`eqattn.cli.run`, once it is imported."""
    # Ctrl-C must reach this process even when it was started with SIGINT ignored, as a shell's
    # background jobs are
    signal.signal(signal.SIGINT, _interrupted_while_starting)
    from eqattn.cli import run as command

    signal.signal(signal.SIGINT, signal.default_int_handler)  # the command sets its own after
    command()
