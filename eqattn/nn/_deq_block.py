r"""A weight-tied DEQ transformer block, solved to its fixed point.

Post-norm (default): $u = \mathrm{RN}(z + \mathrm{MHA}(z) + Ux)$, $z' = \mathrm{RN}(u + \mathrm{MLP}(u))$.
Pre-norm (`norm_first=True`): $u = z + \mathrm{MHA}(\mathrm{RN}(z)) + Ux$,
$z' = \mathrm{RN}(u + \mathrm{MLP}(\mathrm{RN}(u)))$ (the last RN keeps the map bounded).
With `attend_input=True` the attention reads the state and the injection,
$\mathrm{MHA}(z + Ux)$ (pre-norm: $\mathrm{MHA}(\mathrm{RN}(z) + Ux)$): its queries, keys and
values see the block's input at every iteration (the DEQ-Transformer of Bai et al. adds its
injection to the query, key and value projections alone; here it enters them through the
attention's input and stays in the residual).
With `depth` $L > 1$ the map is a cell: $z'$ then goes through $L - 1$ untied blocks
$B_2, \dots, B_L$ of [`eqattn.nn.TransformerBlock`][] (no injection), $f = B_L \circ \dots \circ
B_2 \circ B_1$ (a multi-layer cell, as in S. Bai, V. Koltun, J. Z. Kolter, "Multiscale Deep
Equilibrium Models", 2020). The block's output is the fixed point $z^* = f(z^*)$ (S. Bai,
J. Z. Kolter, V. Koltun, "Deep Equilibrium Models", 2019).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray

from .._attention import Implementation
from .._solve import (
    AbstractAdjoint,
    Anderson,
    Equilibrium,
    Phantom,
    Solver,
    jacobian_frobenius,
)
from ..parallel import SequenceSplit
from ._block import AbstractBlock, DropoutMasks
from ._checks import check_dims, check_dropout, check_mask, check_tokens
from ._layer import AbstractEquilibriumLayer
from ._multihead import BlockCache, KeyValues, MultiHeadAttention
from ._norm import Norm, check_norm
from ._tokens import per_token, shard_tokens
from ._transformer import TransformerBlock, stack


class DEQBlock(AbstractBlock, AbstractEquilibriumLayer):
    """Weight-tied transformer block (attention + MLP, input injection) solved to equilibrium.

    **Arguments:** `dim`, `num_heads`, `key`; `mlp_ratio` (hidden width of the MLP / dim);
    `norm_first` (pre-norm instead of post-norm); `norm` (`"layer"` or `"tokens"`); `dropout`
    (variational: one mask per solve, the same at every iteration); `inference` (dropout off;
    `eqx.nn.inference_mode(model)` sets it, and a call's `inference=True/False` overrides it, as
    for `eqx.nn.Dropout`); `solver`, `adjoint`, `throw` as in [`eqattn.fixed_point`][];
    `sequence`, an [`eqattn.parallel.SequenceSplit`][]: the tokens split over a mesh axis (ring
    attention, the solve on the sharded state); `implementation`, the attention kernel (see
    [`eqattn.select_implementation`][]); `causal`: token $i$ attends to tokens $\\le i$ only,
    so its fixed point depends on them alone (a language model's block; `norm="layer"` only);
    `depth`, the blocks of the map's cell (see the module docstring; `cell` holds the
    second to the last, the block's own attention and MLP are the first); `attend_input`: the
    attention reads $z + Ux$ instead of $z$ (see the module docstring).

    **Example:**

    ```python
    import equinox as eqx, jax, jax.numpy as jnp, eqattn

    block = eqattn.nn.DEQBlock(16, 2, key=jax.random.key(0), mlp_ratio=2.0)
    x = jax.random.normal(jax.random.key(1), (3, 10, 16))  # [batch, tokens, dim]


    @eqx.filter_jit
    def solve(block, x):
        return jax.vmap(block.forward)(x)  # each example solved and stopped on its own


    z, eq = solve(block, x)
    assert z.shape == x.shape and eq.steps.shape == (3,) and bool(jnp.all(eq.converged))
    ```
    """

    attention: MultiHeadAttention
    inject: eqx.nn.Linear
    inject_norm: eqx.nn.LayerNorm
    mlp_in: eqx.nn.Linear
    mlp_out: eqx.nn.Linear
    solver: Any
    adjoint: AbstractAdjoint
    dropout: float = eqx.field(static=True)
    inference: bool
    norm_first: bool = eqx.field(static=True)
    norm: str = eqx.field(static=True)
    throw: bool = eqx.field(static=True)
    dim: int = eqx.field(static=True)
    attend_input: bool = eqx.field(static=True)
    # the map's further blocks, after the first's sublayers (as the map applies them)
    cell: tuple[TransformerBlock, ...] = ()

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        key: PRNGKeyArray,
        mlp_ratio: float = 2.0,
        norm_first: bool = False,
        norm: Norm = "layer",
        dropout: float = 0.0,
        solver: Solver | None = None,
        adjoint: AbstractAdjoint | None = None,
        throw: bool = False,
        inference: bool = False,
        sequence: SequenceSplit | None = None,
        implementation: Implementation = "auto",
        causal: bool = False,
        depth: int = 1,
        attend_input: bool = False,
        dtype=None,
    ):
        check_dims(dim, num_heads)
        check_norm(norm, causal)
        check_dropout(dropout)
        _check_depth(depth, sequence)
        hidden = max(1, int(round(mlp_ratio * dim)))
        ka, ki, k1, k2 = jax.random.split(key, 4)
        self.attention = MultiHeadAttention(
            num_heads,
            dim,
            key=ka,
            sequence=sequence,
            implementation=implementation,
            causal=causal,
            dtype=dtype,
        )
        self.inject = eqx.nn.Linear(dim, dim, key=ki, dtype=dtype)
        # A unit-variance injection makes RN contract by about 1/sqrt(2) at initialization.
        self.inject_norm = eqx.nn.LayerNorm(dim, dtype=dtype)
        self.mlp_in = eqx.nn.Linear(dim, hidden, key=k1, dtype=dtype)
        self.mlp_out = eqx.nn.Linear(hidden, dim, key=k2, dtype=dtype)
        default = Anderson(rtol=1e-3, max_steps=30)
        self.solver, self.adjoint = self.solving(solver, adjoint, default, dtype)
        self.dropout = dropout
        self.inference = inference
        self.norm_first = norm_first
        self.norm = norm
        self.throw = throw
        self.dim = dim
        self.attend_input = bool(attend_input)
        self.cell = stack(
            jax.random.split(jax.random.fold_in(key, 1), depth - 1),
            dim,
            num_heads,
            mlp_ratio=mlp_ratio,
            norm_first=norm_first,
            norm=norm,
            dropout=dropout,
            inference=inference,
            causal=causal,
            implementation=implementation,
            dtype=dtype,
        )

    @property
    def depth(self) -> int:
        """The blocks of the map's cell."""
        return 1 + len(self.cell)

    def injection(self, x: Float[Array, "n dim"]) -> Float[Array, "n dim"]:
        """The input injection $Ux$: a linear map then a layer norm (with learned affine)."""
        return jax.vmap(self.inject_norm)(per_token(self.inject, x))

    def _layers(self, z, injection, mask, drop, prefix):
        """The cell's blocks in turn: the inputs of each and the last one's output."""
        drop = (None,) * self.depth if drop is None else drop
        prefix = (None,) * self.depth if prefix is None else _per_block(prefix, self.depth)
        inputs = [z]
        attend = injection if self.attend_input else None
        out = self.sublayers(z, injection, mask, drop[0], prefix[0], attend=attend)
        for block, d, p in zip(self.cell, drop[1:], prefix[1:]):
            inputs.append(out)
            out = block.sublayers(out, mask=mask, drop=d, prefix=p)
        return inputs, out

    def step(self, z, injection, mask=None, drop=None, prefix=None):
        """One application of the block's map (see the module docstring); `prefix`, the
        `cache` (the block's method) of earlier tokens' fixed points."""
        out = self._layers(z, injection, mask, drop, prefix)[1]
        return shard_tokens(self.attention.sequence, out)

    def cache(
        self,
        x: Float[Array, "n dim"],
        z: Float[Array, "n dim"],
        *,
        mask: Bool[ArrayLike, "#queries #keys"] | None = None,
        prefix: KeyValues | BlockCache | tuple[KeyValues | BlockCache, ...] | None = None,
    ) -> tuple[KeyValues, ...]:
        """The keys and values, one `KeyValues` per block of the cell, that later tokens attend
        to: those of each block's input when the map is applied at the fixed points `z` of the
        tokens `x` (`mask` and `prefix` as in [`equilibrium`][eqattn.nn.DEQBlock.equilibrium]).
        With `depth` 1 it is `(key_values(z),)` (`key_values(z, Ux)` with `attend_input`); a
        deeper cell's later blocks see states that depend on the earlier tokens too, hence `x`,
        `mask` and `prefix`."""
        if not self.cell:
            check_tokens(x, self.dim)
            return (self.key_values(z, self.injection(x) if self.attend_input else None),)
        injection, mask, drop = self._prepare(x, mask, None, True, prefix)
        inputs = self._layers(z, injection, mask, drop, prefix)[0]
        first = self.key_values(z, injection if self.attend_input else None)
        return (first, *(b.key_values(u) for b, u in zip(self.cell, inputs[1:])))

    def _prepare(self, x, mask, key, inference, prefix=None):
        """The solve's arguments: the injection, the mask and the dropout masks (one pair per
        block of the cell, or None)."""
        check_tokens(x, self.dim)
        n = x.shape[0]
        past = 0 if prefix is None else _per_block(prefix, self.depth)[0].positions
        mask = check_mask(mask, n, n + past)
        injection = shard_tokens(self.attention.sequence, self.injection(x))
        return injection, mask, self._dropout(key, inference, n, injection.dtype)

    def _dropout(self, key, inference, n, dtype) -> tuple[DropoutMasks | None, ...] | None:
        first = self.dropout_masks(key, inference, n, dtype)
        if first is None or not self.cell:
            return None if first is None else (first,)
        keys = jax.random.split(jax.random.fold_in(key, 1), len(self.cell))
        return (first, *(b.dropout_masks(k, inference, n, dtype) for b, k in zip(self.cell, keys)))

    def equilibrium(
        self,
        x: Float[Array, "n dim"],
        *,
        mask: Bool[ArrayLike, "#queries #keys"] | None = None,
        key: PRNGKeyArray | None = None,
        inference: bool | None = None,
        z0: Float[Array, "n dim"] | None = None,
        budget: int | Int[ArrayLike, ""] | None = None,
        prefix: KeyValues | BlockCache | tuple[KeyValues | BlockCache, ...] | None = None,
    ) -> Equilibrium:
        """Solve for $z^*$. Dropout (when `dropout > 0`, `key` given and not `inference`) draws
        its masks once here and keeps them for every iteration of this solve.

        `prefix`, the [`cache`][eqattn.nn.DEQBlock.cache] of `p` earlier tokens' fixed points
        (for `depth` 1 also their `key_values`), solves only the rows of `x`, attending to those
        tokens as well (then `mask` is `[n, p + n]`). In a causal block a token's fixed point
        depends only on the tokens up to it, so solving new tokens against the cache of the
        earlier ones gives the joint solve's fixed point (to the solver's tolerance) at the cost
        of their rows: cached generation."""
        injection, mask, drop = self._prepare(x, mask, key, inference, prefix)
        z0 = jnp.zeros_like(injection) if z0 is None else z0
        return self.solve(DEQBlock.step, z0, injection, mask, drop, prefix, budget=budget)

    def trajectory(
        self,
        x: Float[Array, "n dim"],
        segments: Sequence[int],
        *,
        mask: Bool[ArrayLike, "#queries #keys"] | None = None,
        key: PRNGKeyArray | None = None,
        inference: bool | None = None,
        z0: Float[Array, "n dim"] | None = None,
        phantom_steps: int = 1,
        damping: float = 1.0,
    ) -> list[Equilibrium]:
        r"""The solve in pieces, for fixed-point correction (S. Bai, Z. Geng, Y. Savani,
        J. Z. Kolter, "Deep Equilibrium Optical Flow Estimation", 2022): piece $i$ takes at most
        `segments[i]` steps of the block's solver from where piece $i-1$ stopped (its first
        step re-evaluates $f$ there), and its end point $z_i$ is differentiated by a phantom
        gradient ([`eqattn.Phantom`][] with `phantom_steps` and `damping`) instead of the
        block's adjoint. A training loss on every $z_i$ (decaying weights, the last largest)
        asks the map to be accurate early in the solve, at the price of one phantom backward per
        piece (on the digits it cost accuracy: `python -m benchmarks training`). Returns one `Equilibrium` per
        piece; `steps` counts that piece's evaluations. The same dropout masks throughout."""
        segments = tuple(int(k) for k in segments)
        if not segments or min(segments) < 2:
            raise ValueError(
                f"`segments` must be a non-empty sequence of ints >= 2 (a piece of one "
                f"evaluation ends where it starts); got {segments}."
            )
        injection, mask, drop = self._prepare(x, mask, key, inference)
        block = eqx.tree_at(
            lambda b: b.adjoint, self, Phantom(steps=phantom_steps, damping=damping)
        )
        z = jnp.zeros_like(injection) if z0 is None else z0
        pieces = []
        for k in segments:
            eq = block.solve(DEQBlock.step, lax.stop_gradient(z), injection, mask, drop, budget=k)
            pieces.append(eq)
            z = eq.value
        return pieces

    def forward(
        self, x, *, mask=None, key=None, inference=None, z0=None, budget=None
    ) -> tuple[Float[Array, "n dim"], Equilibrium]:
        """$z^*$ and its [`eqattn.Equilibrium`][] (the output is the solved state)."""
        eq = self.equilibrium(x, mask=mask, key=key, inference=inference, z0=z0, budget=budget)
        return eq.value, eq

    def jacobian_penalty(
        self,
        x: Float[Array, "n dim"],
        z: Float[Array, "n dim"],
        *,
        probe_key: PRNGKeyArray,
        mask: Bool[ArrayLike, "#queries #keys"] | None = None,
        key: PRNGKeyArray | None = None,
        inference: bool | None = None,
        samples: int = 1,
    ) -> Float[Array, ""]:
        r"""$\lVert \partial f/\partial z\rVert_F^2 / (n \cdot \mathrm{dim})$ at `z` (a Hutchinson
        estimate from `samples` probes drawn with `probe_key`) for the map that
        [`equilibrium`][eqattn.nn.DEQBlock.equilibrium] solves with the same `x`, `mask`, `key`
        and `inference` (hence the same dropout masks). Added to a training loss (times a small
        weight) it keeps the fixed point well conditioned, so the solver needs fewer steps
        (S. Bai, V. Koltun, J. Z. Kolter, "Stabilizing Equilibrium Models by Jacobian
        Regularization", 2021). Differentiable with respect to the block's parameters."""
        injection, mask, drop = self._prepare(x, mask, key, inference)
        penalty = jacobian_frobenius(
            lambda z, block: block.step(z, injection, mask, drop),
            lax.stop_gradient(z),
            self,
            key=probe_key,
            samples=samples,
        )
        return penalty / z.size


def _check_depth(depth, sequence) -> None:
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"`depth` (blocks of the cell) must be an int >= 1; got {depth!r}.")
    if depth > 1 and sequence is not None:
        raise ValueError("`depth` > 1 does not combine with `sequence` (ring attention).")


def _per_block(prefix, depth: int) -> tuple[KeyValues | BlockCache, ...]:
    """`prefix` as one `KeyValues` or `BlockCache` per block of the cell (a bare one: depth
    1)."""
    prefix = (prefix,) if isinstance(prefix, (KeyValues, BlockCache)) else tuple(prefix)
    if len(prefix) != depth:
        raise ValueError(
            f"`prefix` must hold one KeyValues per block of the cell ({depth}); got {len(prefix)}."
        )
    return prefix
