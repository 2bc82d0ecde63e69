r"""The handwritten digits that ship with scikit-learn (1797 images of 8 x 8 pixels, values 0-16),
as token sequences for the models of `eqattn.nn`.

`load_digits()` returns a fixed, stratified train/test split with pixels scaled to [0, 1];
`tokenize(images, "rows" | "patches")` turns `[N, 8, 8]` images into `[N, tokens, features]`.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import numpy as np

Tokenization = Literal["rows", "patches"]


class Digits(NamedTuple):
    """Images `[N, 8, 8]` in [0, 1] (float32) and labels `[N]` (int32), train and test.

    **Example:**

    ```python
    from eqattn import digits

    assert digits.Digits._fields == ("train_images", "train_labels", "test_images", "test_labels")
    ```
    """

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray


def load_digits(test_fraction: float = 0.2, seed: int = 0) -> Digits:
    """The scikit-learn digits, split per class (stratified) with a fixed `seed`, so every call
    returns the same split. Needs scikit-learn (no download: the data ships with it).

    **Example:**

    ```python
    from eqattn import digits

    data = digits.load_digits()
    assert data.train_images.shape == (1438, 8, 8) and len(data.test_labels) == 359
    ```
    """
    if not 0 < test_fraction < 1:
        raise ValueError(f"`test_fraction` must be in (0, 1); got {test_fraction}.")
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError:
        raise ImportError(
            "eqattn.digits needs scikit-learn for the digits data: pip install scikit-learn"
        ) from None
    data = sklearn_digits()
    images = (data.images / 16.0).astype(np.float32)
    labels = data.target.astype(np.int32)
    rng = np.random.default_rng(seed)
    test = np.zeros(len(labels), bool)
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        test[idx[: int(round(test_fraction * len(idx)))]] = True
    return Digits(images[~test], labels[~test], images[test], labels[test])


def tokenize(images: np.ndarray, how: Tokenization = "rows", patch: int = 2) -> np.ndarray:
    """`[N, H, W]` images -> tokens: `"rows"` gives `[N, H, W]` (one token per row); `"patches"`
    gives `[N, (H / patch) (W / patch), patch^2]` (non-overlapping square patches, row-major).

    **Example:**

    ```python
    import numpy as np
    from eqattn import digits

    images = np.zeros((2, 8, 8), np.float32)
    assert digits.tokenize(images, "patches").shape == (2, 16, 4)  # 16 patches of 2 x 2
    ```
    """
    images = np.asarray(images)
    if images.ndim != 3:
        raise ValueError(f"`images` must have shape [N, H, W]; got shape {images.shape}.")
    if how == "rows":
        return images
    if how != "patches":
        raise ValueError(f"`how` must be 'rows' or 'patches'; got {how!r}.")
    n, h, w = images.shape
    if patch < 1 or h % patch or w % patch:
        raise ValueError(f"`patch` must divide the image size {h}x{w}; got {patch}.")
    x = images.reshape(n, h // patch, patch, w // patch, patch).transpose(0, 1, 3, 2, 4)
    return x.reshape(n, (h // patch) * (w // patch), patch * patch)
