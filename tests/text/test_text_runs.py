"""`eqattn train --task text`, `eqattn evaluate` and `eqattn generate` on a text run, as a user
runs them (in this process), checked against the model's own forward pass and an
uninterrupted run."""

import dataclasses
import json
import math
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqattn.train
from eqattn import text
from eqattn.cli import main
from eqattn.train import RunError, _trainer as trainer_module, read_header

pytestmark = pytest.mark.float32
CONTEXT = 16
TINY = [
    "--task",
    "text",
    "--model",
    "deq",
    "--context",
    str(CONTEXT),
    "--epochs",
    "2",
    "--epoch-steps",
    "2",
    "--batch-size",
    "4",
    "--dim",
    "8",
    "--heads",
    "2",
    "--no-progress",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """60 short documents (each shorter than the context, so one window scores it whole)."""
    folder = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    words = ["def", "x", "=", "(", ")", ":", "return", "1", "+", "\n"]
    for i in range(60):
        doc = " ".join(rng.choice(words, rng.integers(2, 5)))[: CONTEXT - 1]
        (folder / f"doc{i:02}.py").write_text(doc)
    return folder


def _bits_by_hand(model, documents) -> float:
    """Bits per byte of whole documents, each read after START by the model's forward pass
    (padded to the context: a causal model's positions do not see the padding after them)."""
    forward = eqx.filter_jit(lambda x: jax.nn.log_softmax(model(x), axis=-1))
    bits, count = 0.0, 0
    for doc in documents:
        inputs = np.zeros(CONTEXT, np.int32)
        inputs[: len(doc)] = np.concatenate([[text.START], doc[:-1]])
        logp = np.asarray(forward(jnp.asarray(inputs)))
        bits -= float(np.sum(logp[np.arange(len(doc)), doc])) / math.log(2)
        count += len(doc)
    return bits / count


def test_text_run_and_its_evaluation(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    # a DEQ whose map is a cell of two blocks (the digits' and the other text runs have one),
    # after the text default's explicit stem block
    argv = ["train", *TINY, "--text", str(corpus), "--out", str(out), "--jacobian-weight", "1"]
    assert main([*argv, "--cell-depth", "2"]) == 0
    printed = capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text())
    for h in metrics["history"]:  # the loss holds the Jacobian penalty beyond the bits
        assert h["loss"] > h["train_bits_per_byte"] * math.log(2) + 1e-3
    loaded = text.load_corpus([corpus])
    assert metrics["corpus"] == loaded.info and metrics["task"] == "text"
    assert metrics["test_scored_bytes"] == loaded.info["bytes"]["test"]
    assert metrics["evaluation"]["context"] == CONTEXT and metrics["evaluation"]["stride"] == 8
    model = text.load_model(out)
    assert model.block.depth == 2 and len(model.stem) == 1 and model.block.attend_input
    shape = {"dim": 8, "cell_depth": 2, "stem_depth": 1, "attend_input": True}
    assert metrics["model_shape"] == shape
    assert metrics["config"] == read_header(out)[1]["config"]  # every setting, recorded
    expected = _bits_by_hand(model, loaded.test)
    assert metrics["test_bits_per_byte"] == pytest.approx(expected, rel=1e-4)
    assert f"test {metrics['test_bits_per_byte']:.3f} bits per byte" in printed
    assert (
        main(
            [
                "evaluate",
                "--checkpoint",
                str(out),
                "--steps",
                "2,30",
                "--json",
                str(tmp_path / "e.json"),
            ]
        )
        == 0
    )
    evaluated = json.loads((tmp_path / "e.json").read_text())
    assert evaluated["test_bits_per_byte"] == pytest.approx(expected, rel=1e-4)
    assert [row["max_steps"] for row in evaluated["budget_sweep"]][0] == 2
    # the settings of the text task alone are recorded
    assert not {"tokens", "shift", "train_size", "warm_start"} & set(metrics["config"])
    # the best validated epoch's model, kept beside the last
    scores = [h["validation_bits_per_byte"] for h in metrics["history"]]
    _, best = read_header(out / "best.eqx")
    assert best["epoch"] == 1 + scores.index(min(scores)) and "resume" not in best
    assert best["validation_bits_per_byte"] == min(scores)
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(out), "--best", "--steps", "30"]) == 0
    assert "bits per byte" in capsys.readouterr().out


def test_text_resume_after_ctrl_c_matches_an_uninterrupted_run(
    corpus, tmp_path, capsys, monkeypatch
):
    """Ctrl-C in the second epoch, then `--resume`: the same model and history as a run never
    stopped (the explicit model; the run directory's code is the digits')."""
    args = [*TINY, "--model", "explicit", "--text", str(corpus)]
    assert main(["train", *args, "--out", str(tmp_path / "ref")]) == 0

    def interrupt(name):
        if name == "step:2:1":
            raise KeyboardInterrupt

    monkeypatch.setattr(trainer_module, "failpoint", interrupt)
    assert main(["train", *args, "--out", str(tmp_path / "cut")]) == 130
    assert "--resume --out" in capsys.readouterr().err
    stopped = json.loads((tmp_path / "cut" / "metrics.json").read_text())
    # Ctrl-C ends promptly: the whole test split is scored when a run is done, not here
    assert stopped["status"] == "interrupted" and "test_bits_per_byte" not in stopped
    monkeypatch.undo()
    assert main(["train", "--resume", "--out", str(tmp_path / "cut")]) == 0
    ref, cut = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("ref", "cut"))
    assert ref["model_shape"]["depth"] == 4 and ref["model_shape"]["width"] % 2 == 0
    # the run records the shape it built, so its checkpoint rebuilds it whatever the rule
    recorded = {k: ref["config"][k] for k in ("width", "mlp_ratio")}
    assert recorded == {k: ref["model_shape"][k] for k in ("width", "mlp_ratio")}
    assert cut["status"] == "done" and cut["epochs_done"] == 2
    assert [h["loss"] for h in cut["history"]] == [h["loss"] for h in ref["history"]]
    assert cut["test_bits_per_byte"] == ref["test_bits_per_byte"]
    # the finished run generates, streaming what text.generate gives from its loaded model
    capsys.readouterr()
    argv = ["generate", "--checkpoint", str(tmp_path / "cut"), "--prompt", "def"]
    assert main([*argv, "--tokens", "6", "--temperature", "0"]) == 0
    greedy = text.generate(text.load_model(tmp_path / "cut"), "def", 6, temperature=0.0).text
    assert capsys.readouterr().out == "def" + greedy.decode("utf-8", errors="replace") + "\n"


def test_text_refusals_are_one_line(corpus, tmp_path, capsys):
    def refused(*argv):
        code = main(["train", *argv, "--out", str(tmp_path / "x")])
        return code, capsys.readouterr().err.strip()

    (tmp_path / "empty").mkdir()
    (tmp_path / "small.txt").write_text("tiny")
    for argv, code, message in [
        ([*TINY, "--context", "1"], 2, "--context must be >= 2"),
        ([*TINY, "--text", str(tmp_path / "empty")], 2, "the corpus has no text"),
        ([*TINY, "--text", str(tmp_path / "small.txt")], 2, "too small to split"),
        ([*TINY, "--text", str(tmp_path / "nope")], 2, "no such file or folder"),
    ]:
        got, line = refused(*argv)
        assert got == code and message in line and "\n" not in line, (argv, line)
    # an explicit baseline that cannot match the DEQ's parameters: refused before its directory
    argv = [*TINY, "--text", str(corpus), "--model", "explicit", "--heads", "4", "--depth", "6"]
    assert main(["train", *argv, "--out", str(tmp_path / "unmatched")]) == 2
    line = capsys.readouterr().err.strip()
    assert "no explicit model of --depth 6 comes within 5% of the DEQ's" in line, line
    assert "\n" not in line and not (tmp_path / "unmatched").exists()
    config = eqattn.digits.DigitsConfig(dim=8, heads=2, epochs=1, train_size=8, batch_size=8)
    eqattn.train.train(eqattn.digits.DigitsTask(config), tmp_path / "digits", progress=False)
    assert main(["generate", "--checkpoint", str(tmp_path / "digits"), "--prompt", "a"]) == 1
    assert "holds a digits model, not a language model" in capsys.readouterr().err
    with pytest.raises(RunError, match="holds a digits model, not a text model"):
        text.load_model(tmp_path / "digits")


@pytest.mark.parametrize(
    "dim, heads, context, depth, stem",
    [
        (64, 4, 256, 4, 0),
        (32, 2, 1024, 4, 0),
        (96, 4, 128, 4, 0),
        (52, 4, 256, 4, 1),  # the command's defaults
        # explicit models that need a width above --dim or an MLP ratio outside 1 to 4 (their
        # shape was 17%, 10% and 7% short of the DEQ's parameters before either was searched)
        (64, 4, 256, 1, 1),
        (16, 2, 32, 1, 1),
        (8, 2, 16, 4, 1),  # the tests' tiny setting
    ],
)
def test_explicit_text_model_has_the_deqs_parameters_within_5_percent(
    dim, heads, context, depth, stem
):
    """Every parameter counted (embeddings, positions and read-out included), from the leaves
    of the models as built (their shapes: nothing is initialised)."""
    from ..reference import built_model as built, parameter_count as count

    config = text.TextConfig(dim=dim, heads=heads, context=context, depth=depth, stem_depth=stem)
    deq = count(built(text.TextTask, config))
    # the embeddings (symbols, positions) and the read-out at least
    assert deq > (2 * text.BYTES + 1 + context) * dim
    explicit = built(text.TextTask, dataclasses.replace(config, model="explicit"))
    assert len(explicit.blocks) == config.depth
    assert abs(count(explicit) - deq) <= 0.05 * deq


@pytest.mark.parametrize(
    "task", ["graphs", "generic-graphs", "digits", "text", "prefix-sums", "mazes"]
)
def test_the_command_trains_the_python_configuration(monkeypatch, tmp_path, task):
    """`eqattn train --task TASK` trains with the task's configuration as Python builds it,
    defaults and changed fields alike, for either model; so do the text benchmark's candidate
    DEQ settings and the command lines that name them."""
    from benchmarks.text import CANDIDATES, _case
    from eqattn.cli._parser import TASKS

    seen = []

    def fake_train(task, out, **kwargs):
        seen.append(task.config)
        raise RunError("stop here")

    monkeypatch.setattr(eqattn.train, "train", fake_train)
    config_type = TASKS[task].config_type
    changed = {"text": (["--context", "64"], dict(context=64))}.get(task, ([], {}))
    corpus = [] if task != "text" else ["--text", str(tmp_path / "corpus")]
    (tmp_path / "corpus").mkdir()
    for i in range(40):
        (tmp_path / "corpus" / f"{i}.txt").write_text(f"document {i}\n" * 50)
    for model in ("deq", "explicit"):
        cases = [([], {}), (["--lr", "0.02", *changed[0]], dict(lr=0.02, **changed[1]))]
        if task == "text" and model == "deq":
            cases += [(_case(fields).split(), fields) for fields in CANDIDATES]
        for argv, fields in cases:
            command = ["train", "--task", task, "--model", model, "--out", str(tmp_path), *argv]
            assert main([*command, *corpus]) == 1
            text_paths = {"text": (str(tmp_path / "corpus"),)} if task == "text" else {}
            assert seen.pop() == config_type(model=model, **fields, **text_paths)
    with pytest.raises(TypeError, match="contxt"):
        config_type(contxt=64)


def test_a_long_context_step_differentiates_in_chunks_and_the_penalty_probes_a_share():
    """The text step sums its gradient over chunks of windows (`TOKENS_PER_GRADIENT` tokens at
    a time): the same loss, statistics and SGD update as the whole batch at once, with the
    compiled memory of a chunk. `jacobian_share` 0.5 probes the batch's first two windows of
    four: its update differs from the full penalty's by the weight times mean(g_0..g_3) -
    mean(g_0, g_1), with the windows' penalty gradients g_i computed here from the model's public
    `jacobian_penalty`."""
    import equinox as eqx
    import optax

    from eqattn.text._task import make_text_train_step, windows_per_chunk

    assert [windows_per_chunk(16, c) for c in (256, 1024, 4096, 8192)] == [16, 4, 1, 1]
    assert windows_per_chunk(6, 1024) == 3  # a divisor of the batch
    config = text.TextConfig(context=CONTEXT, dim=8, heads=2)
    model = text.TextTask.build_model(config, jax.random.key(0))
    optimizer = optax.sgd(1.0)  # the update is minus the gradient
    params = lambda m: eqx.filter(m, eqx.is_inexact_array)  # noqa: E731
    state = optimizer.init(params(model))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.integers(0, 256, (4, CONTEXT)), jnp.int32)
    labels = (jnp.asarray(rng.integers(0, 256, x.shape)), jnp.asarray(rng.random(x.shape) < 0.8))
    args = (model, state, x, (labels[0], labels[1].astype(jnp.float32)), jax.random.key(1), None)
    runs, memory = {}, {}
    for name, tokens, share in [
        ("whole", 4 * CONTEXT, 1.0),  # the batch at once
        ("chunked", CONTEXT, 1.0),  # one window at a time
        ("half probed", 4 * CONTEXT, 0.5),
    ]:
        shared = dataclasses.replace(config, jacobian_share=share)
        step = eqx.filter_jit(make_text_train_step(shared, optimizer, tokens))
        compiled = step.lower(*args).compile()  # once, for its memory and its run
        memory[name] = compiled.compiled.memory_analysis().temp_size_in_bytes
        runs[name] = compiled(*args)
    whole, chunked = runs["whole"], runs["chunked"]
    assert memory["chunked"] < 0.6 * memory["whole"]
    np.testing.assert_allclose(chunked[2], whole[2], rtol=1e-5)
    np.testing.assert_allclose(chunked[3], whole[3], rtol=1e-5)
    leaves = {name: jax.tree.leaves(params(run[0])) for name, run in runs.items()}
    for a, b in zip(leaves["chunked"], leaves["whole"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)

    keys = jax.random.split(jax.random.key(1), (2, 4))  # the step's dropout and probe keys

    @eqx.filter_jit
    def penalty_grads(model):
        def one(xi, ki, pk):
            z = model.predict(xi, budget=config.training_budget, key=ki).fixed_point
            grad = eqx.filter_grad(lambda m: m.jacobian_penalty(xi, z, key=ki, probe_key=pk))
            return params(grad(model))

        return jax.vmap(one)(x, keys[0], keys[1])

    g = jax.tree.leaves(penalty_grads(model))
    weight = config.jacobian_weight
    assert max(float(jnp.max(jnp.abs(weight * gi))) for gi in g) > 1e-3  # the penalty counts
    # (float32 parameters: an update is a difference of numbers of order 1)
    for half, full, gi in zip(leaves["half probed"], leaves["whole"], g, strict=True):
        expected = full + weight * (gi.mean(0) - gi[:2].mean(0))
        np.testing.assert_allclose(half, expected, rtol=1e-4, atol=2e-6)
