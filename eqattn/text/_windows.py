"""Windows of documents: random ones for training, and ones that score every byte once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ._corpus import START


class Windows(NamedTuple):
    """`inputs [W, L]` (symbols, `START` included), `targets [W, L]` (bytes) and `weights
    [W, L]` (1 where a target is scored, 0 on padding or on bytes scored by another window),
    all int32 / float32.

    **Example:**

    ```python
    import numpy as np
    from eqattn import text

    w = text.evaluation_windows([np.frombuffer(b"abc", np.uint8)], context=4)
    assert w.inputs.tolist() == [[text.START, 97, 98, 0]] and w.weights.sum() == 3
    ```
    """

    inputs: np.ndarray
    targets: np.ndarray
    weights: np.ndarray


def _window(document, start: int, context: int, scored_from: int) -> tuple:
    """The window of `context` positions from `start`: inputs are the previous symbols
    (`START` before the document's first byte), targets the bytes; only this window's slice of
    the document is read (documents can be large)."""
    stop = min(start + context, len(document))
    length = stop - start
    x = np.zeros(context, np.int32)
    y = np.zeros(context, np.int32)
    w = np.zeros(context, np.float32)
    x[0] = START if start == 0 else document[start - 1]
    x[1:length] = document[start : stop - 1]
    y[:length] = document[start:stop]
    w[max(0, scored_from - start) : length] = 1
    return x, y, w


def training_batch(
    documents: Sequence[np.ndarray], rng: np.random.Generator, batch: int, context: int
) -> Windows:
    """`batch` windows of `context` positions, each from one document (no context across
    documents), uniform over the positions of all the documents; a document shorter than the
    context gives one padded window (weights 0 on the padding).

    **Example:**

    ```python
    import numpy as np
    from eqattn import text

    doc = np.frombuffer(b"equilibrium attention", np.uint8)
    w = text.training_batch([doc], np.random.default_rng(0), batch=4, context=8)
    assert w.inputs.shape == (4, 8) and (w.inputs[:, 1:] == w.targets[:, :-1]).all()
    ```
    """
    lengths = np.array([len(d) for d in documents])
    starts = np.maximum(lengths - context, 0) + 1  # window starts per document
    chosen = rng.choice(len(documents), size=batch, p=starts / starts.sum())
    rows = []
    for i in chosen:
        start = int(rng.integers(starts[i]))
        rows.append(_window(documents[i], start, context, start))
    return Windows(*(np.stack(column) for column in zip(*rows)))


def evaluation_windows(
    documents: Sequence[np.ndarray], context: int, stride: int | None = None
) -> Windows:
    """Windows that score every byte of every document exactly once: per document, windows of
    `context` positions start every `stride` (default `context // 2`) positions, the last one
    ending at the document's end, and each window scores only the bytes no earlier window
    scored, so every scored byte past a document's first window has at least `context -
    stride` bytes of history (the first window's bytes have all of theirs).

    **Example:**

    ```python
    import numpy as np
    from eqattn import text

    doc = np.frombuffer(b"hello, equilibrium world", np.uint8)
    w = text.evaluation_windows([doc], context=8, stride=4)
    assert w.weights.sum() == len(doc)  # every byte once
    scored = w.targets[w.weights > 0]
    assert bytes(scored.astype(np.uint8)) == bytes(doc)
    ```
    """
    stride = context // 2 if stride is None else stride
    if context < 2:
        raise ValueError(f"`context` must be >= 2; got {context}.")
    if not 1 <= stride <= context:
        raise ValueError(f"`stride` must be in [1, context={context}]; got {stride}.")
    rows = []
    for document in documents:
        n = len(document)
        starts = list(range(0, max(n - context, 0) + 1, stride))
        if starts[-1] + context < n:
            starts.append(n - context)
        scored = 0
        for start in starts:
            rows.append(_window(document, start, context, scored))
            scored = min(start + context, n)
    if not rows:
        raise ValueError("no documents to evaluate.")
    return Windows(*(np.stack(column) for column in zip(*rows)))
