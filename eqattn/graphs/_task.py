"""The graph task: reachability and a parent for every node (`ALGORITHMS`) of graphs drawn on
the fly, trained on small graphs and tested on graphs up to 256 times larger, where a DEQ's solve
takes as many steps as the graph is deep."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np

from .. import train
from ..train import AbstractTask, ConfigError, Headline, progress_bar, run_line, with_shape
from ._algorithms import algorithm_of
from ._config import GraphConfig
from ._evaluation import SIZES, evaluate_parents, examples, make_step, parent_accuracy
from ._model import GraphDEQ, GraphStack
from ._predict import budget_for
from ._scores import FAR, distance_lines, distance_table, summary_lines
from ._weighted import draw_weighted

EDGES_PER_NODE = 8
"""Training graphs are padded to this many directed edges per node (one shape for every batch:
the step traces once); a drawn graph with more is drawn again."""

VALIDATION_GRAPHS = 192
"""Graphs of the training sizes scored after each epoch (a fixed set), and at the end (another)."""


class _Data:
    """A run's data, models and evaluation: graphs of its algorithm's families drawn as edge
    lists, the library's `nn.ImplicitGraphAttention` over the algorithm's step or its explicit
    twin."""

    def __init__(self, config: GraphConfig):
        self.config, self.families = config, config.training_families
        self.algorithm = config.learned

    def draw(self, rng, count: int, sizes: tuple[int, int]):
        g, real = draw_weighted(rng, count, sizes, self.families, EDGES_PER_NODE * sizes[1])
        return examples(g, self.algorithm, real)

    def fixed(self, seed: int, count: int, sizes: tuple[int, int]):
        """A fixed set of examples (the graphs from `seed`)."""
        return self.draw(np.random.default_rng(seed), count, sizes)

    def build_model(self, key, dtype):
        config = self.config
        if config.model == "deq":
            solver, adjoint = config.deq_solver(), config.deq_adjoint()
            return GraphDEQ(
                config.dim, self.algorithm, key=key, solver=solver, adjoint=adjoint, dtype=dtype
            )
        return GraphStack(config.width, config.depth, self.algorithm, key=key, dtype=dtype)

    def train_step(self, optimizer):
        return make_step(self.config.training_budget, optimizer)

    def accuracy(self, model, inputs, targets) -> dict[str, float]:
        return parent_accuracy(model, inputs, targets, budget_for(targets[2].shape[1]))

    def evaluate(self, model, budgets, tick, sizes=SIZES, sweep=True, families=None):
        return evaluate_parents(
            model, self.config, budgets, tick=tick, sizes=sizes, sweep=sweep, families=families
        )


def evaluate_sizes(
    model,
    config: GraphConfig,
    budgets=None,
    *,
    tick=None,
    sizes=None,
    sweep: bool = True,
    families: tuple[str, ...] | None = None,
) -> list[dict[str, Any]]:
    """One row per family and size for a model of `config`'s algorithm: the scores at the
    budget rule (`budget_for`), against the budget (a DEQ, with `sweep`: `budgets`, else
    multiples of the rule) and by distance from the source (hops, for the weighted
    algorithms). `sizes`: nodes and graphs per family (default the evaluation's); `families`:
    these of `WEIGHTED_FAMILIES` only (default all)."""
    data = _Data(config)
    if sizes is None:
        return data.evaluate(model, budgets, tick, sweep=sweep, families=families)
    return data.evaluate(model, budgets, tick, sizes, sweep, families)


class GraphTask(AbstractTask):
    """Graphs of `graph_sizes` nodes from `families` (by default all of `FAMILIES` for `bfs`,
    of `WEIGHTED_FAMILIES` for the others), drawn afresh for every step; after each epoch a
    fixed set of graphs of the same sizes is scored (the validation score keeps `best.eqx`), at
    the end another, and graphs of 64 nodes. `evaluate` scores every weighted family (BFS reads
    their weights as 1) at 16 to 4096 nodes, against the solver's budget up to 256, and by hops
    from the source.

    **Example:**

    ```python
    from eqattn import graphs

    task = graphs.GraphTask(graphs.GraphConfig())
    (graph, anchors), (edge_ok, self_ok, real) = task.example_batch()
    assert anchors.shape == (32, 16) and graph.senders.shape == edge_ok.shape == (32, 128)
    assert graph.num_nodes == 16 and task.config.learned is graphs.ALGORITHMS["bfs"]
    ```
    """

    name = "graphs"
    description = (
        "reachability and parents (BFS, shortest paths, spanning trees) on graphs, "
        "trained small and tested large"
    )
    config_type = GraphConfig
    score = "train_accuracy"
    bar_name = "acc"
    headline = Headline("validation_accuracy", "val", ".3f", ".2%", higher_is_better=True)
    config: GraphConfig

    def __init__(self, config: GraphConfig):
        if jax.process_count() > 1:
            raise ConfigError("the graph task runs in one process")
        self.data = _Data(config)
        self.families = self.data.families
        self.config = config
        self.batch, self.steps_per_epoch = config.batch_size, config.epoch_steps
        self.examples = self.batch * self.steps_per_epoch
        self.validation = self.data.fixed(1, VALIDATION_GRAPHS, config.graph_sizes)
        self.test = self.data.fixed(2, VALIDATION_GRAPHS, config.graph_sizes)
        self.larger = self.data.fixed(3, 48, (64, 64))

    @classmethod
    def build_model(cls, config, key, *, dtype=None):
        """A [`GraphDEQ`][eqattn.graphs.GraphDEQ], or a [`GraphStack`][eqattn.graphs.GraphStack]
        of `depth` steps of the explicit `width`."""
        if config.model == "explicit":
            config = with_shape(cls.build_model, config)
        return _Data(config).build_model(key, dtype)

    def example_batch(self):
        rng = np.random.default_rng(0)
        return self.data.draw(rng, self.batch, self.config.graph_sizes)

    def batches(self, rng, place):
        for _ in range(self.steps_per_epoch):
            yield self.data.draw(rng, self.batch, self.config.graph_sizes), None

    @classmethod
    def run_folder(cls, settings):
        """The algorithm's folder: `graphs`, or `graphs/ALGORITHM` for the weighted ones."""
        return algorithm_of(settings.get("algorithm", GraphConfig.algorithm)).folder

    @classmethod
    def train_step(cls, config, optimizer):
        return _Data(config).train_step(optimizer)

    def test_metrics(self, model, final):
        accuracy = self.data.accuracy
        out = dict(validation_accuracy=accuracy(model, *self.validation)["accuracy"])
        if final:
            test, larger = accuracy(model, *self.test), accuracy(model, *self.larger)
            out.update({f"test_{k}": v for k, v in test.items()})
            out["test_accuracy_at_64_nodes"] = larger["accuracy"]
        return out

    def record(self, *, steps, train_time):
        m = self.config
        shape: dict[str, Any] = {"dim": m.dim}
        if m.model == "explicit":
            shape = {"depth": m.depth, "width": m.width, "mlp_ratio": m.mlp_ratio}
        return dict(
            model_shape=shape,
            algorithm=m.algorithm,
            graph_sizes=list(self.config.graph_sizes),
            families=list(self.families),
            train_graphs=steps * self.batch,
            test_graphs=VALIDATION_GRAPHS,
        )

    @classmethod
    def default_budgets(cls, config) -> list[int] | None:
        return None  # the rule's multiples at each size (`evaluate_sizes`)

    @classmethod
    def evaluate(cls, model, config, header, budgets, progress):
        with progress_bar(None, "evaluate", progress, "size") as bar:
            rows = _Data(config).evaluate(model, budgets, bar.update)
        return {
            "model": config.model,
            "algorithm": config.algorithm,
            "trained_epochs": header.get("epoch"),
            "budget_rule": "2 n + 8",
            "sizes": rows,
            "by_distance": distance_table(rows),
        }

    @classmethod
    def summary(cls, metrics):
        return (
            f"{metrics['config']['model']}: test accuracy {metrics['test_accuracy']:.2%} "
            f"(reachable {metrics['test_reach_accuracy']:.2%}, parent "
            f"{metrics['test_parent_accuracy']:.2%}; {metrics['test_graphs']} graphs of "
            f"{metrics['graph_sizes'][0]}-{metrics['graph_sizes'][1]} nodes; at 64 nodes "
            f"{metrics['test_accuracy_at_64_nodes']:.2%}) | {run_line(metrics)}"
        )

    @classmethod
    def evaluation_report(cls, result):
        return summary_lines(result)

    @classmethod
    def comparison(cls, runs):
        """Each run's accuracy by hops from the source on graphs of `FAR`'s sizes (every family
        at 256 and 1024 nodes), side by side."""
        tables = {}
        for model, run in runs.items():
            loaded = train.load_model(Path(run), cls)
            rows = _Data(loaded.config).evaluate(loaded.model, None, None, FAR, sweep=False)
            tables[model] = distance_table(rows)
        low, high = loaded.config.graph_sizes
        sizes = " and ".join(map(str, FAR))
        head = (
            f"trained on graphs of {low}-{high} nodes, tested on graphs of {sizes} nodes: "
            "a valid parent by hops from the source"
        )
        return [head, *distance_lines(tables)]
