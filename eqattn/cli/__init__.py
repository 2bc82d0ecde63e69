"""The `eqattn` command (`eqattn train | evaluate | generate | retrieve | info`). Its Python API
is [`eqattn.train`][] (and [`eqattn.info`][]); the names this module had for it are deprecated
aliases, kept for one release."""

import warnings

from ._main import main as main

# old public name -> (module, new name), kept for one release
_MOVED = {
    "train": ("eqattn.train", "train"),
    "evaluate": ("eqattn.train", "evaluate"),
    "load_model": ("eqattn.train", "load_model"),
    "retrieve": ("eqattn.train", "retrieve"),
    "ModelConfig": ("eqattn.train", "ModelConfig"),
    "TrainConfig": ("eqattn.train", "TrainConfig"),
    "text_configs": ("eqattn.train", "text_configs"),
    "info": ("eqattn", "info"),
}


def __getattr__(name: str):
    if name in _MOVED:
        import importlib

        module, new = _MOVED[name]
        warnings.warn(
            f"`eqattn.cli.{name}` has moved to `{module}.{new}`; the old name will be removed in "
            "the next release.",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(module), new)
    raise AttributeError(f"module 'eqattn.cli' has no attribute {name!r}")
