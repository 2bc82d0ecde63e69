"""What the transformer models (explicit and implicit) are to their users: embedding -> blocks ->
read-out, one prediction interface, and generation with a cache."""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, NamedTuple

import equinox as eqx
import jax
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray

from ._cache import GenerationCache, Step
from ._embedding import TokenEmbedding
from ._readout import ReadOut


class Prediction(NamedTuple):
    """One example's output (`logits`) and the solve it came from: solver steps, relative
    residual, convergence and the fixed point (a warm start for the next solve of this example);
    an explicit model's are 0, 0, True and None.

    **Example:**

    ```python
    import jax, eqattn

    model = eqattn.nn.DEQTransformer(10, 16, 2, key=jax.random.key(0), in_features=8, max_len=8)
    p = model.predict(jax.numpy.ones((8, 8)), budget=20)  # inference mode: no key
    assert p.logits.shape == (10,) and p.fixed_point.shape == (8, 16) and p.steps <= 20
    ```
    """

    logits: Any  # an array, or a pytree of them (e.g. the graph models' two outputs)
    steps: Array
    residual: Array
    converged: Array
    fixed_point: Any  # an array or a pytree of them (a graph layer's state), or None


class AbstractTransformer(eqx.Module):
    """Embedding -> blocks -> read-out. [`eqattn.nn.Transformer`][] and
    [`eqattn.nn.DEQTransformer`][] hold the same `embedding` and `readout` modules and differ
    in how their blocks are applied (stacked, or one block solved to equilibrium), so in
    `apply_blocks`, `predict`, and generation's `prefill` and `extend`.

    Subclasses declare `embedding` ([`eqattn.nn.TokenEmbedding`][]) first and `readout`
    ([`eqattn.nn.ReadOut`][]) last, with their blocks between: the pytree's leaves then follow
    the order of the computation. (A field declared here would come first.)"""

    embedding: eqx.AbstractVar[TokenEmbedding]
    if TYPE_CHECKING:  # a field of the subclasses, declared last there (see above)
        readout: ReadOut

    @abc.abstractmethod
    def apply_blocks(
        self, h: Float[Array, "tokens dim"], mask: Bool[ArrayLike, "1 tokens"] | None, **kwargs
    ) -> tuple[Float[Array, "tokens dim"], Any]:
        """`(state after the blocks, their statistics)` from the embedded tokens `h`; `mask`
        is the key padding mask of the attention."""

    @property
    @abc.abstractmethod
    def attention_blocks(self) -> tuple:
        """The blocks whose attention a token goes through, in order."""

    @abc.abstractmethod
    def predict(
        self,
        x: Int[Array, " n"] | Float[Array, "n f"],
        *,
        budget: int | Int[ArrayLike, ""] | None = None,
        key: PRNGKeyArray | None = None,
        z0: Float[Array, "tokens dim"] | None = None,
    ) -> Prediction:
        """The logits of one example and the solve's statistics. `key` (training) draws dropout
        masks; without it the model runs in inference mode. `budget` caps and `z0`
        warm-starts an implicit model's solve (an explicit model ignores both)."""

    @abc.abstractmethod
    def prefill(
        self,
        tokens: Int[Array, " n"],
        length: int | Int[Array, ""] | None = None,
        *,
        budget: int | Int[ArrayLike, ""] | None = None,
    ) -> tuple[Float[Array, "n vocab"], GenerationCache, Step]:
        """See [`eqattn.nn.prefill`][]."""

    @abc.abstractmethod
    def extend(
        self,
        token: Int[Array, ""],
        cache: GenerationCache,
        *,
        warm_start: bool = True,
        budget: int | Int[ArrayLike, ""] | None = None,
    ) -> tuple[Float[Array, " vocab"], GenerationCache, Step]:
        """See [`eqattn.nn.extend`][]."""

    def check_language_model(self) -> None:
        """Raise a `ValueError` unless this model generates: causal blocks, one output per
        token (`pooling="none"`) and integer tokens."""
        causal = all(b.attention.causal for b in self.attention_blocks)
        if not causal or self.readout.pooling != "none":
            raise ValueError(
                "generation needs a causal language model: blocks with causal=True and "
                "pooling='none' (one output per token)."
            )
        if not isinstance(self.embedding.embed, eqx.nn.Embedding):
            raise ValueError("generation needs integer tokens (a model built with `vocab_size`).")

    def _next(self, token, cache: GenerationCache):
        """The embedded new token at the cache's position."""
        return self.embedding(jax.numpy.reshape(token, (1,)), offset=cache.length)[0]
