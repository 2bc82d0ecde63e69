"""Prefix sums: a bit string in, its running parity out (Schwarzschild et al. 2021), read as a
chain graph by the library's generic graph transformer. Trained on strings of at most 32 bits,
a DEQ answers longer strings by iterating longer; its explicit twin sees only as far as it is
deep. Data is drawn on the fly (fixed seeds, no download).

```python
import jax, numpy as np
from eqattn import prefix_sums

model = prefix_sums.PrefixSumsModel.deq(32, 4, key=jax.random.key(0))
model, losses = prefix_sums.fit(model, steps=2000)  # strings of 8, 16, 24 and 32 bits
bits = prefix_sums.draw_bits(np.random.default_rng(1), 64, 512)
print(prefix_sums.score(model, bits, prefix_sums.prefix_parity(bits), budget=4 * 512 + 100))
```
"""

from ._config import PrefixSumsConfig as PrefixSumsConfig
from ._data import (
    EDGE_KINDS as EDGE_KINDS,
    chain as chain,
    draw_batch as draw_batch,
    draw_bits as draw_bits,
    prefix_parity as prefix_parity,
)
from ._model import PrefixSumsModel as PrefixSumsModel
from ._task import (
    LONGER as LONGER,
    PrefixSumsTask as PrefixSumsTask,
    budget_for as budget_for,
    evaluate_lengths as evaluate_lengths,
    load_model as load_model,
)
from ._training import (
    EXTRA_STEPS as EXTRA_STEPS,
    fit as fit,
    loss as loss,
    loss_and_stats as loss_and_stats,
    make_step as make_step,
    mixed_loss as mixed_loss,
    path_independence as path_independence,
    score as score,
    score_steps as score_steps,
)

__all__ = [
    "EDGE_KINDS",
    "EXTRA_STEPS",
    "LONGER",
    "PrefixSumsConfig",
    "PrefixSumsModel",
    "PrefixSumsTask",
    "budget_for",
    "chain",
    "draw_batch",
    "draw_bits",
    "evaluate_lengths",
    "fit",
    "load_model",
    "loss",
    "loss_and_stats",
    "make_step",
    "mixed_loss",
    "path_independence",
    "prefix_parity",
    "score",
    "score_steps",
]
