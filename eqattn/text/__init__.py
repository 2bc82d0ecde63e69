r"""Byte-level text for causal language models: a corpus of documents split by file, training
batches of windows, evaluation windows that score every byte exactly once, and generation from
a trained model with its cache (see the guide "Language modelling on text").

A model reads bytes (256 symbols) after a start-of-document symbol, `START = 256`: a document
$b_0 \dots b_{N-1}$ becomes the inputs $(\mathrm{START}, b_0, \dots, b_{N-2})$ and the targets
$(b_0, \dots, b_{N-1})$, so every byte, the first one included, is predicted from what precedes
it in its own document. Bits per byte are $-\frac{1}{N}\sum_t \log_2 p(b_t \mid b_{<t})$.

The default corpus is the Python standard library's source of the interpreter running eqattn
(`.py` files under `sysconfig.get_paths()["stdlib"]`, without `test/`, `tests/`, `idlelib/` and
`site-packages/`): text nobody here wrote, present wherever eqattn runs, with no download.
"""

from ._corpus import (
    BYTES as BYTES,
    HOLDOUT as HOLDOUT,
    PIECE as PIECE,
    START as START,
    Corpus as Corpus,
    load_corpus as load_corpus,
    split_documents as split_documents,
    stdlib_files as stdlib_files,
)
from ._generate import Generated as Generated, encode as encode, generate as generate
from ._windows import (
    Windows as Windows,
    evaluation_windows as evaluation_windows,
    training_batch as training_batch,
)

__all__ = [
    "BYTES",
    "START",
    "HOLDOUT",
    "PIECE",
    "Corpus",
    "Windows",
    "Generated",
    "stdlib_files",
    "split_documents",
    "load_corpus",
    "training_batch",
    "evaluation_windows",
    "encode",
    "generate",
]


def __getattr__(name: str):
    if name == "load_model":  # kept for one release
        import warnings

        warnings.warn(
            "`eqattn.text.load_model(path)` is deprecated: `eqattn.train.load_model(path).model` "
            "gives the model (with its configuration and header beside it); the old name will "
            "be removed in the next release.",
            DeprecationWarning,
            stacklevel=2,
        )
        return _load_language_model
    raise AttributeError(f"module 'eqattn.text' has no attribute {name!r}")


def _load_language_model(checkpoint, max_steps=None):
    """The deprecated `load_model`'s contract: the model of a text checkpoint."""
    from ..train import RunError, load_model  # the deprecated alias alone reaches up

    model, config, _ = load_model(checkpoint, max_steps)
    if config.task != "text":
        raise RunError(f"{str(checkpoint)!r} holds a {config.task} model, not a text model")
    return model
