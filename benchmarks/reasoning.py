"""`reasoning`: the generic equilibrium layer on a reasoning task, trained small and asked far
larger: prefix sums (`eqattn.prefix_sums`, a bit string's running parity), with every control.

Per seed (0 to 2): the DEQ (`PrefixSumsModel.deq`, 32 channels, 4 heads: one
`nn.ImplicitGraphTransformer` over the string's chain) trained by `prefix_sums.fit` (2000 steps
of 32 strings, 8 to 32 bits, the lengths in turn) and its explicit twin of equal parameters
(`PrefixSumsModel.matched`: 36 untied steps, as many as the DEQ's training runs on 32 bits,
trained alike); then on 64 fresh strings of each of 32, 64, 128, 256 and 512 bits, the share of
strings with every bit right (and of bits) of:

- the DEQ solved to its fixed point within 4 n + 100 steps (its steps and convergence);
- the untrained DEQ, solved alike (what the layer answers before training);
- the DEQ's trained step, tied and run 36 times (as in training; the fair control of the twin);
- the DEQ with 4 x the budget and the stopping test off (overthinking must not cost);
- the explicit twin;
- path independence: the DEQ's answers and fixed points from three random starts against the
  start from zeros (`prefix_sums.path_independence`).

And at the largest size, the DEQ's strings right against its step budget (the stopping test off
below the budget's end: accuracy against solver steps). The target (issue's): >= 99% of 512-bit
strings, the DEQ >= 20 points above its twin there.

`--quick`: 8 channels, 2 heads, 20 steps on strings of 4 bits, 8 strings of 12 bits, one seed,
a twin of 8 steps: it exercises the code only.
"""

from __future__ import annotations

import statistics
import time

import jax
import numpy as np

from eqattn import Picard, prefix_sums

from ._harness import markdown_table, print_table

SEEDS = (0, 1, 2)
FULL = dict(dim=32, heads=4, steps=2000, lengths=(8, 16, 24, 32), sizes=(32, 64, 128, 256, 512),
            strings=64, budgets=(128, 256, 512, 1024, 2048))  # fmt: skip
QUICK = dict(dim=8, heads=2, steps=20, lengths=(4,), sizes=(12,), strings=8, budgets=(4, 16))


def budget_for(n: int) -> int:
    """The solve's step budget on strings of `n` bits."""
    return 4 * n + 100


def _unstopped(model, steps: int):
    """`model` solving exactly `steps` steps (a stopping test only an exact fixed point
    passes)."""
    return model.with_solver(Picard(rtol=1e-30, atol=0.0, max_steps=steps))


def _sizes(seed: int, s: dict, deq, untrained, twin, depth: int) -> list[dict]:
    rows = []
    for n in s["sizes"]:
        bits = prefix_sums.draw_bits(np.random.default_rng(10_000 + n), s["strings"], n)
        targets, budget = prefix_sums.prefix_parity(bits), budget_for(n)
        cases = {
            "deq": prefix_sums.score(deq, bits, targets, budget=budget),
            "untrained": prefix_sums.score(untrained, bits, targets, budget=budget),
            f"tied x{depth}": prefix_sums.score(deq, bits, targets, steps=depth),
            "4x budget, no stop": prefix_sums.score(
                _unstopped(deq, 4 * budget), bits, targets, budget=4 * budget
            ),
            "explicit twin": prefix_sums.score(twin, bits, targets),
        }
        rows += [dict(part="size", case=c, seed=seed, n=n, **r) for c, r in cases.items()]
        paths = prefix_sums.path_independence(deq, bits, key=jax.random.key(seed), budget=budget)
        rows.append(dict(part="paths", seed=seed, n=n, **paths))
    n = max(s["sizes"])
    bits = prefix_sums.draw_bits(np.random.default_rng(10_000 + n), s["strings"], n)
    unstopped = _unstopped(deq, max(s["budgets"]))  # one program, the budget its argument
    for steps in s["budgets"]:
        r = prefix_sums.score(unstopped, bits, prefix_sums.prefix_parity(bits), budget=steps)
        rows.append(dict(part="budget", seed=seed, n=n, budget=steps, **r))
    return rows


def _seed(seed: int, s: dict) -> list[dict]:
    """One seed's training runs and scores."""
    key = jax.random.key(seed)
    untrained = prefix_sums.PrefixSumsModel.deq(s["dim"], s["heads"], key=key)
    depth = max(s["lengths"]) + prefix_sums.EXTRA_STEPS
    twin0 = prefix_sums.PrefixSumsModel.matched(
        untrained, depth=depth, key=jax.random.key(seed + 100)
    )
    rows, trained = [], {}
    for name, model in (("deq", untrained), ("explicit twin", twin0)):
        t0 = time.perf_counter()
        fit = dict(steps=s["steps"], lengths=s["lengths"], seed=seed)
        trained[name], losses = prefix_sums.fit(model, **fit)
        step = model.core.step if model.is_deq else model.core.steps[0]
        rows.append(
            dict(part="run", case=name, seed=seed, train_s=time.perf_counter() - t0,
                 params=sum(x.size for x in jax.tree.leaves(model) if isinstance(x, jax.Array)),
                 dim=step.dim, heads=step.num_heads, hidden=step.mlp.width_size,
                 depth=1 if model.is_deq else depth, final_loss=float(np.mean(losses[-40:])))
        )  # fmt: skip
        jax.clear_caches()
    return rows + _sizes(seed, s, trained["deq"], untrained, trained["explicit twin"], depth)


def run(quick: bool = False) -> tuple[list[dict], dict]:
    settings = QUICK if quick else FULL
    rows = []
    for seed in (0,) if quick else SEEDS:
        rows += _seed(seed, settings)
        jax.clear_caches()
    _print(rows)
    meta = {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()}
    return rows, {"settings": meta, "seeds": [0] if quick else list(SEEDS)}


def _median(values) -> float:
    return statistics.median(values) if values else float("nan")


def _by_case(rows) -> dict[str, dict[int, list[dict]]]:
    out: dict[str, dict[int, list[dict]]] = {}
    for r in rows:
        if r["part"] == "size":
            out.setdefault(r["case"], {}).setdefault(r["n"], []).append(r)
    return out


def _cell(rs: list[dict]) -> str:
    """Strings right: the median over the seeds (min-max), as percentages."""
    values = [r["strings"] for r in rs]
    low, mid, high = min(values), _median(values), max(values)
    if low == high:
        return f"{100 * mid:.2f}%"
    return f"{100 * mid:.2f}% ({100 * low:.2f}-{100 * high:.2f})"


def _print(rows) -> None:
    for case, by_n in _by_case(rows).items():
        print(f"\nprefix sums, {case}: strings right (median over seeds)")
        table = [{"n": n, "acc": _median([r["strings"] for r in rs])} for n, rs in by_n.items()]
        print_table(table, [("n", "bits", "d"), ("acc", "strings", ".4f")])


def table(payload) -> str:
    """Strings right per case and size (median over the seeds, min-max), the DEQ's solver
    steps and convergence, path independence, accuracy against the step budget, the runs."""
    rows = payload["rows"]
    by_case = _by_case(rows)
    sizes = sorted({n for by_n in by_case.values() for n in by_n})
    body = [[case, *[_cell(by_n[n]) if n in by_n else "-" for n in sizes]]
            for case, by_n in by_case.items()]  # fmt: skip
    out = markdown_table(["prefix sums: strings right", *[f"{n} bits" for n in sizes]], body)
    deq = by_case.get("deq", {})
    paths = [r for r in rows if r["part"] == "paths"]
    body = [
        [f"{n}", f"{_median([r['steps'] for r in deq[n]]):.0f}",
         f"{100 * min(r['converged'] for r in deq[n]):.1f}%",
         f"{100 * min(r['agree'] for r in paths if r['n'] == n):.2f}%",
         f"{min(r['alignment'] for r in paths if r['n'] == n):.4f}"]
        for n in sizes if n in deq
    ]  # fmt: skip
    header = ["DEQ: bits", "solver steps (median)", "converged (lowest)",
              "random starts agree (lowest)", "alignment (lowest)"]  # fmt: skip
    out += "\n\n" + markdown_table(header, body)
    budget = [r for r in rows if r["part"] == "budget"]
    if budget:
        steps = sorted({r["budget"] for r in budget})
        n = budget[0]["n"]
        cells = [_cell([r for r in budget if r["budget"] == b]) for b in steps]
        out += "\n\n" + markdown_table([f"DEQ at {n} bits: steps", *map(str, steps)],
                                       [["strings right", *cells]])  # fmt: skip
    runs = [r for r in rows if r["part"] == "run"]
    body = [
        [c, f"{rs[0]['params']:,}", f"{rs[0]['dim']} x {rs[0]['heads']} heads, MLP {rs[0]['hidden']}",
         f"{rs[0]['depth']}", f"{_median([r['train_s'] for r in rs]):.0f}",
         f"{_median([r['final_loss'] for r in rs]):.4f}"]
        for c in dict.fromkeys(r["case"] for r in runs)
        for rs in [[r for r in runs if r["case"] == c]]
    ]  # fmt: skip
    header = ["model", "params", "width", "untied steps", "training s", "final loss"]
    return out + "\n\n" + markdown_table(header, body)
