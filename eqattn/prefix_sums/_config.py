"""The prefix-sums task's settings, every default given here once."""

from __future__ import annotations

import dataclasses

from ..train import Config, ConfigError, at_least, setting


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrefixSumsConfig(Config):
    """A prefix-sums run: the DEQ ([`PrefixSumsModel.deq`][eqattn.prefix_sums.PrefixSumsModel.deq],
    `dim` channels, `heads` heads, solved by `solver` to `rtol` within `max_steps`) or its
    explicit twin of `depth` untied steps with the DEQ's parameters
    ([`matched`][eqattn.prefix_sums.PrefixSumsModel.matched]; a `width` and `mlp_ratio` given
    instead set its shape), trained on `batch_size` fresh strings of each of `lengths` bits per
    optimizer step ([`mixed_loss`][eqattn.prefix_sums.mixed_loss]: the DEQ from a random partial
    solve, then `n + train_steps` steps with gradient), `epoch_steps` steps an epoch, and
    scored on `test_strings` strings of each of `test_lengths` bits (the DEQ's budget
    `4 n + 100` steps).

    The DEQ's training unrolls its step (it never calls the solver nor the adjoint: `solver`,
    `rtol` and `max_steps` are its evaluation's, `adjoint` how a user's gradient of the solved
    model is taken).

    **Example:**

    ```python
    from eqattn import prefix_sums

    config = prefix_sums.PrefixSumsConfig()
    assert config.dim == 32 and config.depth == 36  # the twin runs as deep as training: 32 + 4
    assert prefix_sums.PrefixSumsConfig(lengths=(4, 8)).depth == 12
    ```
    """

    dim: int = 32
    depth: int | None = setting(  # type: ignore[assignment]  # None: resolved below
        None, "explicit: untied steps (None: the longest training length + `train_steps`)"
    )
    solver: str = "picard"
    adjoint: str = "jacobian-free"
    rtol: float = 1e-4
    max_steps: int = 4096
    train_steps: int = setting(  # the base's field, this task's meaning
        4, "DEQ: steps with gradient beyond a string's length (after a partial solve without)"
    )
    epochs: int = 4
    batch_size: int = setting(8, "strings of each training length per optimizer step")
    lr: float = 1e-3
    weight_decay: float = 1e-4

    heads: int = setting(
        4, "attention heads (the DEQ's; the twin's: the most that divide its width)"
    )
    lengths: tuple[int, ...] = setting((8, 16, 24, 32), "the training strings' lengths (bits)")
    epoch_steps: int = setting(500, "optimizer steps per epoch (each ends with validation)")
    test_lengths: tuple[int, ...] = setting(
        (32, 64, 128, 256, 512), "`eqattn evaluate`: the test strings' lengths (bits)"
    )
    test_strings: int = setting(64, "test strings of each length (and validation strings)")

    def __post_init__(self):
        if self.depth is None and self.lengths:
            object.__setattr__(self, "depth", max(self.lengths) + self.train_steps)
        super().__post_init__()
        at_least(self, ("heads", "epoch_steps", "test_strings", "train_steps"), 1)
        if self.dim % self.heads:
            raise ConfigError(f"`dim` ({self.dim}) must be divisible by `heads` ({self.heads})")
        for name in ("lengths", "test_lengths"):
            values = getattr(self, name)
            if not values or min(values) < 1:
                raise ConfigError(f"`{name}` must be string lengths >= 1; got {list(values)}")

    @property
    def step_limits(self) -> tuple[str, ...]:
        """`max_steps` only: `train_steps` counts the steps with gradient beyond a string's
        length here (>= 1), not a solver's limit."""
        return ("max_steps",)
