"""`implementation="auto"` on a GPU with a measured table: the committed table is what the
committed results give, its lookup takes the nearest measured size and nothing unmeasured, and
the fused kernel runs where it was measured fastest (with or without the log-sum-exp);
elsewhere the rule stands. The GPU's kind is simulated: the tables are read on any host."""

import jax
import jax.numpy as jnp
import pytest

import eqattn
from eqattn._attention import _plan
from eqattn._attention._measured_tables import TABLES


def _x(n, dtype=jnp.bfloat16, d=64):
    return jax.ShapeDtypeStruct((8, n, d), dtype)


def test_the_committed_table_is_what_the_results_give():
    from benchmarks.auto_tables import TARGET, build, render

    assert TARGET.read_text() == render(build())
    assert {"NVIDIA H100 80GB HBM3", "NVIDIA H200"} <= set(TABLES)


def test_the_lookup_takes_the_nearest_measured_size_and_nothing_unmeasured():
    kind = "NVIDIA H200"
    choice = lambda x, **kw: _plan.measured_choice(kind, x, x, x, kw.get("lse", False), False)  # noqa: E731
    assert choice(_x(1024)) == "pallas" and choice(_x(4096)) == "cudnn"
    assert choice(_x(1500)) == "pallas"  # nearer 1024^2 than 4096^2 logits (log scale)
    assert choice(_x(3000)) == "cudnn"
    assert choice(_x(65536)) == "cudnn"  # above the largest: the largest's
    assert choice(_x(256)) is None  # below a quarter of the smallest: not measured
    assert choice(_x(1024, d=128)) is None and choice(_x(1024, jnp.float16)) is None
    assert _plan.measured_choice("NVIDIA A100", _x(1024), _x(1024), _x(1024), False, False) is None


@pytest.mark.parametrize("kind", [None, "NVIDIA H100 80GB HBM3", "NVIDIA H200"])
def test_auto_reads_the_gpus_table_where_the_rule_gives_cudnn(monkeypatch, kind):
    monkeypatch.setattr(_plan, "gpu_kind", lambda: kind)
    select = lambda x, **kw: eqattn.select_implementation(x, x, backend="gpu", **kw)  # noqa: E731
    small, large = _x(1024), _x(16384)
    # H200: the fused kernel was faster than cuDNN at 1024 tokens (bfloat16, no log-sum-exp)
    assert select(small) == ("pallas" if kind == "NVIDIA H200" else "cudnn")
    assert select(large) == "cudnn"
    # with the log-sum-exp (bfloat16) the fused kernel was the fastest on both GPUs; float32 at
    # 1024 tokens too (cuDNN takes neither); a mask was never measured: the rule stands
    measured = kind is not None
    assert select(large, need_lse=True) == ("pallas" if measured else "chunked")
    assert select(small, need_lse=True) == ("pallas" if measured else "xla")
    assert select(_x(1024, jnp.float32)) == ("pallas" if measured else "xla")
    assert select(small, mask=jnp.ones((1024, 1024), bool)) == "xla"
    # a CPU's choice never reads a GPU's table
    assert eqattn.select_implementation(small, small, backend="cpu") == "xla"
