"""The text task's settings, every default given here once."""

from __future__ import annotations

import dataclasses

from ..train import TransformerConfig, at_least, setting


@dataclasses.dataclass(frozen=True, kw_only=True)
class TextConfig(TransformerConfig):
    """A text run: a causal byte-level language model (a DEQ transformer or its explicit twin)
    over windows of `context` bytes of a corpus (`text`: files or folders; None: the Python
    standard library's source), `epoch_steps` optimizer steps an epoch.

    **Example:**

    ```python
    from eqattn import text

    config = text.TextConfig(context=128, epochs=2)
    assert (config.epochs, config.batch_size, config.jacobian_weight) == (2, 16, 0.1)
    assert config.adjoint == "jacobian-free" and config.jacobian_share == 0.125
    ```
    """

    # Measured on a 2-core CPU, default corpus, context 256, seed 0; then `python -m benchmarks
    # text` over seeds 0-2: 500 steps of 16 windows end in about 3 minutes in all. The learning
    # rate: the explicit model's bits per byte were 3.28 at 3e-3, 3.01 at 1e-2, 2.96 at 2e-2,
    # and 4.67 (no learning past the byte frequencies) at 4e-2; 1e-2 keeps a factor of 4 from
    # that cliff. The DEQ's shape (the explicit model matches its parameters): one explicit
    # block before the DEQ block (`stem_depth` 1) at width 52 has the parameters of one block
    # at width 64; it reached 3.245, 3.192, 3.204 bits per byte against the single block's
    # 3.315, 3.325, 3.332. The findings page has the trials.
    dim: int = 52
    heads: int = 4
    depth: int = 4
    stem_depth: int = 1
    dropout: float = 0.0
    # Picard's solves diverged mid-run at learning rates >= 6e-3; Anderson's converged. The
    # implicit backward left 36% of the test solves unconverged at 1e-2; the Jacobian-free one
    # converged them all. The Jacobian penalty probes an eighth of each batch's windows (the
    # same bits per byte as all of them, at an eighth of its cost); its weight trades bits per
    # byte against solver steps. The attention reads the block's input too (`attend_input`):
    # 3.127 against 3.245 reading the state alone (seeds 0-2 alike).
    solver: str = "anderson"
    adjoint: str = "jacobian-free"
    rtol: float = 1e-2
    max_steps: int = 30
    train_steps: int = 10
    jacobian_weight: float = 0.1
    jacobian_share: float = 0.125
    attend_input: bool = True
    epochs: int = 5
    batch_size: int = 16
    lr: float = 1e-2
    weight_decay: float = 0.05

    context: int = setting(256, "positions per window (the model's context, in bytes)")
    text: tuple[str, ...] | None = setting(
        None,
        "the corpus's files or folders (None: the Python standard library's source of this "
        "interpreter)",
    )
    epoch_steps: int = setting(100, "optimizer steps per epoch (each ends with validation)")

    def __post_init__(self):
        super().__post_init__()
        at_least(self, ("context",), 2)
        at_least(self, ("epoch_steps",), 1)
