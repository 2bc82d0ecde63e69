import fcntl
import gc
import os

# 8 CPU devices for the multi-device tests (before jax is imported; computations not sharded
# explicitly still run on one device).
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()


# The suite is compile-bound: XLA's quickest CPU settings (see `benchmarks/_xla_flags.py`).
from benchmarks._xla_flags import use_quickest  # noqa: E402

FAST_COMPILE = use_quickest()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)

# ... and one MLIR context for the worker's lowerings (see `benchmarks/_one_context.py`).
from benchmarks import _one_context  # noqa: E402

_one_context.use_one()


@pytest.fixture(autouse=True)
def _dtype_of_the_test(request):
    """float64 by default (comparisons against float64 references); tests marked `float32` run
    with `jax_enable_x64` off, so layers, training and the command line take JAX's default
    float32 as they do for users."""
    if request.node.get_closest_marker("float32") is None:
        yield
    else:
        with jax.enable_x64(False):
            yield


# Every program goes into the cache, however fast it compiled: command lines start fresh, so the
# small eager programs of layer construction are compiled again and again otherwise (4 test
# modules on 2 workers: 268 s against 309 s at 0.2 s).
CACHE_MIN_COMPILE_S = 0.0


@pytest.fixture(autouse=True, scope="session")
def _compilation_cache(tmp_path_factory):
    """One persistent compilation cache for the processes the tests start (command lines,
    benchmarks): they compile the same programs again and again. It lives in the run's
    temporary directory, so each run starts empty. The test workers themselves do not use it:
    their programs are seldom compiled twice (5 modules: 5,733 of 7,051 compiles missed it), and
    keying, writing and reading every one cost more than it saved (those 5 modules: 291 s
    without it against 327 s; the whole suite on a 2-core CPU: 21:23 against 22:02, within
    the machine's noise). A cache the user set is kept."""
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        base = tmp_path_factory.getbasetemp()
        run = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
        os.environ["JAX_COMPILATION_CACHE_DIR"] = str(run / "jax-compilation-cache")
        os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = str(CACHE_MIN_COMPILE_S)
    yield


@pytest.fixture(autouse=True)
def _bad_input_is_ours(request):
    """A test marked `bad_input` passes what eqattn's annotations exclude, on purpose, to see
    eqattn's own error: jaxtyping's runtime checks stand aside for it (tests/checks.py)."""
    if request.node.get_closest_marker("bad_input") is None:
        yield
        return
    from .checks import unchecked

    with unchecked():
        yield


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def getkey():
    keys = iter(jax.random.split(jax.random.key(0), 1000))
    return lambda: next(keys)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop JAX's caches of traced and compiled programs after each test module: few are reused
    across modules, and a worker that keeps every module's programs grows to several GB."""
    yield
    jax.clear_caches()
    _one_context.release()
    gc.collect()


@pytest.fixture(autouse=True)
def _every_prediction_is_a_forest(monkeypatch):
    """Every set of parents a graph model names in the suite (`graphs.predict` and the
    evaluation's, both through `choose_parents`) is checked to form a forest rooted at the
    source: the property `GraphPrediction` promises on any input."""
    from eqattn.graphs import _evaluation, _predict

    choose = _predict.choose_parents

    def checked(scores, graph, source, converged):
        parent = choose(scores, graph, source, converged)
        assert _predict.is_forest(parent, source, scores.reached), "parents not a forest"
        return parent

    for module in (_predict, _evaluation):
        monkeypatch.setattr(module, "choose_parents", checked)


@pytest.fixture(scope="session")
def graph_runs(tmp_path_factory):
    """The README's first run, `eqattn train` (the graph task's DEQ and explicit twin at the
    command's defaults), run once for the whole test run as a user runs it (a fresh process,
    XLA's own settings), every worker sharing it: the folder whose `runs/graphs/deq` and
    `runs/graphs/explicit` hold the runs (the guide's Python block, the graph runs' tests and
    the quick graphs benchmark read them) and `printed.txt` what the command printed (the
    README's transcript is checked against it)."""
    from .checks import transcripts

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder = root / "shared-graph-runs"
    with open(root / "shared-graph-runs.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not (folder / "printed.txt").exists():
                folder.mkdir(exist_ok=True)
                printed = transcripts().run(README_RUN, folder)
                (folder / "printed.txt").write_text("\n".join(printed) + "\n")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return folder


README_RUN = "eqattn train"
"""The README's first run (its transcript's command)."""
