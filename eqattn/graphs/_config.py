"""The graph task's settings, every default given here once."""

from __future__ import annotations

import dataclasses

from ..train import Config, ConfigError, at_least, setting
from ._weighted import ALGORITHMS, WEIGHTED_FAMILIES

DIM = 22
"""The DEQ's width: 22 channels, 11 of them bottleneck channels (100 parameters, as the
explicit twin's 16 steps of 2 channels); for `mst`, the weight map's units of a DEQ of 16
records (67 parameters; its twin's 16 steps of one unit, 64)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class GraphConfig(Config):
    """A graph run: a parent for every node by `algorithm` (`bfs`: reachability and a BFS
    parent; `shortest-paths`: a parent on a shortest path; `mst`: the parent in the minimum
    spanning tree rooted at the source), learned on graphs of `graph_sizes` nodes from
    `families` (None: all of `FAMILIES` for `bfs`, which reads every weight as 1, of
    `WEIGHTED_FAMILIES` for the others), drawn afresh for every one of the `epoch_steps`
    optimizer steps of an epoch.

    **Example:**

    ```python
    from eqattn import graphs

    config = graphs.GraphConfig(graph_sizes=(8, 12), families=("path", "tree"))
    assert config.families == ("path", "tree") and config.training_budget == 40
    ```
    """

    # Measured in the graphs guide and the findings page: `nn.ImplicitGraphAttention` of
    # width `DIM` solved by Picard iteration (a step moves what a node knows one edge) with the
    # Jacobian-free gradient, 40 solver steps while training (2 x 16 + 8: the rule for the
    # largest training graphs). The explicit model: 16 untied steps, as many as the training
    # graphs' longest distance (15) needs, so that it can solve its training distribution; its
    # width is then 2 for equal parameters (100 each).
    dim: int = setting(
        DIM, "the DEQ's width (state channels, half of them bottlenecks; mst: weight-map units)"
    )
    depth: int = 16
    solver: str = "picard"
    adjoint: str = "jacobian-free"
    rtol: float | None = setting(  # type: ignore[assignment]  # None: resolved below
        None, "DEQ: the solver's tolerance (relative residual; None: 1e-4, for mst 1e-7)"
    )
    max_steps: int = 4096
    train_steps: int = 40
    epochs: int = 5
    batch_size: int = 32
    lr: float = 1e-2
    weight_decay: float = 0.0

    algorithm: str = setting("bfs", "the algorithm learned", choices=ALGORITHMS)
    graph_sizes: tuple[int, int] = setting((8, 16), "the training graphs' sizes: LOW HIGH nodes")
    families: tuple[str, ...] | None = setting(
        None, "the training graphs' families (None: all)", choices=WEIGHTED_FAMILIES
    )
    epoch_steps: int = setting(200, "optimizer steps per epoch (each ends with validation)")

    def __post_init__(self):
        if self.rtol is None:  # records move as a front whose change can be small against the
            # whole state: at 1e-4 a 4096-node cycle's solve stopped with 22% of the parents wrong
            object.__setattr__(self, "rtol", 1e-7 if self.algorithm == "mst" else 1e-4)
        super().__post_init__()
        at_least(self, ("epoch_steps",), 1)
        low, high = self.graph_sizes
        if not 2 <= low <= high:
            raise ConfigError(
                f"`graph_sizes` must be two sizes 2 <= low <= high; got {low}, {high}"
            )
