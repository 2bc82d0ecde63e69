r"""`ImplicitAttention`: multi-head self-attention solved to equilibrium.

$$z^* = \mathrm{RN}\big(z^* + \mathrm{MHA}(z^*, z^*) + U x\big)$$

with RN a renormalization (layer norm without affine by default) and $Ux$ the input injection
(a linear map followed by a layer norm with learned affine: at initialization it has unit
variance, so RN divides by about $\sqrt2$ and the map contracts).
Forward by `eqattn.fixed_point`, backward by its adjoint (implicit differentiation by default).
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray

from .._attention import Implementation
from .._solve import AbstractAdjoint, Anderson, Equilibrium, Solver
from ..parallel import SequenceSplit
from ._checks import check_dims, check_mask, check_tokens
from ._layer import AbstractEquilibriumLayer
from ._multihead import MultiHeadAttention
from ._norm import Norm, apply_norm, check_norm
from ._tokens import per_token, shard_tokens


class ImplicitAttention(AbstractEquilibriumLayer):
    r"""Multi-head self-attention as an implicit layer,
    $z^* = \mathrm{RN}(z^* + \mathrm{MHA}(z^*) + Ux)$.

    **Arguments:**

    - `dim`: token width; `num_heads` must divide it.
    - `key`: a JAX PRNG key for the initialization.
    - `solver`, `adjoint`: as in [`eqattn.fixed_point`][] (default `Anderson(rtol=1e-4)` and
      `ImplicitAdjoint()`).
    - `norm`: `"layer"` (each token to zero mean, unit variance; default) or `"tokens"`
      (standardize the token cloud, [`eqattn.standardize_tokens`][]).
    - `beta`: initial inverse temperature of every head (default $1/\sqrt{d_h}$), learned per head.
    - `throw`: raise (inside `jit` too) when the solve does not converge.
    - `sequence`: an [`eqattn.parallel.SequenceSplit`][]: the tokens split over a mesh axis,
      attention by [`eqattn.parallel.ring_attention`][], the solve on the sharded state.
    - `implementation`: the attention kernel (`"auto"`, `"xla"`, `"chunked"`, `"pallas"`, `"cudnn"`;
      see [`eqattn.select_implementation`][]).

    Acts on one example `x [tokens, dim]` (use `jax.vmap` for a batch); `mask` is boolean,
    broadcasting to `[tokens, tokens]`, `True` where token i may attend to token j.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, eqattn

    layer = eqattn.nn.ImplicitAttention(16, 2, key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (6, 16))  # [tokens, dim]: one example
    z, eq = layer.forward(x)
    assert z.shape == (6, 16) and eq.converged
    # z is the fixed point of the layer's map: one more step leaves it (nearly) where it is
    assert jnp.linalg.norm(layer.step(z, layer.injection(x)) - z) <= 1e-3 * jnp.linalg.norm(z)
    ```
    """

    attention: MultiHeadAttention
    inject: eqx.nn.Linear
    inject_norm: eqx.nn.LayerNorm
    solver: Any
    adjoint: AbstractAdjoint
    norm: str = eqx.field(static=True)
    throw: bool = eqx.field(static=True)
    dim: int = eqx.field(static=True)

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        key: PRNGKeyArray,
        solver: Solver | None = None,
        adjoint: AbstractAdjoint | None = None,
        norm: Norm = "layer",
        beta: float | None = None,
        throw: bool = False,
        sequence: SequenceSplit | None = None,
        implementation: Implementation = "auto",
        dtype=None,
    ):
        check_dims(dim, num_heads)
        check_norm(norm)
        ka, ki = jax.random.split(key)
        self.attention = MultiHeadAttention(
            num_heads,
            dim,
            key=ka,
            beta=beta,
            sequence=sequence,
            implementation=implementation,
            dtype=dtype,
        )
        self.inject = eqx.nn.Linear(dim, dim, key=ki, dtype=dtype)
        # A unit-variance injection makes RN contract by about 1/sqrt(2) at initialization.
        self.inject_norm = eqx.nn.LayerNorm(dim, dtype=dtype)
        self.solver, self.adjoint = self.solving(solver, adjoint, Anderson(rtol=1e-4), dtype)
        self.norm = norm
        self.throw = throw
        self.dim = dim

    def injection(self, x: Float[Array, "n dim"]) -> Float[Array, "n dim"]:
        """The input injection $Ux$: a linear map then a layer norm (with learned affine)."""
        return jax.vmap(self.inject_norm)(per_token(self.inject, x))

    def step(self, z: Float[Array, "n dim"], injection: Float[Array, "n dim"], mask=None):
        """One application of the layer's map $z \\mapsto \\mathrm{RN}(z + \\mathrm{MHA}(z) + Ux)$."""
        z = apply_norm(self.norm, z + self.attention(z, z, mask=mask) + injection)
        return shard_tokens(self.attention.sequence, z)

    def equilibrium(
        self,
        x: Float[Array, "n dim"],
        *,
        mask: Bool[ArrayLike, "#queries #keys"] | None = None,
        z0: Float[Array, "n dim"] | None = None,
        budget: int | Int[ArrayLike, ""] | None = None,
    ) -> Equilibrium:
        """Solve for $z^*$; returns the [`eqattn.Equilibrium`][] (value and solver statistics).
        `z0` warm-starts the solve; `budget` caps it for this call."""
        check_tokens(x, self.dim)
        n = x.shape[0]
        mask = check_mask(mask, n, n)
        injection = shard_tokens(self.attention.sequence, self.injection(x))
        z0 = jnp.zeros_like(injection) if z0 is None else shard_tokens(self.attention.sequence, z0)
        return self.solve(ImplicitAttention.step, z0, injection, mask, budget=budget)

    def forward(
        self, x, *, mask=None, z0=None, budget=None
    ) -> tuple[Float[Array, "n dim"], Equilibrium]:
        """$z^*$ and its [`eqattn.Equilibrium`][] (the output is the solved state)."""
        eq = self.equilibrium(x, mask=mask, z0=z0, budget=budget)
        return eq.value, eq
