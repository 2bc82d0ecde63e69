"""The graph task: reachability and a parent for every node by breadth-first search, shortest
paths or the minimum spanning tree from a source (`ALGORITHMS`, one object each), on graphs
generated on the fly (no download, fixed seeds) from families whose diameter grows with their
size; the references (numpy BFS, scipy's Dijkstra and spanning tree under the tie rule), the
models (a DEQ, the library's `nn.ImplicitGraphAttention` over the algorithm's step, and its
explicit twin), training (`GraphConfig`, `GraphTask`, `eqattn train --task graphs`) and
predictions of a trained model (see the guide "Graph reasoning"). The models are differentiable
BFS, Bellman-Ford and Prim with a few fitted parameters, not learned reasoning: untrained, they
already answer most of what they are asked.

```python
from eqattn import graphs, train

train.train(graphs.GraphTask(graphs.GraphConfig()), "runs/graphs/deq")
model = graphs.load_model("runs/graphs/deq")
g = graphs.sample("grid", 1024, 2, seed=0)
out = graphs.predict(model, graphs.from_adjacency(g.adjacency), g.source)  # parents, reachability

config = graphs.GraphConfig(algorithm="shortest-paths")  # weights as the edge feature
train.train(graphs.GraphTask(config), "runs/graphs/paths")
w = graphs.sample_weighted("delaunay", 4096, 1, seed=0)  # an eqattn.Graph and a source
out = graphs.predict(graphs.load_model("runs/graphs/paths"), w.graph, w.source)
```

`__all__` is the public API; `evaluate_sizes` and `distance_table` (the evaluation's tables) are
the task's interface for the benchmarks.
"""

from ..train import ConfigError as ConfigError, RunError as RunError
from ._algorithms import (
    ALGORITHMS as ALGORITHMS,
    BFS as BFS,
    AbstractAlgorithm as AbstractAlgorithm,
    ShortestPaths as ShortestPaths,
    SpanningTree as SpanningTree,
)
from ._bfs import bfs as bfs, valid_parents as valid_parents
from ._config import GraphConfig as GraphConfig
from ._edges import choose_parent as choose_parent
from ._evaluation import examples as examples, hops as hops, score_parents as score_parents
from ._families import FAMILIES as FAMILIES, Graphs as Graphs, sample as sample
from ._generic import GenericGraphModel as GenericGraphModel, ParentHead as ParentHead
from ._generic_task import (
    GenericGraphConfig as GenericGraphConfig,
    GenericGraphTask as GenericGraphTask,
    load_model as load_model,
)
from ._generic_training import generic_loss as generic_loss
from ._model import (
    GraphDEQ as GraphDEQ,
    GraphStack as GraphStack,
    ParentScores as ParentScores,
    tied_twin as tied_twin,
)
from ._predict import (
    GraphPrediction as GraphPrediction,
    budget_for as budget_for,
    choose_parents as choose_parents,
    is_forest as is_forest,
    predict as predict,
)
from ._scores import distance_table as distance_table
from ._task import (
    GraphTask as GraphTask,
    evaluate_sizes as evaluate_sizes,
)
from ._weighted import (
    WEIGHTED_FAMILIES as WEIGHTED_FAMILIES,
    WeightedGraphs as WeightedGraphs,
    from_adjacency as from_adjacency,
    from_edges as from_edges,
    sample_weighted as sample_weighted,
)

__all__ = [
    "ALGORITHMS",
    "BFS",
    "FAMILIES",
    "WEIGHTED_FAMILIES",
    "AbstractAlgorithm",
    "ConfigError",
    "GenericGraphConfig",
    "GenericGraphModel",
    "GenericGraphTask",
    "GraphConfig",
    "GraphDEQ",
    "GraphPrediction",
    "GraphStack",
    "GraphTask",
    "Graphs",
    "ParentHead",
    "ParentScores",
    "RunError",
    "ShortestPaths",
    "SpanningTree",
    "WeightedGraphs",
    "bfs",
    "budget_for",
    "choose_parent",
    "choose_parents",
    "examples",
    "from_adjacency",
    "from_edges",
    "generic_loss",
    "hops",
    "is_forest",
    "load_model",
    "predict",
    "sample",
    "sample_weighted",
    "score_parents",
    "tied_twin",
    "valid_parents",
]
