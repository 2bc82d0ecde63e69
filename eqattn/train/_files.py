"""Files written so that they survive a crash: atomic, durable writes (and the failpoints the
fault tests stop a process at)."""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

from .._errors import RunError

TEMP_PREFIX = ".eqattn-tmp-"
"""The prefix of a write's temporary file (a killed run may leave one behind)."""

_HITS: dict[str, int] = {}
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def failpoint(name: str) -> None:
    """Testing only: die by SIGKILL at the k-th time this point is reached when
    `EQATTN_FAILPOINT` is `name@k` (or `name` for the first), so the fault tests can stop a real
    run exactly where they mean to (mid-epoch, mid-write)."""
    wanted = os.environ.get("EQATTN_FAILPOINT")
    if not wanted:
        return
    target, _, count = wanted.partition("@")
    if target == name:
        _HITS[name] = _HITS.get(name, 0) + 1
        if _HITS[name] == int(count or 1):
            os.kill(os.getpid(), signal.SIGKILL)


def writable_dir(path: str | os.PathLike) -> Path:
    """`path` as a directory that exists and can be written (made if needed), or a RunError."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".eqattn-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise RunError(f"cannot write to output directory {str(path)!r}: {e.strerror}") from None
    return path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that `path` holds either its old bytes or all of the new ones,
    also after a crash or power loss: a temp file in the same directory, fsynced, renamed over
    `path`, then the directory fsynced. The temp file never survives a normal return or error."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX + path.name + ".", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # as a plain open() would create it, not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            half = len(data) // 2
            f.write(data[:half])
            f.flush()
            failpoint(f"write:{path.name}")
            f.write(data[half:])
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
