"""The graph task's settings, every default given here once."""

from __future__ import annotations

import dataclasses

from .._solve import named_solver
from ..train import Config, ConfigError, at_least, setting
from ._algorithms import ALGORITHMS, AbstractAlgorithm, algorithm_of
from ._weighted import WEIGHTED_FAMILIES


@dataclasses.dataclass(frozen=True, kw_only=True)
class GraphConfig(Config):
    """A graph run: a parent for every node by `algorithm` (`bfs`: reachability and a BFS
    parent; `shortest-paths`: a parent on a shortest path; `mst`: the parent in the minimum
    spanning tree rooted at the source; `ALGORITHMS`), learned on graphs of `graph_sizes` nodes
    from `families` (None: the algorithm's, all of `FAMILIES` for `bfs`, which reads every
    weight as 1, of `WEIGHTED_FAMILIES` for the others), drawn afresh for every one of the
    `epoch_steps` optimizer steps of an epoch. `dim` and `rtol` default to the algorithm's, and
    so does the explicit twin's `width` where the algorithm sets one (`bfs`: 22 channels, 11 of
    them bottlenecks, 100 parameters as the twin's 16 steps of 2; `shortest-paths`: one
    channel, the distance, 3 parameters, its twin's 16 steps of one channel 48; `mst`: 32
    records and a weight map of 22 units, 67 parameters, the twin's 16 steps of one unit, 64).

    **Example:**

    ```python
    from eqattn import graphs

    config = graphs.GraphConfig(graph_sizes=(8, 12), families=("path", "tree"))
    assert config.families == ("path", "tree") and config.training_budget == 40
    ```
    """

    # Measured in the graphs guide and the findings page: `nn.ImplicitGraphAttention` over the
    # algorithm's step, solved by Picard iteration (a step moves what a node knows one edge)
    # with the Jacobian-free gradient, 40 solver steps while training (2 x 16 + 8: the rule for
    # the largest training graphs). The explicit model: 16 untied steps, as many as the training
    # graphs' longest distance (15) needs, so that it can solve its training distribution, of
    # the width that gives it the DEQ's parameters.
    dim: int | None = setting(  # type: ignore[assignment]  # None: resolved below
        None, "the DEQ's width (state channels; mst: weight-map units; None: the algorithm's)"
    )
    depth: int = 16
    solver: str = "picard"
    adjoint: str = "jacobian-free"
    rtol: float | None = setting(  # type: ignore[assignment]  # None: resolved below
        None, "DEQ: the solver's tolerance (relative residual; None: the algorithm's)"
    )
    max_steps: int = 4096
    train_steps: int = 40
    epochs: int = 5
    batch_size: int = 32
    lr: float = 1e-2
    weight_decay: float = 0.0

    algorithm: str = setting("bfs", "the algorithm learned", choices=tuple(ALGORITHMS))
    graph_sizes: tuple[int, int] = setting((8, 16), "the training graphs' sizes: LOW HIGH nodes")
    families: tuple[str, ...] | None = setting(
        None, "the training graphs' families (None: all)", choices=WEIGHTED_FAMILIES
    )
    epoch_steps: int = setting(200, "optimizer steps per epoch (each ends with validation)")

    def __post_init__(self):
        algorithm = algorithm_of(self.algorithm)
        for name in ("dim", "rtol"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, getattr(algorithm, name))
        if self.model == "explicit" and self.width is None and self.default_width:
            object.__setattr__(self, "width", self.default_width)
        super().__post_init__()
        at_least(self, ("epoch_steps",), 1)
        low, high = self.graph_sizes
        if not 2 <= low <= high:
            raise ConfigError(
                f"`graph_sizes` must be two sizes 2 <= low <= high; got {low}, {high}"
            )

    def deq_solver(self):
        """The DEQ's forward solver, by name, with `rtol` and `max_steps`, testing every node's
        values against their own size (`elementwise`, no `atol`): a front still crossing the
        graph is small against the whole state."""
        return named_solver(
            self.solver, rtol=self.rtol, max_steps=self.max_steps, atol=0.0, elementwise=True
        )

    @property
    def default_width(self) -> int | None:
        """The explicit twin's width where none is given: the algorithm's (None: the width
        that gives it the DEQ's parameters)."""
        return self.learned.explicit_width

    @property
    def learned(self) -> AbstractAlgorithm:
        """The algorithm object of `algorithm` (`ALGORITHMS`)."""
        return algorithm_of(self.algorithm)

    @property
    def training_families(self) -> tuple[str, ...]:
        """`families`, or the algorithm's."""
        return tuple(self.families or self.learned.families)
