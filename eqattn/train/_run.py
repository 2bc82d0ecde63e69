"""A training run's directory: an exclusive lock, durable atomic writes, and never replacing a
run by accident."""

from __future__ import annotations

import datetime
import errno
import fcntl
import os
import sys
from pathlib import Path

from .._errors import ConfigError, RunError
from ._files import TEMP_PREFIX, fsync_dir, writable_dir

LOCK = ".eqattn.lock"
RUN_FILES = ("checkpoint.eqx", "metrics.json", "best.eqx")


class RunDirectory:
    """`with RunDirectory(out, overwrite=..., resume=...) as run:` holds an exclusive lock on the
    directory (a second `eqattn train` into it exits at once, naming the holder's PID; the lock
    file is gone when the run ends), removes temp files a killed run left behind, and refuses a
    directory that holds a run unless `resume` (continue it) or `overwrite` (move it aside into
    `replaced-<time>/`)."""

    def __init__(
        self,
        out: str | os.PathLike,
        *,
        overwrite: bool = False,
        resume: bool = False,
        writer: bool = True,
    ):
        if overwrite and resume:
            raise ConfigError("`overwrite` and `resume` exclude each other")
        self.path = Path(out)
        self.overwrite, self.resume, self.writer = overwrite, resume, writer
        self.moved_to: Path | None = None
        self._fd: int | None = None

    def __enter__(self) -> RunDirectory:
        if not self.writer:
            # Another process of the same run writes (and locks, and moves aside): this one only
            # refuses what the writer refuses, so that both stop instead of one waiting for the
            # other in a collective.
            self._refuse()
            return self
        # What this run adds (the directory, its lock file) is removed again if it is refused or
        # stops before writing anything: a refusal leaves the file system as it found it.
        missing = [p for p in (self.path, *self.path.parents) if not p.exists()]
        self._made = (missing, not (self.path / LOCK).exists())
        writable_dir(self.path)
        fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise RunError(
                    f"{str(self.path)!r} is in use by another eqattn train (PID {holder})"
                ) from None
            raise
        self._fd = fd
        try:
            self._prepare()
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return self

    def _refuse(self) -> list[str]:
        """The run files present; raises if this run may not start on them."""
        present = [name for name in RUN_FILES if (self.path / name).exists()]
        if self.resume:
            if "checkpoint.eqx" not in present:
                raise RunError(f"nothing to resume: no checkpoint in {str(self.path)!r}")
        elif present and not self.overwrite:
            raise RunError(
                f"{str(self.path)!r} holds a run ({', '.join(present)}): `resume` continues it, "
                "`overwrite` moves it aside, or choose another `out`"
            )
        return present

    def _prepare(self) -> None:
        present = self._refuse()
        for stale in self.path.glob(TEMP_PREFIX + "*"):  # left by a killed run
            stale.unlink(missing_ok=True)
        if self.resume or not present:
            return
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S%fZ")
        target = self.path / f"replaced-{stamp}"
        target.mkdir()
        for name in present:
            os.replace(self.path / name, target / name)
        fsync_dir(self.path)
        self.moved_to = target

    def __exit__(self, *exc) -> None:
        if self._fd is None:
            return
        untouched = self.moved_to is None and not any(
            (self.path / name).exists() for name in RUN_FILES
        )
        # The lock file goes while it is still held: a process that opens the name afterwards
        # makes a new file (and takes its lock); one that opened it before found it held.
        (self.path / LOCK).unlink(missing_ok=True)
        if exc[0] is not None and untouched:  # nothing written: leave no trace
            made_dirs, _ = self._made
            for folder in made_dirs:  # this one first, then the parents made for it
                if any(folder.iterdir()):
                    break
                folder.rmdir()
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None
