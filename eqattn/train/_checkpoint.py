"""Checkpoints: one file, a JSON header line (format, eqattn version, the task and its configuration,
the payload's size and SHA-256) followed by the model's leaves in Equinox's serialization (no
pickle) and, for resuming a run, the training state at the last epoch boundary."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import equinox as eqx

from .._errors import RunError
from ._files import atomic_write

FORMAT = "eqattn-checkpoint-3"
"""The header's format: the task's name and its configuration's fields (`Config.to_dict`)."""
CHECKPOINT = "checkpoint.eqx"
BEST = "best.eqx"
"""The model of the epoch with the best validation score (tasks with a validation split)."""


# Python bools in a model (the layers' `inference` flags) are modes, not weights: they are not
# stored, so a checkpoint reads the same whether or not its model has such flags.
def _save_leaf(f, x):
    if not isinstance(x, bool):
        eqx.default_serialise_filter_spec(f, x)


def _load_leaf(f, x):
    return x if isinstance(x, bool) else eqx.default_deserialise_filter_spec(f, x)


def _serialise(tree) -> bytes:
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, tree, filter_spec=_save_leaf)
    return buffer.getvalue()


def save_checkpoint(
    path: Path, model: eqx.Module, config: dict[str, Any], *, train_state=None, **extra
) -> None:
    """Write `model`, its `config` and optionally a `train_state` pytree to `path`, durably and
    atomically (a partial file never replaces a good one)."""
    from .. import __version__

    model_bytes = _serialise(model)
    payload = model_bytes + (b"" if train_state is None else _serialise(train_state))
    header = {
        "format": FORMAT,
        "eqattn": __version__,
        "config": config,
        **extra,
        "model_bytes": len(model_bytes),
        "payload_bytes": len(payload),
        "sha256": hashlib.sha256(payload).hexdigest(),
    }
    atomic_write(Path(path), (json.dumps(header) + "\n").encode() + payload)


def read_header(path: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """The checkpoint file (a directory means its `checkpoint.eqx`) and its header."""
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT
    if not path.is_file():
        raise RunError(f"checkpoint not found: {str(path)!r}")
    try:
        with open(path, "rb") as f:
            header = json.loads(f.readline().decode())
    except (UnicodeDecodeError, json.JSONDecodeError, OSError):
        header = None
    if not isinstance(header, dict) or not str(header.get("format")).startswith(
        "eqattn-checkpoint"
    ):
        raise RunError(f"{str(path)!r} is not an eqattn checkpoint (no {FORMAT} header)")
    if header["format"] != FORMAT:
        raise RunError(
            f"{str(path)!r} was written by an earlier development version of eqattn (format "
            f"{header['format']!r}; this version reads {FORMAT!r}): train it again"
        )
    return path, header


def _payload(path: Path) -> tuple[dict[str, Any], bytes]:
    """The header and the checked payload: a truncated or overwritten file is refused."""
    path, header = read_header(path)
    with open(path, "rb") as f:
        f.readline()
        payload = f.read()
    if len(payload) != header.get("payload_bytes"):
        raise RunError(
            f"checkpoint {str(path)!r} is corrupt: {len(payload)} bytes of data, its header "
            f"says {header.get('payload_bytes')} (truncated or appended to)"
        )
    if hashlib.sha256(payload).hexdigest() != header.get("sha256"):
        raise RunError(
            f"checkpoint {str(path)!r} is corrupt: its data does not match the SHA-256 in "
            "its header (overwritten or damaged)"
        )
    return header, payload


def _deserialise(path, data: bytes, like, what: str):
    buffer = io.BytesIO(data)
    try:
        tree = eqx.tree_deserialise_leaves(buffer, like, filter_spec=_load_leaf)
        if buffer.read(1):
            raise ValueError("trailing bytes")
    except Exception as e:  # equinox/numpy raise various errors on foreign data
        raise RunError(
            f"checkpoint {str(path)!r}: its {what} does not match its configuration "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no detail'})"
        ) from None
    return tree


def load_checkpoint(path: str | os.PathLike, like: eqx.Module) -> eqx.Module:
    """Read the model into a pytree shaped like `like` (its checksum checked first)."""
    header, payload = _payload(Path(path))
    return _deserialise(path, payload[: header["model_bytes"]], like, "model")


def load_train_state(path: str | os.PathLike, like):
    """The training state saved after the model, shaped like `like`, and the header."""
    header, payload = _payload(Path(path))
    if "resume" not in header:
        raise RunError(f"checkpoint {str(path)!r} holds no training state to resume from")
    return _deserialise(path, payload[header["model_bytes"] :], like, "training state"), header
