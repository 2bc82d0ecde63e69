"""The graph task: reachability from a source and a breadth-first-search parent for every node,
on graphs generated on the fly (no download, fixed seeds) from families whose diameter grows with
their size; the numpy reference (`bfs`), the models (a DEQ and its explicit twin), training
(`GraphConfig`, `GraphTask`, `eqattn train --task graphs`) and predictions of a trained model (see
the guide "Graph reasoning").

```python
from eqattn import graphs, train

train.train(graphs.GraphTask(graphs.GraphConfig()), "runs/graphs/deq")
model = graphs.load_model("runs/graphs/deq")
g = graphs.sample("grid", 1024, 2, seed=0)
out = graphs.predict(model, g.adjacency, g.source)  # parents, reachability, solver steps
out = graphs.predict(model, graphs.edge_list(g.adjacency), g.source)  # or an edge list
```

`__all__` is the public API; `evaluate_sizes` and `distance_table` (the evaluation's tables) are
the task's interface for the benchmarks.
"""

from ..train import ConfigError as ConfigError, RunError as RunError
from ._bfs import bfs as bfs, check_graphs as check_graphs, valid_parents as valid_parents
from ._config import GraphConfig as GraphConfig
from ._edges import EdgeList as EdgeList, choose_parent as choose_parent, edge_list as edge_list
from ._families import FAMILIES as FAMILIES, Graphs as Graphs, sample as sample
from ._model import (
    IDENTITY_DIM as IDENTITY_DIM,
    GraphDEQ as GraphDEQ,
    GraphStack as GraphStack,
    Propagation as Propagation,
)
from ._predict import (
    GraphPrediction as GraphPrediction,
    budget_for as budget_for,
    features as features,
    predict as predict,
)
from ._scores import distance_table as distance_table, evaluate_sizes as evaluate_sizes
from ._shortest import soft_shortest_paths as soft_shortest_paths
from ._task import GraphTask as GraphTask, load_model as load_model

__all__ = [
    "FAMILIES",
    "IDENTITY_DIM",
    "ConfigError",
    "EdgeList",
    "GraphConfig",
    "GraphDEQ",
    "GraphPrediction",
    "GraphStack",
    "GraphTask",
    "Graphs",
    "Propagation",
    "RunError",
    "bfs",
    "budget_for",
    "check_graphs",
    "choose_parent",
    "edge_list",
    "features",
    "load_model",
    "predict",
    "sample",
    "soft_shortest_paths",
    "valid_parents",
]
