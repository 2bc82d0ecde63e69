"""The graph floor: a `Graph` (an edge list with optional edge features, padded to batch), its
one validator and error type, the segment operations (log-sum-exp, soft minimum), attention
over a graph's incoming edges, and the graph operators (`soft_shortest_paths`). It stands
beside the attention engine (whose segment pass it calls) and below `nn`; layers, tasks and
`graphs.predict` take a `Graph`."""

from ._attention import (
    check_beta as check_beta,
    graph_attention as graph_attention,
    graph_attention_with_lse as graph_attention_with_lse,
    segment_logsumexp as segment_logsumexp,
    segment_softmin as segment_softmin,
)
from ._graph import Graph as Graph, check_graph as check_graph, is_concrete as is_concrete
from ._shortest import reachable as reachable, soft_shortest_paths as soft_shortest_paths
