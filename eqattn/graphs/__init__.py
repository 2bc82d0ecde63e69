"""The graph task: reachability and a parent for every node by breadth-first search, shortest
paths or the minimum spanning tree from a source (`ALGORITHMS`), on graphs generated on the fly
(no download, fixed seeds) from families whose diameter grows with their size; the references
(numpy BFS, scipy's Dijkstra and spanning tree), the models (one DEQ for every algorithm, the
library's `nn.ImplicitGraphAttention`, and its explicit twin), training (`GraphConfig`,
`GraphTask`, `eqattn train --task graphs`) and predictions of a trained model (see the guide
"Graph reasoning").

```python
from eqattn import graphs, train

train.train(graphs.GraphTask(graphs.GraphConfig()), "runs/graphs/deq")
model = graphs.load_model("runs/graphs/deq")
g = graphs.sample("grid", 1024, 2, seed=0)
out = graphs.predict(model, g.adjacency, g.source)  # parents, reachability, solver steps
out = graphs.predict(model, graphs.edge_list(g.adjacency), g.source)  # or an edge list

config = graphs.GraphConfig(algorithm="shortest-paths")  # the same model, weights as features
train.train(graphs.GraphTask(config), "runs/graphs/paths")
w = graphs.sample_weighted("delaunay", 4096, 1, seed=0)
out = graphs.predict(graphs.load_model("runs/graphs/paths"), w.edges, w.source, weights=w.weights)
```

`__all__` is the public API; `evaluate_sizes` and `distance_table` (the evaluation's tables) are
the task's interface for the benchmarks.
"""

from ..train import ConfigError as ConfigError, RunError as RunError
from ._bfs import bfs as bfs, check_graphs as check_graphs, valid_parents as valid_parents
from ._config import GraphConfig as GraphConfig
from ._edges import EdgeList as EdgeList, choose_parent as choose_parent, edge_list as edge_list
from ._evaluation import hops as hops, score_parents as score_parents
from ._families import FAMILIES as FAMILIES, Graphs as Graphs, sample as sample
from ._model import GraphDEQ as GraphDEQ, GraphStack as GraphStack
from ._predict import (
    GraphPrediction as GraphPrediction,
    budget_for as budget_for,
    predict as predict,
)
from ._scores import distance_table as distance_table
from ._shortest import soft_shortest_paths as soft_shortest_paths
from ._task import (
    GraphTask as GraphTask,
    evaluate_sizes as evaluate_sizes,
    load_model as load_model,
)
from ._weighted import (
    ALGORITHMS as ALGORITHMS,
    WEIGHTED_FAMILIES as WEIGHTED_FAMILIES,
    WeightedGraphs as WeightedGraphs,
    from_edges as from_edges,
    sample_weighted as sample_weighted,
)

__all__ = [
    "ALGORITHMS",
    "FAMILIES",
    "ConfigError",
    "EdgeList",
    "GraphConfig",
    "GraphDEQ",
    "GraphPrediction",
    "GraphStack",
    "GraphTask",
    "Graphs",
    "RunError",
    "WEIGHTED_FAMILIES",
    "WeightedGraphs",
    "bfs",
    "budget_for",
    "check_graphs",
    "choose_parent",
    "edge_list",
    "from_edges",
    "hops",
    "load_model",
    "predict",
    "sample",
    "sample_weighted",
    "score_parents",
    "soft_shortest_paths",
    "valid_parents",
]
