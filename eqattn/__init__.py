"""eqattn: equilibrium attention in JAX."""

import importlib.metadata

from ._attention import (
    attention as attention,
    log_normalizer as log_normalizer,
    merge_heads as merge_heads,
    split_heads as split_heads,
)
from ._core import attention_with_lse as attention_with_lse

__version__ = importlib.metadata.version("eqattn")
