"""`eqattn train --task graphs` and `eqattn evaluate` on its runs, as a user runs them: the DEQ
(`nn.ImplicitGraphAttention`) trained on graphs of 8-16 nodes answers on graphs of 100 and more
as the numpy BFS does; the explicit model of equal parameters cannot see beyond its depth. The
runs are the suite's shared ones (`graph_runs`, the command's defaults)."""

import json

import numpy as np
import pytest

from eqattn import graphs
from eqattn.cli import main

pytestmark = pytest.mark.float32


@pytest.fixture(scope="module")
def runs(graph_runs):
    """The DEQ (the defaults) and its explicit twin."""
    return graph_runs / "runs" / "graphs"


def test_the_deq_answers_on_larger_graphs_as_bfs_does(runs):
    metrics = json.loads((runs / "deq" / "metrics.json").read_text())
    assert metrics["task"] == "graphs" and metrics["graph_sizes"] == [8, 16]
    assert metrics["test_accuracy"] >= 0.99 and metrics["test_accuracy_at_64_nodes"] >= 0.99
    model = graphs.load_model(runs / "deq")
    assert model.algorithm is graphs.ALGORITHMS["bfs"]
    # three paths of 100 nodes and one of 2100, its farthest node more than 1024 edges from the
    # source wherever the source lies (the other families at 256 and 1024 nodes: the run's own
    # evaluation, whose transcript the README shows; steps against depth on grids: the quick
    # graphs benchmark)
    cases = (("path", 100, 3), ("path", 2100, 1))
    for family, n, count in cases:
        g = graphs.sample(family, n, count, seed=11)
        out = graphs.predict(model, graphs.from_adjacency(g.adjacency), g.source)
        reachable, distance = graphs.bfs(*g)
        parents = graphs.valid_parents(g.adjacency, distance)
        right = np.take_along_axis(parents, out.parent[..., None], -1)[..., 0]
        assert (out.reachable == reachable).mean() >= 0.99, family
        assert right.mean() >= 0.99 and out.converged.all(), family
        assert (out.steps >= distance.max(-1)).all()  # a step per edge to the farthest node
    assert distance.max(-1).min() > 1024


def _evaluate_on(sizes, monkeypatch):
    """`eqattn evaluate` scores only `sizes` (nodes: graphs per family), fewer than the
    command's: the quick graphs suite and the guide's transcript cover the rest."""
    from eqattn.graphs import _task

    full = _task._Data.evaluate
    monkeypatch.setattr(
        _task._Data, "evaluate", lambda self, *a, **k: full(self, *a, **{**k, "sizes": sizes})
    )


def test_the_explicit_model_has_the_deqs_parameters_and_sees_only_its_depth(
    runs, tmp_path, monkeypatch
):
    deq, explicit = (
        json.loads((runs / m / "metrics.json").read_text()) for m in ("deq", "explicit")
    )
    assert abs(explicit["params"] - deq["params"]) <= 0.05 * deq["params"]
    assert explicit["model_shape"]["depth"] == 16  # the training graphs' longest distance + 1
    _evaluate_on({256: 4}, monkeypatch)
    out = tmp_path / "e.json"
    assert main(["evaluate", "--checkpoint", str(runs / "explicit"), "--json", str(out)]) == 0
    far = json.loads(out.read_text())["by_distance"]["65-256"]
    assert far[1] > 1000 and far[0] / far[1] < 0.1  # far beyond its 16 steps: lost


def test_evaluate_reports_sizes_budgets_and_distances(runs, tmp_path, capsys, monkeypatch):
    """`eqattn evaluate` of the DEQ: per family and size, the sweep against the budget, by
    hops (on two of the command's sizes; the 2100-node path is the test above's)."""
    _evaluate_on({16: 8, 256: 4}, monkeypatch)
    out = tmp_path / "e.json"
    assert main(["evaluate", "--checkpoint", str(runs / "deq"), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    sizes = {(r["family"], r["n"]) for r in result["sizes"]}
    assert {("path", 256), ("delaunay", 256), ("tree", 16)} <= sizes
    path = next(r for r in result["sizes"] if (r["family"], r["n"]) == ("path", 256))
    sweep = path["sweep"]
    # a quarter of the rule: unconverged, answers beyond the steps' reach wrong
    assert sweep[0]["max_steps"] == 130 and sweep[0]["converged"] < 1.0
    assert sweep[0]["accuracy"] < 0.9
    assert sweep[-1]["converged"] == 1.0 and sweep[-1]["accuracy"] >= 0.99
    far = result["by_distance"]["65-256"]
    assert far[1] > 1000 and far[0] / far[1] >= 0.99
    assert "by hops from the source" in printed and "against the budget" in printed


def test_graph_options_and_refusals(runs, capsys, tmp_path):
    def refused(*argv):
        code = main(["train", "--task", "graphs", *argv, "--out", str(tmp_path / "x")])
        return code, capsys.readouterr().err.strip()

    for argv, message in [
        (["--graph-sizes", "1", "4"], "--graph-sizes must be two sizes 2 <= low <= high"),
        (["--max-steps", "1"], "--max-steps must be >= 2"),
    ]:
        code, line = refused(*argv)
        assert code == 2 and message in line and "\n" not in line, line
    assert not (tmp_path / "x").exists()
    model = graphs.load_model(runs / "deq")
    # a budget below one step is refused, not answered with every node unreachable
    g = graphs.sample("path", 6, 1, seed=0)
    for budget in (0, -3, 2.5, True):
        with pytest.raises(graphs.ConfigError, match="`budget` must be an integer >= 1"):
            graphs.predict(model, graphs.from_adjacency(g.adjacency), g.source, budget=budget)


def test_resume_with_the_runs_own_options_continues(tmp_path, capsys):
    """`--resume` repeated with the options the run was started with (`--algorithm
    shortest-paths --model deq`) continues it; another value of one is refused."""
    argv = ["train", "--task", "graphs", "--algorithm", "shortest-paths", "--model", "deq"]
    tiny = ["--epochs", "1", "--epoch-steps", "5", "--no-progress", "--out", str(tmp_path)]
    assert main([*argv, *tiny]) == 0
    more = ["--resume", "--epochs", "2", "--no-progress", "--out", str(tmp_path)]
    assert main([*argv, *more]) == 0
    assert json.loads((tmp_path / "metrics.json").read_text())["epochs_done"] == 2
    capsys.readouterr()
    other = ["train", "--task", "graphs", "--algorithm", "mst", "--resume", "--out", str(tmp_path)]
    assert main(other) == 2
    assert "--algorithm cannot change" in capsys.readouterr().err
