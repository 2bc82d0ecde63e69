"""Mazes: a perfect maze of k x k cells with a start and a goal in, the cells of the path
between them out (Schwarzschild et al. 2021; Bansal et al. 2022), read as a graph by the
library's generic graph transformer ([`nn.GraphReasoner`][eqattn.nn.GraphReasoner]). Trained on
mazes of at most 9 x 9 cells, a DEQ answers larger ones by iterating longer. Mazes are drawn on
the fly (randomised depth-first search, fixed seeds, no download).

```python
import jax, numpy as np
from eqattn import mazes

model = mazes.deq(32, 4, key=jax.random.key(0))
model, losses = mazes.fit(model, steps=2000)  # mazes of 5, 7 and 9 cells a side
test = mazes.draw_mazes(np.random.default_rng(1), 16, 21)
print(mazes.score(model, test, budget=mazes.budget_for(21)))
```
"""

from ._config import MazesConfig as MazesConfig
from ._data import (
    EDGE_KINDS as EDGE_KINDS,
    Mazes as Mazes,
    draw_mazes as draw_mazes,
    draw_passages as draw_passages,
    maze_graph as maze_graph,
    path_between as path_between,
)
from ._model import (
    SHAPE as SHAPE,
    budget_for as budget_for,
    deq as deq,
    explicit as explicit,
    reach as reach,
)
from ._task import (
    MazesTask as MazesTask,
    load_model as load_model,
    longer_size as longer_size,
)
from ._training import (
    fit as fit,
    loss as loss,
    mixed_loss as mixed_loss,
    path_independence as path_independence,
    score as score,
    score_steps as score_steps,
)

__all__ = [
    "EDGE_KINDS",
    "SHAPE",
    "Mazes",
    "MazesConfig",
    "MazesTask",
    "budget_for",
    "deq",
    "draw_mazes",
    "draw_passages",
    "explicit",
    "fit",
    "load_model",
    "longer_size",
    "loss",
    "maze_graph",
    "mixed_loss",
    "path_between",
    "path_independence",
    "reach",
    "score",
    "score_steps",
]
