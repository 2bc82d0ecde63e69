"""The mazes models read each maze's own graph: a batch's loss, scores and solves against the
mazes answered one by one (float64 numpy for the cross-entropy and the residual test). That the
recipe learns is measured by `eqattn train --task mazes` and the `reasoning_mazes` suite, not
here: it needs minutes of training."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import logsumexp

from eqattn import Picard, mazes, nn


def test_a_batch_is_each_maze_answered_on_its_own_graph():
    batch = mazes.draw_mazes(np.random.default_rng(0), 3, 4)
    twin = mazes.explicit(8, 2, depth=3, key=jax.random.key(1))
    one = [mazes.maze_graph(p, 4) for p in batch.passages]
    out = np.stack([np.asarray(twin.predict(c, g).logits) for c, g in zip(batch.inputs, one)])
    t = batch.targets
    want = np.mean(logsumexp(out, -1) - np.take_along_axis(out, t[..., None], -1)[..., 0])
    got, (solved, *_) = mazes.loss(twin, batch, jax.random.key(2))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert solved == np.mean(np.all(out.argmax(-1) == t, -1))
    # the DEQ solved: each maze as its own solve from zeros answers, within the budget
    deq = mazes.deq(8, 2, key=jax.random.key(0), solver=Picard(rtol=1e-10, max_steps=300))
    alone = [deq.predict(c, g) for c, g in zip(batch.inputs, one)]
    cells = np.mean([np.mean(np.argmax(p.logits, -1) == y) for p, y in zip(alone, t)])
    score = mazes.score(deq, batch, budget=300)
    assert score["cells"] == pytest.approx(cells) and score["converged"] == 1.0
    assert score["steps"] == pytest.approx(np.mean([int(p.steps) for p in alone]))
    # every parameter takes a gradient through the steps after the partial solve
    grads = eqx.filter_grad(lambda m: mazes.loss(m, batch, jax.random.key(3), steps=3)[0])(deq)
    leaves = jax.tree.leaves(eqx.filter(grads, eqx.is_array))
    assert all(np.isfinite(g).all() for g in leaves) and all(np.abs(g).max() > 0 for g in leaves)


def test_scores_after_counts_of_steps_come_from_one_run_continued():
    """`score_steps` against the step run each count of times from zeros, maze by maze (the
    tied control's path), its `converged` against the relative residual in float64 numpy."""
    batch = mazes.draw_mazes(np.random.default_rng(3), 3, 4)
    deq = mazes.deq(8, 2, key=jax.random.key(0), solver=Picard(rtol=1e-3))
    one = [mazes.maze_graph(p, 4) for p in batch.passages]
    counts = [2, 5, 30]
    rows = mazes.score_steps(deq, batch, counts=counts)
    unrolled = eqx.filter_jit(lambda c, g, n, z0=None: deq.unrolled(c, g, n, z0=z0))
    for count, row in zip(counts, rows):
        alone = [unrolled(c, g, jnp.int32(count)) for c, g in zip(batch.inputs, one)]
        right = [np.argmax(logits, -1) == y for (logits, _), y in zip(alone, batch.targets)]
        assert row["steps"] == count and row["cells"] == pytest.approx(np.mean(right))
        assert row["mazes"] == pytest.approx(np.mean([r.all() for r in right]))
        z = [np.asarray(z, np.float64) for _, z in alone]
        fz = [np.asarray(unrolled(c, g, jnp.int32(1), zi)[1], np.float64)
              for c, g, zi in zip(batch.inputs, one, z)]  # fmt: skip
        ratio = [np.linalg.norm(f - zi) / np.linalg.norm(f) for f, zi in zip(fz, z)]
        assert row["converged"] == pytest.approx(np.mean(np.array(ratio) <= 1e-3))
    assert rows[0]["converged"] < rows[-1]["converged"] == 1.0  # both branches of the test
    with pytest.raises(ValueError, match=r"`counts` must be increasing ints >= 0; got \[5, 5\]"):
        mazes.score_steps(deq, batch, counts=[5, 5])
    with pytest.raises(TypeError, match="explicit"):
        mazes.score_steps(mazes.explicit(8, 2, depth=2, key=jax.random.key(1)), batch, counts=[1])


@pytest.mark.bad_input
def test_the_model_reads_the_mazes_sides_and_answers_two_logits():
    model = mazes.deq(8, 2, key=jax.random.key(0))
    assert isinstance(model, nn.GraphReasoner) and model.shape == mazes.SHAPE
    assert model.shape["edge_features"] == len(mazes.EDGE_KINDS) == 5
    twin = nn.GraphReasoner.matched(model, depth=4, key=jax.random.key(1))
    assert twin.shape == mazes.SHAPE and len(twin.core.steps) == 4
    assert mazes.reach(9) == 44 and mazes.budget_for(59) == 4 * 59 * 59 + 100
    batch = mazes.draw_mazes(np.random.default_rng(0), 1, 3)
    with pytest.raises(ValueError, match=r"`inputs` must be one graph's node categories"):
        model.predict(jnp.asarray(batch.inputs), mazes.maze_graph(batch.passages[0], 3))
