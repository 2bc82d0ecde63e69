"""The errors the training runtime raises for its users (the `eqattn` command prints each as one
line: a `ConfigError` as a usage error, exit status 2; a `RunError` with exit status 1; an
`Interrupted` run with exit status 130)."""


class ConfigError(ValueError):
    """A bad setting: an option's value, or options that do not go together."""


class RunError(RuntimeError):
    """A run that cannot go on: a missing or corrupt checkpoint, an unwritable directory, a loss
    that turned NaN, a corpus that changed since the checkpoint was trained."""


class Interrupted(KeyboardInterrupt):
    """Training stopped by Ctrl-C after saving the model as it stood (the message says where,
    and how to resume)."""
