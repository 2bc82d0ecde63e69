"""The mazes task's settings, every default given here once."""

from __future__ import annotations

import dataclasses

from ..train import Config, ConfigError, at_least, non_negative, setting
from ._model import reach


@dataclasses.dataclass(frozen=True, kw_only=True)
class MazesConfig(Config):
    """A mazes run: the DEQ ([`mazes.deq`][eqattn.mazes.deq], `dim` channels, `heads` heads,
    solved by `solver` to `rtol` within `max_steps`) or its explicit twin of `depth` untied
    steps with the DEQ's parameters ([`nn.GraphReasoner.matched`][eqattn.nn.GraphReasoner.matched];
    a `width` and `mlp_ratio` given instead set its shape), trained on `batch_size` fresh mazes
    of each of `sizes` cells a side per optimizer step ([`mixed_loss`][eqattn.mazes.mixed_loss]:
    the DEQ from a random partial solve of at most `warm` times
    [`reach`][eqattn.mazes.reach] steps, then `reach` + `train_steps` steps with gradient, plus
    `penalty` times the relative residual), `epoch_steps` steps an epoch, and scored on `test_mazes` mazes of
    each of `test_sizes` (the DEQ's budget [`budget_for`][eqattn.mazes.budget_for]); `eqattn
    train` of both models sets them side by side at `compare_sizes` (59 x 59, the DEQ's longest
    solves by far, is left to `eqattn evaluate`).

    The DEQ's training unrolls its step (`solver`, `rtol` and `max_steps` are its
    evaluation's, `adjoint` how a user's gradient of the solved model is taken).

    **Example:**

    ```python
    from eqattn import mazes

    config = mazes.MazesConfig()
    assert config.sizes == (5, 7, 9) and config.depth == mazes.reach(9) == 44
    assert mazes.MazesConfig(sizes=(3, 4)).depth == 12
    ```
    """

    dim: int = 32
    depth: int | None = setting(  # type: ignore[assignment]  # None: resolved below
        None, "explicit: untied steps (None: `reach` of the largest size + `train_steps`)"
    )
    solver: str = "picard"
    adjoint: str = "jacobian-free"
    rtol: float = 1e-4
    max_steps: int = 16384
    train_steps: int = setting(  # the base's field, this task's meaning
        0, "DEQ: steps with gradient beyond `reach(k)` (after a partial solve without)"
    )
    warm: float = setting(1.0, "DEQ: the partial solve's most steps, in multiples of `reach(k)`")
    penalty: float = setting(1.0, "DEQ: the weight of the relative residual in the loss")
    epochs: int = 6
    batch_size: int = setting(8, "mazes of each training size per optimizer step")
    lr: float = 1e-3
    weight_decay: float = 1e-4

    heads: int = setting(
        4, "attention heads (the DEQ's; the twin's: the most that divide its width)"
    )
    sizes: tuple[int, ...] = setting((5, 7, 9), "the training mazes' sizes (cells a side)")
    epoch_steps: int = setting(250, "optimizer steps per epoch (each ends with validation)")
    test_sizes: tuple[int, ...] = setting(
        (9, 13, 21, 33, 59), "`eqattn evaluate`: the test mazes' sizes (cells a side)"
    )
    test_mazes: int = setting(16, "test mazes of each size (and validation mazes)")
    compare_sizes: tuple[int, ...] = setting(
        (9, 13, 21, 33),
        "`eqattn train` of both models: the sizes of the side by side it prints at the end",
    )

    def __post_init__(self):
        if self.depth is None and self.sizes:
            object.__setattr__(self, "depth", reach(max(self.sizes)) + self.train_steps)
        super().__post_init__()
        at_least(self, ("heads", "epoch_steps", "test_mazes"), 1)
        at_least(self, ("train_steps",), 0)
        non_negative(self, ("warm", "penalty"))
        if self.dim % self.heads:
            raise ConfigError(f"`dim` ({self.dim}) must be divisible by `heads` ({self.heads})")
        for name in ("sizes", "test_sizes", "compare_sizes"):
            values = getattr(self, name)
            if not values or min(values) < 2:
                raise ConfigError(f"`{name}` must be maze sizes >= 2; got {list(values)}")

    @property
    def step_limits(self) -> tuple[str, ...]:
        """`max_steps` only: `train_steps` counts the steps with gradient beyond `reach(k)`
        here (>= 0), not a solver's limit."""
        return ("max_steps",)
