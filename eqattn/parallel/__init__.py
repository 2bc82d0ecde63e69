"""Many devices: data parallelism (a batch sharded over a mesh) and sequence parallelism (keys and
values sharded over a mesh axis), on JAX's own `jit` + `NamedSharding` and `jax.shard_map`."""

from ._data import data_mesh as data_mesh, replicate as replicate, shard_batch as shard_batch
from ._sequence import sharded_attention_with_lse as sharded_attention_with_lse
