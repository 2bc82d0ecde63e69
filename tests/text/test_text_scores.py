"""The text task's scores: the test figure of a DEQ is scored through its equilibrium cache, so no
prediction reads a later byte (checked by changing later bytes), and it agrees with the joint
solve where both are exact (a tight tolerance; an explicit model, whose two paths are the same
arithmetic)."""

import jax
import numpy as np
import pytest

import eqattn
from eqattn import text
from eqattn.text._scores import bits_per_byte, cached_bits_per_byte, reported_bits_per_byte

CONTEXT = 16


def _model(kind: str, rtol: float = 1e-2):
    kw = dict(vocab_size=text.BYTES + 1, max_len=CONTEXT, pooling="none", causal=True)
    if kind == "explicit":
        return eqattn.nn.Transformer(text.BYTES, 16, 2, 2, key=jax.random.key(0), **kw)
    solver = eqattn.Anderson(rtol=rtol, atol=rtol * 1e-3, max_steps=60)  # the text default's kind
    return eqattn.nn.DEQTransformer(
        text.BYTES, 16, 2, key=jax.random.key(1), solver=solver, stem_depth=1, **kw
    )


def _windows() -> text.Windows:
    """Windows of documents longer and shorter than the context: first windows (every byte
    scored) and later ones (their first half context only)."""
    rng = np.random.default_rng(0)
    docs = [rng.integers(97, 123, n).astype(np.uint8) for n in (5, 40, 23, 70)]
    return text.evaluation_windows(docs, CONTEXT)


def test_the_cache_path_reads_no_later_byte():
    model, w = _model("deq"), _windows()
    later = w.weights[:, : CONTEXT // 2].sum(1) == 0  # windows whose first half is context
    assert later.any() and (~later).any()
    # score only positions 8-11 of the later windows; then change every input from 12 on
    weights = np.zeros_like(w.weights)
    weights[later, 8:12] = 1.0
    scored = text.Windows(w.inputs, w.targets, weights)
    changed = w.inputs.copy()
    changed[:, 12:] = (changed[:, 12:] + 7) % text.BYTES
    moved = text.Windows(changed, w.targets, weights)
    before, after = (cached_bits_per_byte(model, x)["bits_per_byte"] for x in (scored, moved))
    assert after == pytest.approx(before, abs=1e-12)
    # the same change moves the scores of the bytes it precedes
    weights[later, 8:] = 1.0
    touched = [
        cached_bits_per_byte(model, text.Windows(x, w.targets, weights))
        for x in (w.inputs, changed)
    ]
    assert abs(touched[0]["bits_per_byte"] - touched[1]["bits_per_byte"]) > 1e-3


@pytest.mark.parametrize("kind", ["explicit", "deq"])
def test_the_cache_path_agrees_with_the_joint_solve_where_both_are_exact(kind):
    model, w = _model(kind, rtol=1e-10), _windows()
    cached, joint = cached_bits_per_byte(model, w), bits_per_byte(model, w)
    assert cached["scored_bytes"] == joint["scored_bytes"] == int(w.weights.sum())
    assert cached["bits_per_byte"] == pytest.approx(joint["bits_per_byte"], abs=1e-7)
    assert cached["converged"] == 1.0
    # and the figure eqattn train and evaluate report is the exactly causal one
    reported = reported_bits_per_byte(model, w)["bits_per_byte"]
    exact = cached if kind == "deq" else joint
    assert reported == exact["bits_per_byte"]
