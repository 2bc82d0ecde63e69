"""Graph reasoning generated on the fly (no download, fixed seeds): reachability from a source
and a breadth-first-search parent for every node, on families of graphs whose diameter grows
with their size; the numpy reference (`bfs`), the models (a DEQ and its explicit baseline) and
predictions of a trained one (see the guide "Graph reasoning")."""

from .._errors import ConfigError as ConfigError, RunError as RunError
from ._bfs import bfs as bfs, check_graphs as check_graphs, valid_parents as valid_parents
from ._families import FAMILIES as FAMILIES, Graphs as Graphs, sample as sample
from ._model import (
    BLOCKS as BLOCKS,
    IDENTITY_DIM as IDENTITY_DIM,
    GraphDEQ as GraphDEQ,
    GraphStack as GraphStack,
    Propagation as Propagation,
    model_from_settings as model_from_settings,
)
from ._predict import (
    GraphPrediction as GraphPrediction,
    budget_for as budget_for,
    features as features,
    load_model as load_model,
    predict as predict,
)
