r"""Modern Hopfield layers solved to equilibrium (H. Ramsauer et al., "Hopfield Networks is All
You Need", arXiv:2008.02217, 2020), in the three roles of the widely used PyTorch layers.

In each head, projected state patterns $\xi_0 = W_q s$ and stored patterns $K = W_k y$ define the
energy with a proximal input-injection term

$$E(\xi) = E_\beta(\xi; K) + \tfrac{\alpha}{2}\lVert\xi - \xi_0\rVert^2 ,$$

$E_\beta$ the modern Hopfield energy ([`eqattn.hopfield_energy`][]). Its concave-convex step is
$\xi \leftarrow (K^\top\mathrm{softmax}(\beta K\xi) + \alpha\,\xi_0)/(1 + \alpha)$, which never
increases $E$; the layer solves it to the fixed point $\xi^*$ (instead of a fixed number of
updates) and differentiates implicitly. The injection $\alpha > 0$ keeps $\partial\xi^*/\partial\xi_0$
away from zero at retrieval fixed points; $\alpha \to 0$ recovers pure retrieval. The output is
$W_o\,[V^\top\mathrm{softmax}(\beta K\xi^*)]_h$ with $V = W_v y$.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float, PRNGKeyArray

from .._attention import Implementation, attention, attention_weights, merge_heads, split_heads
from .._hopfield import hopfield_energy
from .._renorm import renormalize
from .._solve import (
    RESULTS,
    AbstractAdjoint,
    Equilibrium,
    Picard,
    Solver,
    status,
)
from ._checks import check_dims, check_dropout, check_mask, check_tokens
from ._hopfield_options import HopfieldOptions, options_of
from ._layer import AbstractEquilibriumLayer
from ._multihead import MultiHeadAttention
from ._tokens import per_token


class Hopfield(AbstractEquilibriumLayer):
    """State patterns associate with stored patterns through query/key/value projections, solved
    to equilibrium.

    **Arguments:**

    - `state_dim`, `stored_dim`: widths of the state (query) and stored (key) patterns.
    - `num_heads`, `key`.
    - `hidden_dim`: width of the association space (default `state_dim`), split over heads.
    - `out_dim`: width of the output (default `state_dim`).
    - `beta`: initial inverse temperature of every head (learned per head; default
      $1/\\sqrt{d_h}$).
    - `injection`: $\\alpha > 0$ above.
    - `dropout`: dropout on the output's association weights $\\mathrm{softmax}(\\beta K\\xi^*)$
      (as hopfield-layers' `dropout`; the solve itself is not dropped); `inference` turns it
      off, and `eqx.nn.inference_mode(model)` sets it (a call's `inference=` overrides it).
    - `implementation`: the attention kernel (see [`eqattn.select_implementation`][]).
    - `solver`, `adjoint`, `throw`: as in [`eqattn.fixed_point`][]. The default solver is plain
      iteration of the update, `Picard(rtol=1e-4, max_steps=500)` (rtol raised to what the
      matmul precision can resolve): the concave-convex update never increases the energy, so it
      stays in the basin it starts in and reaches the fixed point that repeated updates reach,
      where an accelerated solver (Anderson's extrapolation) can jump to another one.
    - `options`: a [`eqattn.nn.HopfieldOptions`][], hopfield-layers' options (normalizations,
      biases, fixed update steps, static or connected patterns, extra stored patterns). For
      compatibility, its fields may also be passed as keywords (`update_steps=3`).

    `layer(state [n, state_dim], stored [m, stored_dim], *, association_mask=None,
    padding_mask=None, key=None, inference=None) -> [n, out_dim]`; `association_mask`
    broadcasts to `[n, m]` and `padding_mask [m]` marks real stored patterns (True); `key` draws
    the dropout mask.

    **Example:**

    ```python
    import equinox as eqx, jax, eqattn

    layer = eqattn.nn.Hopfield(16, 8, 2, key=jax.random.key(0))  # state 16 wide, stored 8 wide
    state = jax.random.normal(jax.random.key(1), (5, 16))
    stored = jax.random.normal(jax.random.key(2), (12, 8))
    out, eq = eqx.filter_jit(layer.forward)(state, stored)
    assert out.shape == (5, 16) and eq.converged and not eq.stats["energy_rose"]
    ```
    """

    attention: MultiHeadAttention
    state_norm: eqx.nn.LayerNorm | None
    stored_norm: eqx.nn.LayerNorm | None
    normalize_projected: bool = eqx.field(static=True)
    injection: float = eqx.field(static=True)
    solver: Any
    adjoint: AbstractAdjoint
    throw: bool = eqx.field(static=True)
    state_dim: int = eqx.field(static=True)
    stored_dim: int = eqx.field(static=True)
    update_steps: int | None = eqx.field(static=True)
    update_steps_eps: float = eqx.field(static=True)
    dropout: float = eqx.field(static=True)
    inference: bool
    association_activation: Callable | None
    bias_key: Float[Array, " hidden"] | None
    bias_value: Float[Array, " value"] | None
    zero_association: bool = eqx.field(static=True)
    static_state: bool = eqx.field(static=True)
    static_stored: bool = eqx.field(static=True)
    static_values: bool = eqx.field(static=True)
    connected_values: bool = eqx.field(static=True)

    def __init__(
        self,
        state_dim: int,
        stored_dim: int | None = None,
        num_heads: int = 1,
        *,
        key: PRNGKeyArray,
        hidden_dim: int | None = None,
        out_dim: int | None = None,
        beta: float | None = None,
        injection: float = 0.1,
        dropout: float = 0.0,
        inference: bool = False,
        solver: Solver | None = None,
        adjoint: AbstractAdjoint | None = None,
        throw: bool = False,
        implementation: Implementation = "auto",
        dtype=None,
        options: HopfieldOptions | None = None,
        **compat,
    ):
        o = options_of(options, compat)
        stored_dim = state_dim if stored_dim is None else stored_dim
        if injection <= 0:
            raise ValueError(f"`injection` must be > 0; got {injection}.")
        check_dropout(dropout)
        hidden_dim = state_dim if hidden_dim is None else hidden_dim
        value_dim = hidden_dim if o.value_dim is None else o.value_dim
        self.attention = MultiHeadAttention(
            num_heads,
            state_dim,
            stored_dim,
            stored_dim,
            out_dim,
            check_dims(hidden_dim, num_heads, "hidden_dim"),
            check_dims(value_dim, num_heads, "value_dim"),
            *(o.use_bias,) * 4,
            key=key,
            output_projection=o.output_projection,
            beta=beta,
            implementation=implementation,
            dtype=dtype,
        )
        self.state_norm = eqx.nn.LayerNorm(state_dim, dtype=dtype) if o.normalize_state else None
        self.stored_norm = eqx.nn.LayerNorm(stored_dim, dtype=dtype) if o.normalize_stored else None
        self.normalize_projected = o.normalize_projected
        self.injection = injection
        default = Picard(rtol=1e-4, max_steps=500)
        self.solver, self.adjoint = self.solving(solver, adjoint, default, dtype)
        self.throw = throw
        self.state_dim = state_dim
        self.stored_dim = stored_dim
        self.update_steps = o.update_steps
        self.update_steps_eps = o.update_steps_eps
        self.dropout = dropout
        self.inference = inference
        self.zero_association = o.add_zero_association
        self.static_state, self.static_stored = o.static_state, o.static_stored
        self.static_values, self.connected_values = o.static_values, o.connected_values
        self.association_activation = o.association_activation
        self._check_static_widths()
        if o.connected_values and not o.static_values:  # the value projection reads hidden_dim
            a = self.attention
            value_proj = eqx.nn.Linear(
                a.query_proj.out_features,
                a.value_proj.out_features,
                use_bias=o.use_bias,
                key=jax.random.fold_in(key, 3),
                dtype=dtype,
            )
            self.attention = eqx.tree_at(lambda a: a.value_proj, self.attention, value_proj)
        self.bias_key, self.bias_value = self._bias_patterns(o.concat_bias_pattern, key, dtype)

    def _bias_patterns(self, concat: bool, key, dtype):
        """`concat_bias_pattern`'s learned projected key and value (N(0, 0.02^2)), or Nones."""
        if not concat:
            return None, None
        kk, kv = jax.random.split(jax.random.fold_in(key, 1))
        dt = dtype or jnp.result_type(float)
        a = self.attention
        return (
            0.02 * jax.random.normal(kk, (a.num_heads * a.qk_size,), dt),
            0.02 * jax.random.normal(kv, (a.num_heads * a.vo_size,), dt),
        )

    def _check_static_widths(self) -> None:
        """Raw patterns used in every head (`static_*`) must be one head wide."""
        a = self.attention
        heads = a.num_heads
        head, head_value = a.qk_size, a.vo_size
        # connected values are the key projection of the value input: `hidden_dim` wide
        value_width = head * heads if self.connected_values else self.stored_dim
        value_need = head_value * (heads if self.connected_values else 1)
        for flag, name, width, need, what in (
            (self.static_state, "static_state", self.state_dim, head, "hidden_dim / num_heads"),
            (self.static_stored, "static_stored", self.stored_dim, head, "hidden_dim / num_heads"),
            (self.static_values, "static_values", value_width, value_need, "value_dim / num_heads"),
        ):
            if flag and width != need:
                raise ValueError(
                    f"`{name}=True` uses the raw patterns in every head, so their width "
                    f"({width}) must equal {what} ({need})."
                )

    def _append(self, x, bias):
        """`x [heads, m, d]` with the bias pattern (`bias [heads * d]` or None) and the zero
        pattern appended along m, as configured."""
        h, _, d = x.shape
        parts = [x]
        if bias is not None:
            parts.append(bias.reshape(h, 1, d).astype(x.dtype))
        if self.zero_association:
            parts.append(jnp.zeros((h, 1, d), x.dtype))
        return jnp.concatenate(parts, axis=1) if len(parts) > 1 else x

    def _per_head(self, proj, x, static):
        """`x [m, d]` projected and split into heads, or (static) the same raw `x` per head."""
        h = self.attention.num_heads
        if static:
            return jnp.broadcast_to(x[None], (h, *x.shape))
        return split_heads(per_token(proj, x), h)

    def _values(self, stored_n):
        a = self.attention
        if self.connected_values:  # through the key projection, then (unless static) W_v
            x = per_token(a.key_proj, stored_n)
            v = split_heads(x if self.static_values else per_token(a.value_proj, x), a.num_heads)
        else:
            v = self._per_head(a.value_proj, stored_n, self.static_values)
        return self._append(v, self.bias_value)

    def _patterns(self, state, stored, association_mask, padding_mask):
        check_tokens(state, self.state_dim, "state")
        check_tokens(stored, self.stored_dim, "stored")
        n, m = state.shape[0], stored.shape[0]
        mask = check_mask(association_mask, n, m, "association_mask")
        if padding_mask is not None:
            padding_mask = check_mask(padding_mask, 1, m, "padding_mask")
            mask = padding_mask[None, :] if mask is None else mask & padding_mask
        if self.state_norm is not None:
            state = jax.vmap(self.state_norm)(state)
        if self.stored_norm is not None:
            stored = jax.vmap(self.stored_norm)(stored)
        q0 = self._per_head(self.attention.query_proj, state, self.static_state)
        k = self._per_head(self.attention.key_proj, stored, self.static_stored)
        if self.normalize_projected:
            q0, k = renormalize(q0), renormalize(k)
        extra = (self.bias_key is not None) + self.zero_association
        if extra:
            k = self._append(k, self.bias_key)
            if mask is not None:  # the appended patterns are never masked
                mask = jnp.concatenate([mask, jnp.ones((mask.shape[0], extra), bool)], axis=1)
        return q0, k, stored, mask

    def update(self, xi, xi0, keys, mask=None):
        r"""One concave-convex step $\xi \leftarrow (K^\top\mathrm{softmax}(\beta K\xi) + \alpha\xi_0)/(1+\alpha)$."""
        retrieved = attention(xi, keys, beta=self.attention.beta, mask=mask)
        return (retrieved + self.injection * xi0) / (1 + self.injection)

    def equilibrium(
        self, state, stored, *, association_mask=None, padding_mask=None, budget=None
    ) -> Equilibrium:
        """The equilibrium projected state patterns $\\xi^*$ `[heads, n, d_h]` with solver statistics."""
        q0, k, _, mask = self._patterns(state, stored, association_mask, padding_mask)
        return self._solve(q0, k, mask, budget)

    def _solve(self, q0, k, mask, budget):
        if self.update_steps is not None:
            return self._update_steps(q0, k, mask, self.update_steps)
        eq = self.solve(Hopfield.update, q0, q0, k, mask, budget=budget)
        # Every solver's first evaluation is the plain update of the start, and plain updates
        # only descend the energy from there: a returned point above that energy is not where
        # repeated updates go (a diagnostic, no gradient; one more update's cost).
        first = self.update(q0, q0, k, mask)
        start, end = (lax.stop_gradient(self._energy(xi, q0, k, mask)) for xi in (first, eq.value))
        eps = jnp.finfo(start.dtype).eps
        rose = end > start + 64 * eps * (jnp.abs(start) + jnp.abs(end) + 1)
        return dataclasses.replace(eq, stats={**eq.stats, "energy_rose": rose})

    def _energy(self, xi, q0, k, mask):
        e = hopfield_energy(xi, k[:, None], beta=self.attention.beta[:, None], mask=mask)
        return jnp.sum(e) + 0.5 * self.injection * jnp.sum((xi - q0) ** 2)

    def _update_steps(self, xi, k, mask, count: int) -> Equilibrium:
        """`update_steps` plain updates per head, each head stopping once its association moves
        by at most `update_steps_eps`; differentiated by autodiff through every update.

        Its own loop, not the solvers' (`_solve/_loop.py`): hopfield-layers stops on the change
        of the association matrix per head, not on the residual of the state, and runs a Python
        loop of at most `update_steps` updates; this reproduces its outputs (tested against
        them), which the solvers' residual test would not."""
        beta = self.attention.beta

        def association(xi):
            return attention_weights(xi, k, beta=beta, mask=mask)  # [h, n, m]

        a = association(xi)
        active = jnp.full(xi.shape[:1], count > 0)
        settled = jnp.zeros(xi.shape[:1], bool)  # stopped by update_steps_eps
        steps = jnp.zeros((), jnp.int32)
        for t in range(1, count + 1):
            new_xi = jnp.einsum("hnm,hmd->hnd", a, k)
            new_a = association(new_xi)
            xi = jnp.where(active[:, None, None], new_xi, xi)
            change = lax.stop_gradient(jnp.sqrt(jnp.sum((new_a - a) ** 2, axis=(1, 2))))
            a = jnp.where(active[:, None, None], new_a, a)
            steps = steps + jnp.any(active)
            settled = settled | (active & (change <= self.update_steps_eps))
            active = active & (change > self.update_steps_eps) & (t < count)
        # the plain update's residual at the returned state
        image = lax.stop_gradient(jnp.einsum("hnm,hmd->hnd", a, k))
        residual = jnp.sqrt(jnp.sum((image - lax.stop_gradient(xi)) ** 2))
        scale = jnp.maximum(jnp.sqrt(jnp.sum(image**2)), jnp.finfo(image.dtype).tiny)
        converged = jnp.all(settled)
        return Equilibrium(
            value=xi,
            steps=steps,
            residual=residual,
            relative_residual=residual / scale,
            result=status(converged, RESULTS.max_steps_reached),
        )

    def forward(
        self,
        state,
        stored,
        *,
        association_mask=None,
        padding_mask=None,
        budget=None,
        key=None,
        inference=None,
        values=None,
    ):
        """The output and the `Equilibrium` of the projected state patterns. `values [m,
        stored_dim]`: what the values are projected from (hopfield-layers' pattern projection;
        default `stored`), normalized like `stored`."""
        q0, k, stored_n, mask = self._patterns(state, stored, association_mask, padding_mask)
        eq = self._solve(q0, k, mask, budget)
        if values is not None:
            check_tokens(values, self.stored_dim, "values")
            if values.shape[0] != stored.shape[0]:
                raise ValueError(
                    f"`values` must have as many rows as `stored` ({stored.shape[0]}); got "
                    f"shape {values.shape}."
                )
            stored_n = values if self.stored_norm is None else jax.vmap(self.stored_norm)(values)
        v = self._values(stored_n)
        inference = self.inference if inference is None else inference
        if self.dropout == 0 or inference:
            out = attention(eq.value, k, v, beta=self.attention.beta, mask=mask)
        else:
            if key is None:
                raise ValueError(
                    "Hopfield with dropout > 0 needs `key` (or inference=True, or "
                    "eqx.nn.inference_mode(model))."
                )
            a = attention_weights(eq.value, k, beta=self.attention.beta, mask=mask)
            keep = jax.random.bernoulli(key, 1 - self.dropout, a.shape)
            a = jnp.where(keep, a / (1 - self.dropout), 0)
            out = jnp.einsum("hnm,hmd->hnd", a, v)
        out = merge_heads(out)
        if self.attention.output_proj is not None:
            out = per_token(self.attention.output_proj, out)
        if self.association_activation is not None:
            out = self.association_activation(out)
        return out, eq

    def energy(
        self, state, stored, xi=None, *, association_mask=None, padding_mask=None
    ) -> Float[Array, ""]:
        r"""$\sum_{h, i} E_\beta(\xi_{hi}; K_h) + \frac{\alpha}{2}\lVert\xi - \xi_0\rVert^2$ at `xi`
        (default: the equilibrium). Each query's energy counts only the stored patterns its
        `association_mask` and `padding_mask` keep (as the solve does)."""
        q0, k, _, mask = self._patterns(state, stored, association_mask, padding_mask)
        xi = self._solve(q0, k, mask, None).value if xi is None else xi
        return self._energy(xi, q0, k, mask)

    def association(
        self, state, stored, *, association_mask=None, padding_mask=None
    ) -> Float[Array, "heads n m"]:
        """The softmax (association) matrix $\\mathrm{softmax}(\\beta K\\xi^*)$ per head,
        `[heads, n, m]` (plus the bias and zero patterns' columns, last, when configured)."""
        q0, k, _, mask = self._patterns(state, stored, association_mask, padding_mask)
        xi = self._solve(q0, k, mask, None).value
        return attention_weights(xi, k, beta=self.attention.beta, mask=mask)
