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

The task (`eqattn train --task text`): `TextConfig`, `TextTask`, `load_model`. Scoring a model
(`bits_per_byte` jointly, `cached_bits_per_byte` through the equilibrium cache,
`reported_bits_per_byte` as the task reports it, `corpus_of` a checkpoint) is the task's
interface for the benchmarks, outside `__all__`.
"""

from ..train import ConfigError as ConfigError, RunError as RunError
from ._config import TextConfig as TextConfig
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
from ._scores import (
    bits_per_byte as bits_per_byte,
    cached_bits_per_byte as cached_bits_per_byte,
    reported_bits_per_byte as reported_bits_per_byte,
)
from ._task import TextTask as TextTask, corpus_of as corpus_of, load_model as load_model
from ._windows import (
    Windows as Windows,
    evaluation_windows as evaluation_windows,
    training_batch as training_batch,
)

__all__ = [
    "BYTES",
    "HOLDOUT",
    "PIECE",
    "START",
    "ConfigError",
    "Corpus",
    "Generated",
    "RunError",
    "TextConfig",
    "TextTask",
    "Windows",
    "encode",
    "evaluation_windows",
    "generate",
    "load_corpus",
    "load_model",
    "split_documents",
    "stdlib_files",
    "training_batch",
]
