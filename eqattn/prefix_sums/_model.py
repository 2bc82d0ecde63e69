r"""The prefix-sums models: bits one-hot -> a linear code per bit -> the generic graph
transformer over the string's chain -> a linear read-out of two logits per bit. The DEQ solves
[`nn.ImplicitGraphTransformer`][eqattn.nn.ImplicitGraphTransformer] to its fixed point, so a
longer string is answered by iterating longer; its explicit twin stacks untied steps
([`nn.ExplicitGraphTransformer`][eqattn.nn.ExplicitGraphTransformer]). Nothing in the step knows
parity: the encoder and decoder are the only task-specific parts."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray

from .. import nn
from .._solve import AbstractAdjoint, Picard, Solver
from ._data import EDGE_KINDS, chain

Core = nn.ImplicitGraphTransformer | nn.ExplicitGraphTransformer


def _check_bits(bits) -> Array:
    bits = jnp.asarray(bits)
    if bits.ndim != 1 or not jnp.issubdtype(bits.dtype, jnp.integer) or bits.shape[0] < 1:
        raise ValueError(
            f"`bits` must be one string, integers [n] with n >= 1; got {bits.dtype}{list(bits.shape)}"
        )
    return bits


class PrefixSumsModel(eqx.Module):
    r"""One bit string's running parity, as two logits per bit: $x = W_e\,\mathrm{onehot}(b)$,
    $z$ = the core's answer over the string's chain ([`chain`][eqattn.prefix_sums.chain]),
    logits $= W_d z$.

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

    encoder: eqx.nn.Linear
    core: Core
    decoder: eqx.nn.Linear

    def __init__(self, core: Core, *, key: PRNGKeyArray):
        if isinstance(core, nn.ImplicitGraphTransformer):
            step = core.step
        elif isinstance(core, nn.ExplicitGraphTransformer):
            step = core.steps[0]
        else:
            raise TypeError(
                "`core` must be an nn.ImplicitGraphTransformer or nn.ExplicitGraphTransformer; "
                f"got {type(core).__name__}"
            )
        if step.edge_features != len(EDGE_KINDS):
            raise ValueError(
                f"`core` must read {len(EDGE_KINDS)} edge features (the chain's edge kinds); "
                f"got {step.edge_features}"
            )
        ke, kd = jax.random.split(key)
        dtype = step.log_gamma.dtype
        self.encoder = eqx.nn.Linear(2, step.dim, key=ke, dtype=dtype)
        self.core = core
        self.decoder = eqx.nn.Linear(step.dim, 2, key=kd, dtype=dtype)

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
        `adjoint` (default the implicit adjoint, as
        [`nn.ImplicitGraphTransformer`][eqattn.nn.ImplicitGraphTransformer]'s)."""
        kc, km = jax.random.split(key)
        step = nn.GraphTransformerStep(
            dim, heads, key=kc, edge_features=len(EDGE_KINDS), dtype=dtype
        )
        solver = Picard(rtol=1e-4, max_steps=4096) if solver is None else solver
        core = nn.ImplicitGraphTransformer(step, solver=solver, adjoint=adjoint)
        return cls(core, key=km)

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
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"`depth` must be an int >= 1; got {depth!r}")
        kc, km = jax.random.split(key)
        steps = (
            nn.GraphTransformerStep(
                dim, heads, key=k, edge_features=len(EDGE_KINDS), hidden=hidden, dtype=dtype
            )
            for k in jax.random.split(kc, depth)
        )
        return cls(nn.ExplicitGraphTransformer(steps), key=km)

    @classmethod
    def matched(
        cls, deq: PrefixSumsModel, *, depth: int, key: PRNGKeyArray, dtype=None
    ) -> PrefixSumsModel:
        """The explicit twin of `deq`: `depth` untied steps with `deq`'s parameters, within 5%
        (of the shapes that are, the one whose MLP is nearest the usual `2 * dim` units; heads:
        the most, at most `deq`'s, that divide its `dim`). A `ValueError` if no shape is."""
        dim, heads, hidden = twin_shape(deq, depth)
        return cls.explicit(dim, heads, depth=depth, key=key, hidden=hidden, dtype=dtype)

    def with_solver(self, solver: Solver) -> PrefixSumsModel:
        """The DEQ with another solver (e.g. the overthinking control, Picard iteration whose
        stopping test only an exact fixed point passes: `Picard(rtol=1e-30, atol=0.0,
        max_steps=4 * budget)`)."""
        if not isinstance(self.core, nn.ImplicitGraphTransformer):
            raise TypeError("`with_solver` sets a DEQ's solver; this model is explicit")
        return eqx.tree_at(lambda m: m.core.solver, self, solver)

    @property
    def is_deq(self) -> bool:
        """Whether the core is solved to its fixed point."""
        return isinstance(self.core, nn.ImplicitGraphTransformer)

    def code(self, bits: Int[ArrayLike, " n"]) -> Float[Array, "n dim"]:
        """Each bit's input code (injected at every step)."""
        bits = _check_bits(bits)
        return jax.vmap(self.encoder)(jax.nn.one_hot(bits, 2, dtype=self.encoder.weight.dtype))

    @eqx.filter_jit
    def predict(self, bits: Int[ArrayLike, " n"], *, budget=None, z0=None) -> nn.Prediction:
        """The logits `[n, 2]` of one string and the solve's statistics (class docstring); one
        compiled program, as the `eqattn.nn` models' calls are."""
        x, graph = self.code(bits), chain(int(jnp.shape(bits)[0]))
        if isinstance(self.core, nn.ImplicitGraphTransformer):
            z, eq = self.core.forward(x, graph, z0=z0, budget=budget)
            return nn.Prediction(
                jax.vmap(self.decoder)(z), eq.steps, eq.relative_residual, eq.converged, z
            )
        z = self.core(x, graph)
        return nn.Prediction(
            jax.vmap(self.decoder)(z), jnp.array(0), jnp.array(0.0), jnp.array(True), None
        )

    def unrolled(
        self, bits: Int[ArrayLike, " n"], steps, *, z0=None
    ) -> tuple[Float[Array, "n 2"], Float[Array, "n dim"]]:
        """The DEQ's step run `steps` times from zeros (or `z0`): `(logits, state)`."""
        if not isinstance(self.core, nn.ImplicitGraphTransformer):
            raise TypeError("`unrolled` runs a DEQ's step; this model is explicit")
        x, graph = self.code(bits), chain(int(jnp.shape(bits)[0]))
        z = self.core.iterate(x, graph, steps, z0=z0)
        return jax.vmap(self.decoder)(z), z


def _size(tree) -> int:
    """The entries of `tree`'s arrays (or shapes of arrays)."""
    leaves = jax.tree.leaves(tree)
    return sum(x.size for x in leaves if isinstance(x, jax.Array | jax.ShapeDtypeStruct))


def twin_heads(dim: int, at_most: int) -> int:
    """The heads of a twin step of `dim` channels: the most, at most `at_most`, that divide
    `dim`."""
    return max(h for h in range(1, at_most + 1) if dim % h == 0)


def twin_shape(deq: PrefixSumsModel, depth: int) -> tuple[int, int, int]:
    """`(dim, heads, hidden)` of `PrefixSumsModel.matched`. The count is affine in `hidden`
    and in the depth: four counts of one- and two-step models give a width's best `hidden`."""
    if not deq.is_deq:
        raise TypeError("`matched` takes a DEQ's parameters; this model is explicit")
    step = deq.core.step  # type: ignore[union-attr]
    target = _size(deq)

    def count(dim: int, heads: int, hidden: int) -> int:
        """The parameters of `depth` steps (from those of one and two)."""
        one, two = (
            _size(
                eqx.filter_eval_shape(
                    lambda d=d: PrefixSumsModel.explicit(
                        dim, heads, depth=d, key=jax.random.key(0), hidden=hidden
                    )
                )
            )
            for d in (1, 2)
        )
        return one + (depth - 1) * (two - one)

    found = []
    for dim in range(1, step.dim + 1):
        heads = twin_heads(dim, step.num_heads)
        one, two = count(dim, heads, 1), count(dim, heads, 2)
        if one > 1.05 * target:  # wider only adds parameters
            break
        hidden = max(1, round(1 + (target - one) / (two - one)))
        off = abs(one + (hidden - 1) * (two - one) - target) / target
        if off <= 0.05:
            found.append((abs(hidden - 2 * dim), -dim, (dim, heads, hidden)))
    if not found:
        raise ValueError(
            f"no explicit model of {depth} steps comes within 5% of the DEQ's {target:,} "
            "parameters; choose another `depth`"
        )
    return min(found)[2]
