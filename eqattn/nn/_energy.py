r"""Energy-descent attention (after B. Hoover et al., "Energy Transformer", 2023).

Tokens $z$ (one example, `[n, dim]`) are layer-normalized, $g = \mathrm{RN}(z)$, and scored by

$$E(z) = -\sum_h \frac{1}{\beta_h}\sum_i \log\sum_{j} e^{\beta_h (W^h_q g_i)\cdot(W^h_k g_j)}
         \;-\; \frac{1}{\beta_m}\sum_i \log\sum_\mu e^{\beta_m\, \xi_\mu\cdot g_i}
         \;+\; \frac{\lambda}{2}\lVert z - x\rVert^2 ,$$

an attention energy (the log-normalizer of every token over the others), a modern Hopfield
memory with learned patterns $\xi_\mu$, and a proximal input-injection term. The layer's update is a
gradient-descent step $z \leftarrow z - \eta\nabla E(z)$, so along the solve the energy does not
increase (for a small enough step $\eta$), and the output is a stationary point of $E$.
"""

from __future__ import annotations

import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from .._attention import log_normalizer
from .._renorm import renormalize
from .._solve import AbstractAdjoint, Equilibrium, Picard, Solver
from ._checks import check_dims, check_mask, check_tokens
from ._layer import AbstractEquilibriumLayer


class EnergyAttention(AbstractEquilibriumLayer):
    """Attention as descent on an explicit energy (see the module docstring).

    **Arguments:** `dim`, `num_heads`, `key`; `num_memories` (Hopfield memory patterns; 0 for
    none); `step_size` $\\eta$; `injection` $\\lambda > 0$; `solver` (default plain iteration of
    the descent step, `Picard(rtol=1e-4, max_steps=200)`), `adjoint`, `throw`; `norm_eps`, the
    layer norm's $\\epsilon$ inside the energy (default 1: a soft layer norm, so a token with nearly
    constant features cannot turn $g$ at no cost, which would make $E$ ill-conditioned).

    **Example:**

    ```python
    import equinox as eqx, jax, eqattn

    layer = eqattn.nn.EnergyAttention(16, 2, key=jax.random.key(0), num_memories=8)
    x = jax.random.normal(jax.random.key(1), (10, 16))
    z, eq = eqx.filter_jit(layer.forward)(x)  # a stationary point of the layer's energy
    assert z.shape == (10, 16) and eq.converged
    ```
    """

    query_weight: Float[Array, "heads hd dim"]
    key_weight: Float[Array, "heads hd dim"]
    log_beta: Float[Array, " heads"]
    memories: Float[Array, "mem dim"] | None
    log_beta_memory: Float[Array, ""]
    step_size: float = eqx.field(static=True)
    norm_eps: float = eqx.field(static=True)
    injection: float = eqx.field(static=True)
    solver: Any
    adjoint: AbstractAdjoint
    throw: bool = eqx.field(static=True)
    dim: int = eqx.field(static=True)

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        key: PRNGKeyArray,
        num_memories: int = 16,
        step_size: float = 0.5,
        norm_eps: float = 1.0,
        injection: float = 1.0,
        solver: Solver | None = None,
        adjoint: AbstractAdjoint | None = None,
        throw: bool = False,
        dtype=None,
    ):
        head_dim = check_dims(dim, num_heads)
        if step_size <= 0 or injection <= 0:
            raise ValueError(
                f"`step_size` and `injection` must be > 0; got {step_size}, {injection}."
            )
        dtype = dtype or jnp.result_type(float)
        kq, kk, km = jax.random.split(key, 3)
        scale = 1 / math.sqrt(dim)
        self.query_weight = scale * jax.random.normal(kq, (num_heads, head_dim, dim), dtype)
        self.key_weight = scale * jax.random.normal(kk, (num_heads, head_dim, dim), dtype)
        self.log_beta = jnp.full((num_heads,), -0.5 * math.log(head_dim), dtype)
        self.memories = (
            scale * jax.random.normal(km, (num_memories, dim), dtype) if num_memories else None
        )
        self.log_beta_memory = jnp.asarray(-0.5 * math.log(dim), dtype)
        self.step_size = step_size
        self.norm_eps = norm_eps
        self.injection = injection
        default = Picard(rtol=1e-4, max_steps=200)
        self.solver, self.adjoint = self.solving(solver, adjoint, default, dtype)
        self.throw = throw
        self.dim = dim

    def energy(
        self, z: Float[Array, "n dim"], x: Float[Array, "n dim"], mask=None
    ) -> Float[Array, ""]:
        """$E(z)$ for the input `x` (see the module docstring)."""
        g = renormalize(z, eps=self.norm_eps)
        q = jnp.einsum("hkd,nd->hnk", self.query_weight, g)
        k = jnp.einsum("hkd,nd->hnk", self.key_weight, g)
        beta = jnp.exp(self.log_beta)
        lse = log_normalizer(q, k, beta=beta, mask=mask)
        # A token that may attend to nothing contributes no attention energy.
        e = -jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0) / beta[:, None])
        if self.memories is not None:
            beta_m = jnp.exp(self.log_beta_memory)
            e = e - jnp.sum(log_normalizer(g, self.memories, beta=beta_m)) / beta_m
        return e + 0.5 * self.injection * jnp.sum((z - x) ** 2)

    def step(self, z, x, mask=None):
        """One descent step $z - \\eta\\nabla E(z)$."""
        return z - self.step_size * jax.grad(self.energy)(z, x, mask)

    def equilibrium(self, x, *, mask=None, z0=None, budget=None) -> Equilibrium:
        """Descend to a stationary point of $E$ from `z0` (default `x`)."""
        check_tokens(x, self.dim)
        mask = check_mask(mask, x.shape[0], x.shape[0])
        z0 = x if z0 is None else z0
        return self.solve(EnergyAttention.step, z0, x, mask, budget=budget)

    def forward(
        self, x, *, mask=None, z0=None, budget=None
    ) -> tuple[Float[Array, "n dim"], Equilibrium]:
        """The stationary point and its [`eqattn.Equilibrium`][] (the output is the solved state)."""
        eq = self.equilibrium(x, mask=mask, z0=z0, budget=budget)
        return eq.value, eq
