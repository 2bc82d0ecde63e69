"""Where a layer's tokens live: [`SequenceSplit`][eqattn.parallel.SequenceSplit]."""

from __future__ import annotations

import dataclasses

from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jaxtyping import Array, Float

from ._ring import ring_attention
from ._sequence import check_axis


@dataclasses.dataclass(frozen=True)
class SequenceSplit:
    """Where a layer's tokens live: split along the sequence over the mesh axis `axis` of `mesh`.

    Given to [`eqattn.nn.ImplicitAttention`][], [`eqattn.nn.DEQBlock`][],
    [`eqattn.nn.DEQTransformer`][] or [`eqattn.nn.MultiHeadAttention`][] as `sequence=`, it makes
    their attention [`eqattn.parallel.ring_attention`][] and keeps the solver's state sharded
    along the tokens: under `jit`, XLA partitions the whole solve (every other operation acts per
    token or reduces over all of them), so the solvers' norms and inner products are global
    reductions, every device takes the same steps and decides convergence identically, and the
    implicit backward runs sharded too. The token count must be a multiple of the axis size.

    **Example:**

    ```python
    import jax, jax.numpy as jnp, numpy as np, eqattn
    from jax.sharding import Mesh

    mesh = Mesh(np.array(jax.devices()), ("seq",))
    split = eqattn.parallel.SequenceSplit(mesh, "seq")  # the tokens over "seq", ring attention
    layer = eqattn.nn.ImplicitAttention(8, 2, key=jax.random.key(0), sequence=split)
    plain = eqattn.nn.ImplicitAttention(8, 2, key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (2 * jax.device_count(), 8))
    assert jnp.allclose(layer(x), plain(x), atol=1e-4)
    ```
    """

    mesh: Mesh
    axis: str

    def __post_init__(self):
        check_axis(self.mesh, self.axis)

    def constrain(self, x: Float[Array, "... n d"]) -> Float[Array, "... n d"]:
        """`x` with its token axis (second to last) sharded over `axis`."""
        size = self.mesh.shape[self.axis]
        if x.ndim < 2 or x.shape[-2] % size:
            raise ValueError(
                f"the number of tokens must be a multiple of the size {size} of mesh axis "
                f"{self.axis!r} to split them over it; got shape {x.shape} (tokens, features)."
            )
        spec = P(*([None] * (x.ndim - 2)), self.axis, None)
        return lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))

    def attention(
        self,
        queries: Float[Array, "*batch n d"],
        keys: Float[Array, "*batch m d"],
        values: Float[Array, "*batch m dv"] | None = None,
        **options,
    ) -> Float[Array, "*batch n dv"]:
        """[`eqattn.parallel.ring_attention`][] over this split's mesh axis (`options`: its
        keyword arguments, e.g. `beta`, `mask`, `causal`, `implementation`)."""
        return ring_attention(queries, keys, values, mesh=self.mesh, axis=self.axis, **options)
