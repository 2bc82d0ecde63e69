"""The graph task's settings, every default given here once."""

from __future__ import annotations

import dataclasses

from ..train import Config, ConfigError, at_least, setting
from ._families import FAMILIES


@dataclasses.dataclass(frozen=True, kw_only=True)
class GraphConfig(Config):
    """A graph run: reachability and a BFS parent for every node, learned on graphs of
    `graph_sizes` nodes from `families` (None: all of `FAMILIES`), drawn afresh for every one
    of the `epoch_steps` optimizer steps of an epoch.

    **Example:**

    ```python
    from eqattn import graphs

    config = graphs.GraphConfig(graph_sizes=(8, 12), families=("path", "tree"))
    assert config.families == ("path", "tree") and config.training_budget == 40
    ```
    """

    # Measured in the graphs guide: the propagation block of width 16 solved by Picard
    # iteration (a step moves what a node knows one edge) with the Jacobian-free gradient, 40
    # solver steps while training (2 x 16 + 8: the rule for the largest training graphs).
    dim: int = 16
    # The explicit model: 16 untied blocks, as many as the training graphs' longest distance
    # (15) needs, so that it can solve its training distribution (at 4 it reaches 4 hops: 69%
    # in distribution); its width is then 7 for equal parameters.
    depth: int = 16
    solver: str = "picard"
    adjoint: str = "jacobian-free"
    rtol: float = 1e-4
    max_steps: int = 4096
    train_steps: int = 40
    epochs: int = 5
    batch_size: int = 32
    lr: float = 1e-2
    weight_decay: float = 0.0

    graph_sizes: tuple[int, int] = setting((8, 16), "the training graphs' sizes: LOW HIGH nodes")
    families: tuple[str, ...] | None = setting(
        None, "the training graphs' families (None: all)", choices=FAMILIES
    )
    epoch_steps: int = setting(200, "optimizer steps per epoch (each ends with validation)")

    def __post_init__(self):
        super().__post_init__()
        at_least(self, ("epoch_steps",), 1)
        low, high = self.graph_sizes
        if not 2 <= low <= high:
            raise ConfigError(
                f"`graph_sizes` must be two sizes 2 <= low <= high; got {low}, {high}"
            )
