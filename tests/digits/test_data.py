import numpy as np
import pytest

pytest.importorskip("sklearn")

from eqattn.digits import load_digits, tokenize  # noqa: E402

from ..checks import unchecked


def test_digits_split_is_fixed_stratified_and_scaled():
    a, b = load_digits(), load_digits()
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert a.train_images.shape[1:] == (8, 8) and a.train_images.dtype == np.float32
    assert len(a.train_labels) + len(a.test_labels) == 1797
    assert 0 <= a.train_images.min() and a.train_images.max() <= 1
    train_counts = np.bincount(a.train_labels, minlength=10)
    test_counts = np.bincount(a.test_labels, minlength=10)
    np.testing.assert_allclose(test_counts / (train_counts + test_counts), 0.2, atol=0.01)
    assert not np.array_equal(load_digits(seed=1).test_labels, a.test_labels)


def test_tokenize():
    images = np.arange(2 * 8 * 8, dtype=np.float32).reshape(2, 8, 8)
    assert tokenize(images, "rows").shape == (2, 8, 8)
    patches = tokenize(images, "patches", patch=2)
    assert patches.shape == (2, 16, 4)
    np.testing.assert_array_equal(patches[0, 1], [2, 3, 10, 11])  # second patch of the first row
    with unchecked(), pytest.raises(ValueError, match="`how` must be 'rows' or 'patches'"):
        tokenize(images, "columns")
    with unchecked(), pytest.raises(ValueError, match="`patch` must divide"):
        tokenize(images, "patches", patch=3)
    with unchecked(), pytest.raises(ValueError, match=r"shape \[N, H, W\]"):
        tokenize(images[0])
    with unchecked(), pytest.raises(ValueError, match="`test_fraction`"):
        load_digits(test_fraction=1.5)
