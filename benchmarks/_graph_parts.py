"""The `graphs` suite's parts beside the training runs: the controls of a run (the untrained
model, the layer at the algorithm's exact parameters, the DEQ's own step tied and run as deep as
the explicit twin), the table by weight distribution, the graphs of other generators, and the
DEQ's dynamics (steps against depth, overthinking, path independence)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from eqattn import Picard, graphs, nn, train

from . import _generators

STARTS = 3
"""Random starts of the path-independence test."""


def exact(model: graphs.GraphDEQ) -> graphs.GraphDEQ:
    """`model` at its algorithm's exact parameters: an attention step's first shift channel adds
    the edge's feature and the scores read minus it (BFS: hops; shortest paths: the distance),
    the source's code 0; a records step is the algorithm whatever its fitted map."""
    step = model.layer.step
    if not isinstance(step, nn.GraphAttentionStep):
        return model
    query = jnp.zeros_like(step.query).at[0].set(-1.0)
    shift = jnp.zeros_like(step.shift).at[0].set(1.0)
    model = eqx.tree_at(lambda m: (m.layer.step.query, m.layer.step.shift), model, (query, shift))
    if model.layer.encoder is not None:
        encoder = model.layer.encoder
        model = eqx.tree_at(
            lambda m: (m.layer.encoder.weight, m.layer.encoder.bias),
            model,
            (jnp.zeros_like(encoder.weight), jnp.zeros_like(encoder.bias)),
        )
    return model


def controls(deq, config, depth: int, sizes=None, families=None) -> dict[str, dict]:
    """A DEQ run's controls, each evaluated on `sizes` and `families` (None: the evaluation's)
    at the budget rule: its untrained model (the run's initialisation), the layer at the exact
    parameters (an attention step's; a records step's are its untrained model's), and its
    trained step tied and run `depth` times."""
    untrained = train.initial_model(graphs.GraphTask, config)
    models = {"untrained": untrained, "exact parameters": exact(untrained)}
    if models["exact parameters"] is untrained:  # a records step: the same model
        del models["exact parameters"]
    models[f"tied x{depth}"] = graphs.tied_twin(deq, depth)
    out = {}
    for name, model in models.items():
        rows = graphs.evaluate_sizes(
            model, config, None, sizes=sizes, sweep=False, families=families
        )
        out[name] = dict(
            accuracy={f"{r['family']}@{r['n']}": r["at_rule"]["accuracy"] for r in rows},
            unresolved={f"{r['family']}@{r['n']}": r["at_rule"]["unresolved"] for r in rows},
            by_distance=graphs.distance_table(rows),
        )
    return out


def by_weights(model, algorithm: str, sizes: dict[int, int], quick: bool) -> list[dict]:
    """The DEQ `model` on every weight distribution (`_generators.DISTRIBUTIONS`) and family
    (the task's and `_generators.MORE`) at `sizes`: the share of right parents, of unresolved
    ones, of converged solves, and the most steps."""
    families = [*graphs.WEIGHTED_FAMILIES]
    if _generators.available():
        families += list(_generators.MORE)
    names = list(_generators.DISTRIBUTIONS)
    if quick:
        families, names = families[:2], names[:2]
    rows = []
    for n, count in sizes.items():
        for f, family in enumerate(families):
            base = _generators.sample(family, n, count, seed=5000 + 10 * n + f)
            for d, name in enumerate(names):
                g = _generators.reweighted(base, name, seed=d)
                out = graphs.predict(model, g.graph, g.source)
                right = graphs.score_parents(g, out.parent, algorithm)
                rows.append(
                    dict(family=family, n=n, distribution=name, accuracy=float(right.mean()),
                         unresolved=float((out.parent < 0).mean()),
                         converged=float(out.converged.mean()), steps=int(out.steps.max()))
                )  # fmt: skip
    return rows


def _parents_right(model, g, algorithm: str) -> np.ndarray:
    """Per node: a valid parent (and so reachability right)."""
    out = graphs.predict(model, g.graph, g.source)
    return graphs.score_parents(g, out.parent, algorithm)


def generated(model, algorithm: str, quick: bool) -> list[dict]:
    """Per networkx generator and size, and per real graph: the share of nodes answered right
    at the budget rule (`graphs.predict`'s default)."""
    sets = []
    for n, count in ({64: 16} if quick else {64: 16, 1024: 2}).items():
        for name in _generators.GENERATORS[:2] if quick else _generators.GENERATORS:
            sets.append((name, n, _generators.draw(name, n, count, seed=n)))
    for name in _generators.REAL[:1] if quick else _generators.REAL:
        g = _generators.draw(name, 0, 16, seed=1)
        sets.append((name, g.graph.num_nodes, g))
        if graphs.ALGORITHMS[algorithm].weighted and name != "Florentine families":
            own = _generators.own_weights(name, 16, seed=1)
            sets.append((f"{name} (own weights)", g.graph.num_nodes, own))
    if not quick and _generators.available_large():
        sets += [(name, 0, _generators.large(name, 2, seed=1)) for name in _generators.LARGE]
    return [
        dict(family=name, n=n or g.graph.num_nodes,
             accuracy=float(_parents_right(model, g, algorithm).mean()))
        for name, n, g in sets
    ]  # fmt: skip


@eqx.filter_jit
def _solve(model, inputs, budget, z0):
    """Parents' scores and fixed points of a batch, the solves starting from the states `z0`."""
    p = jax.vmap(lambda x, z: model.predict(x, budget=budget, z0=z))(inputs, z0)
    return p.logits, p.converged, p.fixed_point


def _independence(model, g, budget) -> tuple[float, float]:
    """The fixed point from `STARTS` random starts (normal, the state's scale; its flags too)
    against the one from zeros: the lowest share of nodes whose parents agree, and the lowest
    asymptotic alignment (Anil et al. 2022: the cosine of the two states, each graph's
    flattened, the mean over graphs)."""
    count, n = g.source.shape[0], g.graph.num_nodes
    inputs = (g.graph, jnp.arange(n) == jnp.asarray(g.source)[:, None])
    width = model.layer.step.width
    zeros = nn.GraphState(jnp.zeros((count, n, width)), jnp.zeros((count, n)))

    def answer(z0):
        scores, converged, z = jax.device_get(_solve(model, inputs, jnp.asarray(budget), z0))
        parent = graphs.choose_parents(scores, g.graph, g.source, np.asarray(converged))
        return parent, np.concatenate([z.values.reshape(count, -1), z.flag], axis=1)

    parent, z = answer(zeros)
    agree, align = [], []
    for start in range(STARTS):
        k1, k2 = jax.random.split(jax.random.key(100 + start))
        z0 = nn.GraphState(
            jax.random.normal(k1, zeros.values.shape), jax.random.normal(k2, zeros.flag.shape)
        )
        p2, z2 = answer(z0)
        agree.append(float((p2 == parent).mean()))
        norms = np.linalg.norm(z, axis=-1) * np.linalg.norm(z2, axis=-1)
        align.append(float(((z * z2).sum(-1) / np.maximum(norms, 1e-12)).mean()))
    return min(agree), min(align)


def dynamics(model, algorithm: str, sizes: dict[int, int], families) -> list[dict]:
    """Per family of `families` and size (up to 256 nodes): the share of valid parents at the budget rule and
    at four times it with the stopping test off, solver steps against hops from the source
    (the depth), and path independence from random starts."""
    unstopped = eqx.tree_at(
        lambda m: m.layer.solver,
        model,
        Picard(rtol=1e-30, atol=0.0, max_steps=4096, elementwise=True),
    )
    rows = []
    for n, count in sizes.items():
        if n > 256:
            continue
        for family in families:
            g = graphs.sample_weighted(family, n, count, seed=2000 + n)
            rule = graphs.budget_for(n)
            at_rule = graphs.predict(model, g.graph, g.source, budget=rule)
            long = graphs.predict(unstopped, g.graph, g.source, budget=4 * rule)
            agree, align = _independence(model, g, rule)
            rows.append(
                dict(
                    family=family,
                    n=n,
                    depth=graphs.hops(g).max(-1).tolist(),
                    steps=at_rule.steps.tolist(),
                    converged=float(at_rule.converged.mean()),
                    accuracy=float(graphs.score_parents(g, at_rule.parent, algorithm).mean()),
                    accuracy_4x_unstopped=float(
                        graphs.score_parents(g, long.parent, algorithm).mean()
                    ),
                    agreement_random_starts=agree,
                    asymptotic_alignment=align,
                )
            )
    return rows
