r"""The prefix-sums models: [`nn.GraphReasoner`][eqattn.nn.GraphReasoner] over a string's chain
(bits one-hot -> a linear code per bit -> the generic graph transformer -> two logits per bit).
The DEQ solves [`nn.ImplicitGraphTransformer`][eqattn.nn.ImplicitGraphTransformer] to its fixed
point, so a longer string is answered by iterating longer; its explicit twin stacks untied
steps ([`nn.ExplicitGraphTransformer`][eqattn.nn.ExplicitGraphTransformer]). Nothing in the
step knows parity: the encoder and decoder are the only task-specific parts."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray

from .. import nn
from .._solve import AbstractAdjoint, Solver
from ._data import EDGE_KINDS, chain

SHAPE = dict(categories=2, classes=2, edge_features=len(EDGE_KINDS))
"""What a prefix-sums model reads and answers: a bit a node, the chain's edge kinds, two
logits a bit."""


def _check_bits(bits) -> Array:
    bits = jnp.asarray(bits)
    if bits.ndim != 1 or not jnp.issubdtype(bits.dtype, jnp.integer) or bits.shape[0] < 1:
        raise ValueError(
            f"`bits` must be one string, integers [n] with n >= 1; got {bits.dtype}{list(bits.shape)}"
        )
    return bits


class PrefixSumsModel(eqx.Module):
    r"""One bit string's running parity, as two logits per bit: an
    [`nn.GraphReasoner`][eqattn.nn.GraphReasoner] (`reasoner`) over the string's chain
    ([`chain`][eqattn.prefix_sums.chain]); `encoder`, `core` and `decoder` are its parts.

    Build it with [`deq`][eqattn.prefix_sums.PrefixSumsModel.deq],
    [`explicit`][eqattn.prefix_sums.PrefixSumsModel.explicit], or
    [`matched`][eqattn.prefix_sums.PrefixSumsModel.matched] (the DEQ's explicit twin of equal
    parameters). `model.predict(bits, budget=, z0=)` answers one string
    ([`nn.Prediction`][eqattn.nn.Prediction]: logits `[n, 2]`, the solve's steps and
    convergence); `model.unrolled(bits, steps, z0=)` runs the DEQ's step a fixed number of
    times instead (the tied control, and training).

    **Example:**

    ```python
    import jax, jax.numpy as jnp
    from eqattn import prefix_sums

    model = prefix_sums.PrefixSumsModel.deq(16, 2, key=jax.random.key(0))
    p = model.predict(jnp.array([1, 0, 1, 1]))
    assert p.logits.shape == (4, 2) and p.converged
    twin = prefix_sums.PrefixSumsModel.matched(model, depth=3, key=jax.random.key(1))
    assert twin.predict(jnp.array([1, 0, 1, 1])).logits.shape == (4, 2)
    ```
    """

    reasoner: nn.GraphReasoner

    def __init__(self, reasoner: nn.GraphReasoner):
        if not isinstance(reasoner, nn.GraphReasoner):
            raise TypeError(
                f"`reasoner` must be an nn.GraphReasoner; got {type(reasoner).__name__}"
            )
        if reasoner.shape != SHAPE:
            raise ValueError(
                f"`reasoner` must read a bit a node and the chain's {len(EDGE_KINDS)} edge kinds "
                f"and answer two logits ({SHAPE}); got {reasoner.shape}"
            )
        self.reasoner = reasoner

    @classmethod
    def deq(
        cls,
        dim: int,
        heads: int,
        *,
        key: PRNGKeyArray,
        solver: Solver | None = None,
        adjoint: AbstractAdjoint | None = None,
        dtype=None,
    ) -> PrefixSumsModel:
        """The DEQ: one step of `dim` channels and `heads` heads, solved by `solver` (default
        Picard iteration to a relative residual of 1e-4 within 4096 steps), differentiated by
        `adjoint` (default the implicit adjoint) ([`nn.GraphReasoner.deq`][eqattn.nn.GraphReasoner.deq])."""
        return cls(
            nn.GraphReasoner.deq(
                dim, heads, key=key, solver=solver, adjoint=adjoint, dtype=dtype, **SHAPE
            )
        )

    @classmethod
    def explicit(
        cls,
        dim: int,
        heads: int,
        *,
        depth: int,
        key: PRNGKeyArray,
        hidden: int | None = None,
        dtype=None,
    ) -> PrefixSumsModel:
        """The explicit model: `depth` untied steps of `dim` channels, `heads` heads and an
        MLP of `hidden` units (default `2 * dim`), as deep as a string is long to see all of
        it. [`matched`][eqattn.prefix_sums.PrefixSumsModel.matched] gives the DEQ's twin."""
        return cls(
            nn.GraphReasoner.explicit(
                dim, heads, depth=depth, key=key, hidden=hidden, dtype=dtype, **SHAPE
            )
        )

    @classmethod
    def matched(
        cls, deq: PrefixSumsModel, *, depth: int, key: PRNGKeyArray, dtype=None
    ) -> PrefixSumsModel:
        """The explicit twin of `deq`: `depth` untied steps with `deq`'s parameters, within 5%
        ([`nn.GraphReasoner.matched`][eqattn.nn.GraphReasoner.matched])."""
        return cls(nn.GraphReasoner.matched(deq.reasoner, depth=depth, key=key, dtype=dtype))

    @property
    def encoder(self) -> eqx.nn.Linear:
        """A bit's code."""
        return self.reasoner.encoder

    @property
    def core(self) -> nn.ImplicitGraphTransformer | nn.ExplicitGraphTransformer:
        """The graph transformer, solved or stacked."""
        return self.reasoner.core

    @property
    def decoder(self) -> eqx.nn.Linear:
        """A bit's two logits."""
        return self.reasoner.decoder

    def with_solver(self, solver: Solver) -> PrefixSumsModel:
        """The DEQ with another solver ([`nn.GraphReasoner.with_solver`][eqattn.nn.GraphReasoner.with_solver])."""
        return PrefixSumsModel(self.reasoner.with_solver(solver))

    @property
    def is_deq(self) -> bool:
        """Whether the core is solved to its fixed point."""
        return self.reasoner.is_deq

    def code(self, bits: Int[ArrayLike, " n"]) -> Float[Array, "n dim"]:
        """Each bit's input code (injected at every step)."""
        return self.reasoner.code(_check_bits(bits))

    @eqx.filter_jit
    def predict(self, bits: Int[ArrayLike, " n"], *, budget=None, z0=None) -> nn.Prediction:
        """The logits `[n, 2]` of one string and the solve's statistics (class docstring); one
        compiled program, as the `eqattn.nn` models' calls are."""
        bits = _check_bits(bits)
        return self.reasoner.predict(bits, chain(int(bits.shape[0])), budget=budget, z0=z0)

    def unrolled(
        self, bits: Int[ArrayLike, " n"], steps, *, z0=None
    ) -> tuple[Float[Array, "n 2"], Float[Array, "n dim"]]:
        """The DEQ's step run `steps` times from zeros (or `z0`): `(logits, state)`."""
        bits = _check_bits(bits)
        return self.reasoner.unrolled(bits, chain(int(bits.shape[0])), steps, z0=z0)
