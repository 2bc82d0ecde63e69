"""hopfield-layers' options of [`eqattn.nn.Hopfield`][], in one place."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class HopfieldOptions:
    r"""The options of [`eqattn.nn.Hopfield`][] that give parity with the PyTorch
    hopfield-layers package (H. Ramsauer et al.); the defaults are the core layer.

    - `value_dim`: width of the projected values (default `hidden_dim`).
    - `normalize_state`, `normalize_stored`: layer norm (with affine) on the raw patterns;
      `normalize_projected`: renormalize the projected patterns per head.
    - `output_projection`: apply $W_o$ (else the heads' outputs are concatenated).
    - `use_bias`: biases on the four projections (hopfield-layers' `input_bias`).
    - `association_activation`: a function applied to the output (hopfield-layers' option of
      this name, e.g. `jax.nn.relu`); after the solve, so the energy view is unchanged.
    - `update_steps`: `None` (default) solves to the equilibrium; an int $k \ge 0$ instead
      applies $k$ plain updates $\xi \leftarrow K^\top\mathrm{softmax}(\beta K\xi)$ from
      $\xi_0$ (no injection) and differentiates through them, as hopfield-layers'
      `update_steps_max` does; a head stops early once its association
      $\mathrm{softmax}(\beta K\xi)$ changes by at most `update_steps_eps` (Frobenius norm over
      `[n, m]`; hopfield-layers takes the maximum over its batch, here each example decides).
      The solver and adjoint are then unused and `throw` does not apply: `steps` counts the
      updates, `converged` says whether every head stopped by `update_steps_eps`.
    - `add_zero_association`: append a stored pattern whose projected key and value are zero
      (a logit of 0 that every query can attend to); `concat_bias_pattern`: append a learned
      projected key and value (initialized N(0, 0.02^2)). Both take part in the solve and
      the output like the stored patterns (bias first), as hopfield-layers' options of these
      names intend (its `concat_bias_pattern` leaves its outputs unchanged: its core never
      appends the patterns).
    - `static_state`, `static_stored`, `static_values`: use the (normalized) raw state / stored
      / value patterns in every head instead of projecting them (hopfield-layers'
      `state_pattern_as_static`, `stored_pattern_as_static`, `pattern_projection_as_static`;
      their width must equal the per-head width, and the projection goes unused);
      `connected_values`: pass the value input through the key projection first (then through
      the value projection, which then reads `hidden_dim` features, unless `static_values`;
      hopfield-layers' `pattern_projection_as_connected`).

    **Example:**

    ```python
    import jax, eqattn

    # hopfield-layers' default retrieval: 3 plain updates, no layer norms on the raw patterns
    options = eqattn.nn.HopfieldOptions(update_steps=3, normalize_state=False, normalize_stored=False)
    layer = eqattn.nn.Hopfield(16, 16, 2, key=jax.random.key(0), options=options)
    x = jax.random.normal(jax.random.key(1), (5, 16))
    out, eq = layer.forward(x, x)
    assert out.shape == (5, 16) and 1 <= int(eq.steps) <= 3
    ```
    """

    value_dim: int | None = None
    normalize_state: bool = True
    normalize_stored: bool = True
    normalize_projected: bool = True
    output_projection: bool = True
    use_bias: bool = False
    association_activation: Callable | None = None
    update_steps: int | None = None
    update_steps_eps: float = 1e-4
    add_zero_association: bool = False
    concat_bias_pattern: bool = False
    static_state: bool = False
    static_stored: bool = False
    static_values: bool = False
    connected_values: bool = False

    def __post_init__(self):
        steps = self.update_steps
        if steps is not None and (
            isinstance(steps, bool) or not isinstance(steps, int) or steps < 0
        ):
            raise ValueError(f"`update_steps` must be None or an int >= 0; got {steps!r}.")
        if not self.update_steps_eps >= 0:
            raise ValueError(f"`update_steps_eps` must be >= 0; got {self.update_steps_eps}.")


_OPTIONS = frozenset(f.name for f in dataclasses.fields(HopfieldOptions))


def options_of(options: HopfieldOptions | None, compat: dict) -> HopfieldOptions:
    """`options` with the hopfield-layers options given as keywords (the compatibility path)."""
    unknown = set(compat) - _OPTIONS
    if unknown:
        raise TypeError(f"Hopfield got unexpected keyword arguments {sorted(unknown)}.")
    if options is not None and not isinstance(options, HopfieldOptions):
        raise TypeError(f"`options` must be an eqattn.nn.HopfieldOptions; got {options!r}.")
    return dataclasses.replace(options or HopfieldOptions(), **compat)
