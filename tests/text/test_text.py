"""Byte-level text: the corpus and its split, the windows of training and evaluation, causal
language models (explicit and implicit) and generation with their caches, each checked against
an independent computation (brute force over bytes, the full forward pass, re-solving the
prefix)."""

import warnings
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqattn
from eqattn import text

TIGHT = 1e-11


def _folder(tmp_path: Path, sizes) -> Path:
    rng = np.random.default_rng(0)
    for i, size in enumerate(sizes):
        (tmp_path / f"f{i}.txt").write_bytes(bytes(rng.integers(32, 127, size, dtype=np.uint8)))
    return tmp_path


def test_split_is_by_file_deterministic_and_near_the_share(tmp_path):
    sizes = [int(s) for s in np.random.default_rng(1).integers(100, 3000, 120)]
    sizes[7] = 30_000  # one lumpy file, over 5% of the whole
    folder = _folder(tmp_path, sizes)
    (folder / "sub").mkdir()
    (folder / "sub" / "blob.bin").write_bytes(b"\0\1\2" * 10)  # binary: skipped, counted
    (folder / "empty.txt").write_bytes(b"")
    corpus = text.load_corpus([folder])
    info = corpus.info
    total = sum(sizes)
    assert info["files"] == 120 and info["skipped"] == {"binary": 1, "empty": 1, "unreadable": 0}
    assert sum(info["bytes"].values()) == total
    for split in ("validation", "test"):
        assert 0.04 * total < info["bytes"][split] <= 0.05 * total, info["bytes"]
    # every document is one whole file, and the lumpy one is trained on
    files = sorted(p.read_bytes() for p in folder.glob("f*.txt"))
    docs = sorted(bytes(d) for d in (*corpus.train, *corpus.validation, *corpus.test))
    assert docs == files
    assert any(len(d) == 30_000 for d in corpus.train)
    again = text.load_corpus([folder])
    assert again.info == info and all(np.array_equal(a, b) for a, b in zip(again.test, corpus.test))


def test_one_file_is_cut_into_pieces_and_bad_corpora_are_refused(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"x" * 100_000)
    corpus = text.load_corpus([tmp_path / "a.txt"])
    assert corpus.info["bytes"] == {"train": 90_000, "validation": 5_000, "test": 5_000}
    (tmp_path / "tiny.txt").write_bytes(b"abc")
    with pytest.raises(ValueError, match="too small to split"):
        text.load_corpus([tmp_path / "tiny.txt"])
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "x").write_bytes(b"\0" * 10)
    with pytest.raises(ValueError, match=r"no text: 1 file, skipped: 1 binary\."):
        text.load_corpus([tmp_path / "bin"])
    with pytest.raises(FileNotFoundError, match="no such file"):
        text.load_corpus([tmp_path / "missing"])


def test_default_corpus_is_the_standard_library_without_tests():
    files = text.stdlib_files()
    assert len(files) > 100
    parts = {part for f in files for part in f.parts}
    assert not {"test", "tests", "idlelib", "site-packages"} & parts - set(
        Path(files[0]).parents[-1].parts
    )


@pytest.mark.parametrize("context, stride", [(8, 4), (8, 8), (16, 5), (4, 1)])
def test_evaluation_scores_every_byte_once_with_history(context, stride):
    rng = np.random.default_rng(context + stride)
    docs = [rng.integers(0, 256, n).astype(np.uint8) for n in (1, 3, 8, 9, 40, 41)]
    w = text.evaluation_windows(docs, context, stride)
    assert w.inputs.shape == w.targets.shape == w.weights.shape and w.inputs.shape[1] == context
    scored = [t for row_t, row_w in zip(w.targets, w.weights) for t, k in zip(row_t, row_w) if k]
    assert scored == [int(b) for d in docs for b in d]  # every byte once, in order
    # the input before each target is the previous byte (START at a document's start), and each
    # scored byte after a document's first window has at least context - stride bytes before it
    for x, y, k in zip(w.inputs, w.targets, w.weights):
        assert np.array_equal(x[1:][k[1:] > 0], y[:-1][k[1:] > 0])
        first = np.flatnonzero(k)
        if x[0] != text.START and len(first):
            assert first[0] >= context - stride


def test_training_windows_stay_in_one_document():
    docs = [np.full(n, i, np.uint8) for i, n in enumerate((5, 50, 200))]
    w = text.training_batch(docs, np.random.default_rng(0), 64, 16)
    for x, y, k in zip(w.inputs, w.targets, w.weights):
        real = y[k > 0]
        assert len(set(real)) == 1  # one document's bytes
        assert len(real) == (5 if real[0] == 0 else 16)
        assert np.array_equal(x[1 : len(real)], y[: len(real) - 1])


def _models(dtype=jnp.float64):
    """An explicit model, a DEQ and a DEQ with an explicit stem block whose map is a cell of two
    blocks; then the two DEQs again with `attend_input` (their attention reads the injected
    input too: what the text command trains)."""
    kw = dict(vocab_size=11, max_len=12, pooling="none", causal=True, dtype=dtype)
    explicit = eqattn.nn.Transformer(11, 16, 2, 2, key=jax.random.key(0), **kw)
    kw["solver"] = eqattn.Anderson(rtol=TIGHT, atol=TIGHT, max_steps=300)
    deqs = []
    for attend_input in (False, True):
        kw["attend_input"] = attend_input
        deqs.append(eqattn.nn.DEQTransformer(11, 16, 2, key=jax.random.key(1), **kw))
        deqs.append(
            eqattn.nn.DEQTransformer(11, 16, 2, key=jax.random.key(2), depth=2, stem_depth=1, **kw)
        )
    assert len(deqs[1].stem) == 1 and deqs[1].block.depth == 2 and deqs[3].block.attend_input
    return explicit, *deqs


def test_causal_models_see_no_later_token():
    tokens = jnp.array([3, 1, 4, 1, 5, 9, 2, 6])
    for model in _models():
        forward = eqx.filter_jit(lambda x, model=model: model(x))
        before = forward(tokens)
        after = forward(tokens.at[5].set(0))
        assert np.abs(after[:5] - before[:5]).max() < 1e-8, type(model).__name__
        assert np.abs(after[5:] - before[5:]).max() > 1e-3
    with pytest.raises(ValueError, match="norm='tokens'.*causal"):
        eqattn.nn.DEQBlock(8, 2, key=jax.random.key(0), causal=True, norm="tokens")


def test_cache_matches_the_full_forward_pass():
    """Explicit: the key/value cache gives the full pass's logits to round-off. Implicit: each
    token's row solved against the cache of the earlier fixed points gives the joint solve's
    state to the solvers' tolerance (also with a stem and a cell of two blocks, whose cache
    holds the stem block's keys and values, then each cell block's), with the attention
    reading the state alone or the state plus the injection."""
    tokens = jnp.array([3, 1, 4, 1, 5, 9, 2, 6])
    explicit, deq, *deqs = _models()
    prefill, extend = eqx.filter_jit(eqattn.nn.prefill), eqx.filter_jit(eqattn.nn.extend)
    for model, tol in ((explicit, 1e-12), (deq, 1e-8), *((m, 1e-8) for m in deqs)):
        full = eqx.filter_jit(lambda x, model=model: model(x))(tokens)
        logits, cache, _ = prefill(model, tokens[:3])
        rows = [*logits]
        for t in tokens[3:]:
            step, cache, stats = extend(model, t, cache)
            rows.append(step)
            assert bool(stats.converged)
        assert np.abs(jnp.stack(rows) - full).max() < tol, type(model).__name__
    z_joint = eqx.filter_jit(lambda x: deq.forward(x)[1].value)(tokens)
    _, cache, _ = prefill(deq, tokens[:4])
    _, cache, _ = extend(deq, tokens[4], cache, warm_start=False)
    assert np.abs(cache.state - z_joint[4]).max() < 1e-8


def _language_model(kind, max_len=16):
    kw = dict(vocab_size=text.BYTES + 1, max_len=max_len, pooling="none", causal=True)
    kw["dtype"] = jnp.float64
    if kind == "explicit":
        return eqattn.nn.Transformer(text.BYTES, 16, 2, 1, key=jax.random.key(0), **kw)
    solver = eqattn.Picard(rtol=TIGHT, atol=TIGHT, max_steps=300)  # cheaper to compile
    return eqattn.nn.DEQTransformer(text.BYTES, 16, 2, key=jax.random.key(0), solver=solver, **kw)


def test_greedy_generation_matches_resolving_the_window():
    """The greedy bytes of cached generation (the equilibrium cache) are those of solving the
    whole window again for each byte, across the window's slide at `max_len` (the window
    restarts from its last max_len // 2 symbols). The explicit model's key/value cache is
    checked against its full forward pass in `test_cache_matches_the_full_forward_pass`."""
    model = _language_model("deq", max_len=10)
    out = text.generate(model, "def f", 12, temperature=0.0)
    window = list(text.encode("def f", 10)[0])
    expected = []
    # one compile: the window padded to 10 (a causal model's position i sees no later padding)
    forward = eqx.filter_jit(lambda x, i: model(x)[i])
    for _ in range(12):
        padded = jnp.asarray(window + [0] * (10 - len(window)))
        nxt = int(np.argmax(forward(padded, len(window) - 1)))
        expected.append(nxt)
        window.append(nxt)
        if len(window) > 10:
            window = window[-5:]
    assert out.text == bytes(expected)
    assert out.converged.all() and out.steps.shape == (12,)


def test_sampled_bytes_follow_the_softmax_of_the_logits_over_the_temperature():
    """Sampling draws from softmax(logits / temperature) over the `top_k` most likely bytes: the
    first bytes of 4000 identical prompts (independent draws, one batch) against the float64
    probabilities of the full forward pass, each of the top 3 within 5 standard errors; and a
    key reproduces its bytes."""
    model = _language_model("explicit")
    n, temperature = 4000, 0.5
    logits = np.asarray(model(jnp.asarray(text.encode("ab", 16)[0]))[-1], np.float64)
    top = np.argsort(logits)[-3:]
    p = np.exp((logits[top] - logits[top].max()) / temperature)
    p /= p.sum()
    out = text.generate(model, ["ab"] * n, 2, temperature=temperature, top_k=3)
    first = np.array([t[0] for t in out.text])
    assert set(first.tolist()) <= set(top.tolist())
    for byte, prob in zip(top, p):
        assert abs(np.mean(first == byte) - prob) < 5 * np.sqrt(prob * (1 - prob) / n), (byte, prob)
    key = jax.random.key(7)
    again = [text.generate(model, "ab", 8, temperature=1.0, key=key).text for _ in range(2)]
    assert again[0] == again[1]


def test_generation_batches_and_edges():
    model = _language_model("explicit")
    single = [text.generate(model, p, 6, temperature=0.0).text for p in ("a", "hello there")]
    batch = text.generate(model, ["a", b"hello there"], 6, temperature=0.0)
    assert batch.text == single and batch.steps.shape == (2, 6)
    with pytest.warns(UserWarning, match="longer than the model's context"):
        long = text.generate(model, "x" * 40, 3, temperature=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert long.text == text.generate(model, "x" * 15, 3, temperature=0.0).text
    sampled = text.generate(model, "a", 50, temperature=1.0, top_k=3, key=jax.random.key(1))
    logits = model(jnp.asarray(text.encode("a", 16)[0]))[-1]
    assert sampled.text[0] in set(np.argsort(np.asarray(logits))[-3:].tolist())
    for bad, match in [
        (dict(tokens=-1), "tokens"),
        (dict(tokens=1, temperature=-1.0), "temperature"),
        (dict(tokens=1, top_k=0), "top_k"),
    ]:
        with pytest.raises(ValueError, match=match):
            text.generate(model, "a", **bad)
    classifier = eqattn.nn.Transformer(10, 8, 2, 1, key=jax.random.key(0), vocab_size=20)
    with pytest.raises(ValueError, match="causal language model"):
        text.generate(classifier, "a", 1)


def _host_loop(model, prompts, tokens, key, temperature):
    """Generation one byte per call, as eqattn did before its compiled program: the public
    `nn.prefill` / `nn.extend` and the same key splits, the window sliding at `max_len`."""
    context = model.embedding.max_len
    history = [list(text.encode(p, context)[0]) for p in prompts]
    # each call compiled on its own (the host loop's calls, not one program of the loop)
    fill = eqx.filter_jit(lambda m, t, n: jax.vmap(lambda t, n: eqattn.nn.prefill(m, t, n))(t, n))
    extend = eqx.filter_jit(lambda m, t, c: jax.vmap(lambda t, c: eqattn.nn.extend(m, t, c))(t, c))

    def draw(logits, key):
        key, subkey = jax.random.split(key)
        return jax.random.categorical(subkey, logits / temperature, axis=-1), key

    def prefill(rows, key):
        tokens = np.zeros((len(rows), context), np.int32)
        for t, r in zip(tokens, rows):
            t[: len(r)] = r
        lengths = jnp.array([len(r) for r in rows])
        logits, cache, _ = fill(model, tokens, lengths)
        return (*draw(jax.vmap(lambda x, n: x[n - 1])(logits, lengths), key), cache)

    new, key, cache = prefill(history, key)
    filled, out = max(map(len, history)), [[] for _ in prompts]
    for i in range(tokens):
        for row, h, b in zip(out, history, np.asarray(new).tolist()):
            row.append(b)
            h.append(b)
        if i == tokens - 1:
            break
        if filled >= context:
            kept = [h[-(context // 2) :] for h in history]
            new, key, cache = prefill(kept, key)
            filled = max(map(len, kept))
        else:
            logits, cache, _ = extend(model, new, cache)
            new, key = draw(logits, key)
            filled += 1
    return [bytes(r) for r in out]


@pytest.mark.parametrize("kind", ["explicit", "deq"])
def test_the_compiled_program_draws_the_host_loops_bytes(kind):
    """Generation runs as compiled loops (a `lax.while_loop` per fill of the window, a call per
    slide): for a key it draws the bytes of the one-call-per-byte loop, across several slides
    and for prompts of different lengths, streamed (in calls of at most 16 bytes, one by one in
    order) or not (one loop per fill)."""
    model = _language_model(kind, max_len=10)
    prompts, key = ["a", "def fn", "xy"], jax.random.key(3)
    expected = _host_loop(model, prompts, 37, key, temperature=0.9)
    streamed = []
    out = text.generate(model, prompts, 37, temperature=0.9, key=key, on_token=streamed.append)
    assert out.text == expected and out.steps.shape == out.converged.shape == (3, 37)
    assert [b"".join(col[i] for col in streamed) for i in range(3)] == expected
    assert text.generate(model, prompts, 37, temperature=0.9, key=key).text == expected
    assert text.generate(model, "a", 0).text == b""
