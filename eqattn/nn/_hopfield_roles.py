"""Hopfield layers in the pooling and lookup roles of hopfield-layers: learned state patterns
that pool a set ([`HopfieldPooling`][eqattn.nn.HopfieldPooling]), and learned stored patterns
that a state looks up ([`HopfieldLayer`][eqattn.nn.HopfieldLayer]); both wrap
[`eqattn.nn.Hopfield`][]."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float, PRNGKeyArray

from .._solve import Equilibrium
from ._hopfield import Hopfield
from ._layer import AbstractSolved


class HopfieldPooling(AbstractSolved):
    """Learned state patterns pool a set of stored patterns `[m, dim]` into `num_queries`
    vectors `[num_queries, out_dim]` (the pooling role); `trainable=False` keeps the queries
    fixed (no gradient reaches them). Other keywords go to [`eqattn.nn.Hopfield`][].

    **Example:**

    ```python
    import equinox as eqx, jax, eqattn

    pool = eqattn.nn.HopfieldPooling(16, 2, key=jax.random.key(0), num_queries=3)
    x = jax.random.normal(jax.random.key(1), (20, 16))  # a set of 20 items
    assert eqx.filter_jit(pool)(x).shape == (3, 16)  # three learned queries retrieve from it
    ```
    """

    hopfield: Hopfield
    queries: Float[Array, "q dim"]
    trainable: bool = eqx.field(static=True)

    def __init__(
        self,
        dim: int,
        num_heads: int = 1,
        *,
        key: PRNGKeyArray,
        num_queries: int = 1,
        trainable: bool = True,
        dtype=None,
        **kwargs,
    ):
        kh, kq = jax.random.split(key)
        self.hopfield = Hopfield(dim, dim, num_heads, key=kh, dtype=dtype, **kwargs)
        self.queries = jax.random.normal(kq, (num_queries, dim), dtype or jnp.result_type(float))
        self.trainable = trainable

    def forward(
        self, stored, *, padding_mask=None, budget=None, key=None, inference=None
    ) -> tuple[Float[Array, "q out"], Equilibrium]:
        """The pooled vectors and the `Equilibrium` of the projected queries."""
        queries = self.queries if self.trainable else lax.stop_gradient(self.queries)
        return self.hopfield.forward(
            queries,
            stored,
            padding_mask=padding_mask,
            budget=budget,
            key=key,
            inference=inference,
        )


class HopfieldLayer(AbstractSolved):
    """Learned stored patterns `[num_patterns, dim]` act as a lookup table for the input state
    patterns `[n, dim]` (the layer/memory role). `trainable=False` keeps them fixed (no gradient
    reaches them); `separate_targets=True` projects the values from a second learned table
    (hopfield-layers' `lookup_weights_as_separated`), fixed when `targets_trainable=False`
    (its `lookup_targets_as_trainable`). Other keywords go to [`eqattn.nn.Hopfield`][].

    **Example:**

    ```python
    import jax, eqattn

    lookup = eqattn.nn.HopfieldLayer(16, 32, 2, key=jax.random.key(0))  # 32 learned patterns
    x = jax.random.normal(jax.random.key(1), (5, 16))
    assert lookup(x).shape == (5, 16)
    ```
    """

    hopfield: Hopfield
    patterns: Float[Array, "p dim"]
    targets: Float[Array, "p dim"] | None
    trainable: bool = eqx.field(static=True)
    targets_trainable: bool = eqx.field(static=True)

    def __init__(
        self,
        dim: int,
        num_patterns: int,
        num_heads: int = 1,
        *,
        key: PRNGKeyArray,
        trainable: bool = True,
        separate_targets: bool = False,
        targets_trainable: bool = True,
        dtype=None,
        **kwargs,
    ):
        kh, kp = jax.random.split(key)  # as before the targets existed
        kt = jax.random.fold_in(key, 2)
        self.hopfield = Hopfield(dim, dim, num_heads, key=kh, dtype=dtype, **kwargs)
        dtype = dtype or jnp.result_type(float)
        self.patterns = jax.random.normal(kp, (num_patterns, dim), dtype)
        self.targets = (
            jax.random.normal(kt, (num_patterns, dim), dtype) if separate_targets else None
        )
        self.trainable = trainable
        self.targets_trainable = targets_trainable

    def forward(
        self, state, *, budget=None, key=None, inference=None
    ) -> tuple[Float[Array, "n out"], Equilibrium]:
        """The looked-up output and the `Equilibrium` of the projected state patterns."""
        patterns = self.patterns if self.trainable else lax.stop_gradient(self.patterns)
        targets = self.targets
        if targets is not None and not self.targets_trainable:
            targets = lax.stop_gradient(targets)
        return self.hopfield.forward(
            state, patterns, budget=budget, key=key, inference=inference, values=targets
        )
