"""The attention engine. A public call walks one path (`_operators`):

1. **check** (`_checks`, `_prepare.check_arguments`): the arguments as arrays, checked once;
   bad input raises at trace time, naming the argument and the shapes;
2. **plan** (`_plan`): the one choice of what runs, from shapes and dtypes (the rule for
   `"auto"` is written there once; `eqattn.select_implementation` reports the same choice);
3. **prepare** (`_prepare`): what the mask or causality hides made inert, masks broadcast and
   everything flattened once, to `q [B, n, d]`, `k [B, m, d]`, `v [B, m, dv]`, `beta [B]`,
   `mask [1 or B, 1 or n, m]`;
4. **run** (`_backends`): a backend that only computes: the XLA core (`_xla`: one pass, query
   tiles, key chunks), cuDNN (`_cudnn`), the fused Pallas kernel (`_pallas`), each causal
   through the blocks of `_causal`.

The names below are the engine's internal interface for the other floors of eqattn (the graph
floor, `nn`, `parallel`, `eqattn.info`); nothing outside this package imports its modules. `parallel` enters only through
`blockwise` (`_blockwise`): the pieces of one call that a sequence split over devices composes.
"""

from . import _blockwise as blockwise, _causal  # noqa: F401 (blockwise: for eqattn.parallel)
from ._backends import (
    XlaBackend as XlaBackend,
)
from ._checks import (
    Implementation as Implementation,
    check_causal as check_causal,
    check_chunk_size as check_chunk_size,
    check_implementation as check_implementation,
)
from ._decode import attention_over_cache as attention_over_cache
from ._graph import (
    check_graph_shapes as check_graph_shapes,
    segment_attention as segment_attention,
)
from ._measured_tables import TABLES as TABLES
from ._operators import (
    attention as attention,
    attention_weights as attention_weights,
    attention_with_lse as attention_with_lse,
    log_normalizer as log_normalizer,
    merge_heads as merge_heads,
    split_heads as split_heads,
)
from ._plan import (
    Tiling as Tiling,
    check_tiling as check_tiling,
    gpu_kind as gpu_kind,
    second_order as second_order,
    select_implementation as select_implementation,
)
from ._prepare import (
    Arguments as Arguments,
    Problem as Problem,
    apply_poison as apply_poison,
    check_arguments as check_arguments,
    prepare as prepare,
)
from ._xla import (
    compute_dtype as compute_dtype,
    finalize as finalize,
    merge_partials as merge_partials,
)
