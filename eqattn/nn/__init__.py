"""Equinox layers at equilibrium. Each acts on one example; `jax.vmap` over a batch.

The models' calls (every equilibrium layer's `layer(...)`, the transformers' `model(...)` and
`model.predict(...)`) are compiled with `equinox.filter_jit`: called outside `jax.jit` (a
notebook, a test) one runs as one program, compiled once per shape and setting, instead of
operation by operation; inside your own `jax.jit`, `jax.grad` or `jax.vmap` it is traced inline
as before. Python numbers and flags passed to them (`budget=8`, `inference=True`) are part of
what is compiled. An equilibrium layer's `forward(...)` and `equilibrium(...)` run its solve as
one program the same way (its `budget` a run-time value with eqattn's solvers), after checking
their inputs."""

from ._cache import GenerationCache as GenerationCache, Step as Step
from ._deq import DEQTransformer as DEQTransformer
from ._deq_block import DEQBlock as DEQBlock
from ._embedding import TokenEmbedding as TokenEmbedding
from ._energy import EnergyAttention as EnergyAttention
from ._generate import extend as extend, prefill as prefill
from ._graph import (
    ExplicitGraphAttention as ExplicitGraphAttention,
    ImplicitGraphAttention as ImplicitGraphAttention,
)
from ._graph_attention import GraphAttentionStep as GraphAttentionStep
from ._graph_reasoner import GraphReasoner as GraphReasoner, twin_shape as twin_shape
from ._graph_records import GraphRecordsStep as GraphRecordsStep
from ._graph_step import AbstractGraphStep as AbstractGraphStep, GraphState as GraphState
from ._graph_transformer import (
    ExplicitGraphTransformer as ExplicitGraphTransformer,
    GraphTransformerStep as GraphTransformerStep,
    ImplicitGraphTransformer as ImplicitGraphTransformer,
)
from ._hopfield import Hopfield as Hopfield
from ._hopfield_options import HopfieldOptions as HopfieldOptions
from ._hopfield_roles import HopfieldLayer as HopfieldLayer, HopfieldPooling as HopfieldPooling
from ._implicit import ImplicitAttention as ImplicitAttention
from ._layer import AbstractEquilibriumLayer as AbstractEquilibriumLayer
from ._model import AbstractTransformer as AbstractTransformer, Prediction as Prediction
from ._multihead import (
    BlockCache as BlockCache,
    KeyValues as KeyValues,
    MultiHeadAttention as MultiHeadAttention,
)
from ._readout import ReadOut as ReadOut
from ._transformer import Transformer as Transformer, TransformerBlock as TransformerBlock
