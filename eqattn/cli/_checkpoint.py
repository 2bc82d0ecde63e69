"""Checkpoints: one file, a JSON header line (format, eqattn version, the model's configuration)
followed by the model's leaves in Equinox's serialization (no pickle)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import equinox as eqx

from ._errors import CommandError

FORMAT = "eqattn-checkpoint-1"
FILENAME = "checkpoint.eqx"


def writable_dir(path: str | os.PathLike) -> Path:
    """`path` as a directory that exists and can be written (made if needed), or a CommandError."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".eqattn-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise CommandError(
            f"cannot write to output directory {str(path)!r}: {e.strerror}"
        ) from None
    return path


def save_checkpoint(path: Path, model: eqx.Module, config: dict[str, Any], **extra) -> None:
    """Write `model` and its `config` to `path` atomically (a partial file never replaces a good one)."""
    from .. import __version__

    header = {"format": FORMAT, "eqattn": __version__, "config": config, **extra}
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write((json.dumps(header) + "\n").encode())
        eqx.tree_serialise_leaves(f, model)
    os.replace(tmp, path)


def read_header(path: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """The checkpoint file (a directory means its `checkpoint.eqx`) and its header."""
    path = Path(path)
    if path.is_dir():
        path = path / FILENAME
    if not path.is_file():
        raise CommandError(f"checkpoint not found: {str(path)!r}")
    try:
        with open(path, "rb") as f:
            header = json.loads(f.readline().decode())
    except (UnicodeDecodeError, json.JSONDecodeError, OSError):
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CommandError(f"{str(path)!r} is not an eqattn checkpoint (no {FORMAT} header)")
    return path, header


def load_checkpoint(path: str | os.PathLike, like: eqx.Module) -> eqx.Module:
    """Read the leaves after the header into a model shaped like `like`."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            f.readline()
            model = eqx.tree_deserialise_leaves(f, like)
            if f.read(1):
                raise ValueError("trailing bytes")
    except Exception as e:  # equinox/numpy raise various errors on truncated or foreign data
        raise CommandError(
            f"checkpoint {str(path)!r} is corrupt or does not match its configuration "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no detail'})"
        ) from None
    return model
