"""Errors the command reports in one line (no traceback)."""


class CommandError(Exception):
    """A user-facing failure: bad input, a missing or corrupt file, an unwritable directory."""


class Interrupted(Exception):
    """Training stopped by Ctrl-C after saving the model as it stood."""


class UsageError(CommandError):
    """A bad option value (exit status 2, as argparse gives for malformed options)."""
