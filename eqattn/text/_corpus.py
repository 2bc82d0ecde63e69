"""The corpus: documents read from files and split by file, deterministically."""

from __future__ import annotations

import hashlib
import platform
import sysconfig
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

BYTES = 256
"""The number of symbols a model predicts: the byte values."""
START = 256
"""The input symbol in front of every document (inputs take `BYTES + 1` symbols)."""
HOLDOUT = 0.05
"""The share of the corpus's bytes in each of the validation and test splits."""
PIECE = 16384
"""Bytes per piece (at most) when a corpus has too few files to split by file."""
_SKIPPED_FOLDERS = frozenset({"test", "tests", "idlelib", "site-packages"})


class Corpus(NamedTuple):
    """Documents (`uint8` arrays, one per file or piece) of the three splits, and `info`: the
    source, file counts, bytes per split and a SHA-256 of the whole (recorded in metrics).

    **Example:**

    ```python
    from eqattn import text

    corpus = text.load_corpus()  # the Python standard library's source
    assert corpus.info["bytes"]["train"] == sum(len(d) for d in corpus.train)
    ```
    """

    train: tuple[np.ndarray, ...]
    validation: tuple[np.ndarray, ...]
    test: tuple[np.ndarray, ...]
    info: dict


def stdlib_files() -> list[Path]:
    """The default corpus's files: the standard library's `.py` sources (see the module).

    **Example:**

    ```python
    from eqattn import text

    files = text.stdlib_files()
    assert files and all(f.suffix == ".py" and "tests" not in f.parts for f in files)
    ```
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(
        path
        for path in root.rglob("*.py")
        if not _SKIPPED_FOLDERS.intersection(path.relative_to(root).parts[:-1])
    )


def _expand(paths: Iterable[str | Path]) -> list[tuple[Path, Path]]:
    """`(file, its root)` for each file named or found under a folder named (sorted)."""
    found = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            found += [(f, path) for f in sorted(path.rglob("*")) if f.is_file()]
        elif path.is_file():
            found.append((path, path.parent))
        else:
            raise FileNotFoundError(f"`text`: no such file or folder: {str(given)!r}")
    return found


def _read(files: Sequence[tuple[Path, Path]]) -> tuple[list[tuple[str, bytes]], dict]:
    """`(relative name, bytes)` of each readable text file, and the counts of those skipped
    (binary: a NUL byte in the first 8 KiB, as git decides; unreadable; empty)."""
    documents, skipped = [], {"binary": 0, "unreadable": 0, "empty": 0}
    for path, root in files:
        try:
            data = path.read_bytes()
        except OSError:
            skipped["unreadable"] += 1
            continue
        if not data:
            skipped["empty"] += 1
        elif b"\0" in data[:8192]:
            skipped["binary"] += 1
        else:
            documents.append((path.relative_to(root).as_posix(), data))
    return documents, skipped


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'s' * (n != 1)}"


def _rank(name: str) -> bytes:
    return hashlib.sha256(name.encode()).digest()


def split_documents(
    documents: Sequence[tuple[str, bytes]], holdout: float = HOLDOUT
) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """`(train, validation, test)` of named documents, deterministically: in the order of a
    hash of their names, each document goes to the test split if it fits under `holdout` of
    all the bytes, else to validation if it fits there, else to training. (A document larger
    than the share goes to training, so the held-out splits stay near `holdout` each, not
    lumpy.) With too few documents to fill both held-out splits, the documents are cut into
    pieces of `PIECE` bytes first (fewer where the held-out share is smaller).

    **Example:**

    ```python
    from eqattn import text

    docs = [(f"file{i}", bytes(100)) for i in range(100)]
    train, validation, test = text.split_documents(docs)
    assert (len(train), len(validation), len(test)) == (90, 5, 5)
    ```
    """
    total = sum(len(d) for _, d in documents)
    target = holdout * total
    splits: tuple[list, list, list] = ([], [], [])
    sizes = [0, 0]
    for name, data in sorted(documents, key=lambda nd: _rank(nd[0])):
        for i in (0, 1):  # test, then validation
            if sizes[i] + len(data) <= target:
                sizes[i] += len(data)
                splits[2 - i].append(data)
                break
        else:
            splits[0].append(data)
    piece = min(PIECE, int(target / 2))  # a held-out split holds at least two pieces
    longest = max((len(d) for _, d in documents), default=0)
    if not (splits[1] and splits[2]) and piece > 0 and longest > piece:
        pieces = [
            (f"{name}#{i}", data[i : i + piece])
            for name, data in documents
            for i in range(0, len(data), piece)
        ]
        return split_documents(pieces, holdout)
    return splits


def load_corpus(paths: Sequence[str | Path] | None = None, holdout: float = HOLDOUT) -> Corpus:
    """The corpus of `paths` (files, or folders read recursively), or the default corpus with
    `paths=None`, split by `split_documents`.

    **Example:**

    ```python
    import tempfile, pathlib
    from eqattn import text

    folder = pathlib.Path(tempfile.mkdtemp())
    for i in range(40):
        (folder / f"{i}.txt").write_text(f"document {i}\\n" * 50)
    corpus = text.load_corpus([folder])
    sizes = corpus.info["bytes"]
    assert corpus.info["files"] == 40 and sum(sizes.values()) == sum(
        len(f.read_bytes()) for f in folder.iterdir()
    )
    assert 0 < sizes["test"] <= 0.05 * sum(sizes.values())
    ```
    """
    if not 0 < holdout < 0.5:
        raise ValueError(f"`holdout` must be in (0, 0.5); got {holdout}.")
    default = paths is None
    if paths is None:
        root = Path(sysconfig.get_paths()["stdlib"])
        files = [(f, root) for f in stdlib_files()]
    else:
        files = _expand(paths)
    documents, skipped = _read(files)
    if not documents:
        counts = ", ".join(f"{n} {why}" for why, n in skipped.items() if n) or "none"
        raise ValueError(
            f"the corpus has no text: {_count(len(files), 'file')}, skipped: {counts}."
        )
    train, validation, test = split_documents(documents, holdout)
    if not (train and validation and test):
        raise ValueError(
            f"the corpus is too small to split into training, validation and test "
            f"({_count(sum(len(d) for _, d in documents), 'byte')} in "
            f"{_count(len(documents), 'file')})."
        )
    digest = hashlib.sha256()
    for name, data in sorted(documents):
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    info = {
        "source": f"python {platform.python_version()} standard library" if default else "paths",
        "files": len(documents),
        "skipped": skipped,
        "documents": {"train": len(train), "validation": len(validation), "test": len(test)},
        "bytes": {
            "train": sum(map(len, train)),
            "validation": sum(map(len, validation)),
            "test": sum(map(len, test)),
        },
        "sha256": digest.hexdigest(),
    }
    as_arrays = lambda docs: tuple(np.frombuffer(d, np.uint8) for d in docs)  # noqa: E731
    return Corpus(as_arrays(train), as_arrays(validation), as_arrays(test), info)
