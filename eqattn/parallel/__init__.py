"""Many devices: data parallelism (a batch sharded over a mesh) and sequence parallelism (keys and
values sharded over a mesh axis; or queries, keys and values all sharded, with ring attention),
on JAX's own `jit` + `NamedSharding` and `jax.shard_map`."""

from ._data import data_mesh as data_mesh, replicate as replicate, shard_batch as shard_batch
from ._ring import (
    ring_attention as ring_attention,
    ring_attention_with_lse as ring_attention_with_lse,
)
from ._sequence import sharded_attention_with_lse as sharded_attention_with_lse
from ._split import SequenceSplit as SequenceSplit
