"""Solver tolerances that the arithmetic can reach.

A fixed point of $f$ evaluated with matmuls of unit roundoff $\\epsilon$ can be resolved only to a
relative residual of about $\\epsilon$: below that the residual is rounding noise and a solver
spins to its step limit. The equilibrium layers' default solvers therefore use
`rtol = max(rtol, 4 * eps)`, with $\\epsilon$ that of the matmuls they will run:

- bfloat16 / float16 parameters: that dtype's epsilon (2**-7 / 2**-10);
- float32 under `jax.default_matmul_precision`: `"highest"`/`"float32"` keep float32's
  (2**-23); `"high"`/`"tensorfloat32"` (and 3-pass bf16) TF32's (2**-10); `"bfloat16"` and other
  one-pass bf16 settings bf16's (2**-7); left unset or `"default"`, the platform's default:
  float32 on CPU, TF32 on GPUs, one-pass bfloat16 on TPUs;
- float64: float64's.

The rule is applied when a layer is built (from `jax.default_backend()` and the precision setting
in force then); a solver passed explicitly is used as given.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_EPS = {"f32": 2.0**-23, "tf32": 2.0**-10, "bf16": 2.0**-7, "f16": 2.0**-10, "f8": 2.0**-3}
_BY_SETTING = {
    "highest": "f32",
    "float32": "f32",
    "high": "tf32",
    "tensorfloat32": "tf32",
    "bfloat16": "bf16",
    "fastest": None,  # the platform's default
    "default": None,
}
_PLATFORM_DEFAULT = {"cpu": "f32", "gpu": "tf32", "cuda": "tf32", "rocm": "tf32", "tpu": "bf16"}


def _preset(setting: str) -> str:
    """The kind of a dot-algorithm preset such as `"BF16_BF16_F32_X3"`."""
    s = setting.upper()
    if "F8" in s:
        return "f8"
    if s.startswith("F16"):
        return "f16"
    if s.startswith("BF16"):
        passes = s.rsplit("_X", 1)[-1] if "_X" in s else "1"
        return {"1": "bf16", "3": "tf32"}.get(passes, "f32")
    if s.startswith("TF32"):
        return "f32" if s.endswith("_X3") else "tf32"
    return "f32"


def matmul_epsilon(dtype=None) -> float:
    """The unit roundoff of a matmul on arrays of `dtype` (default: JAX's default float) under
    the current `jax.default_matmul_precision` on the default backend."""
    dtype = jnp.dtype(jnp.result_type(float) if dtype is None else dtype)
    if dtype == jnp.float64:
        return float(jnp.finfo(jnp.float64).eps)
    if dtype != jnp.float32:
        return float(jnp.finfo(dtype).eps)
    setting = getattr(jax.config, "jax_default_matmul_precision")  # (untyped in jax.config)
    if setting is None:
        kind = None
    elif str(setting).lower() in _BY_SETTING:
        kind = _BY_SETTING[str(setting).lower()]
    else:
        kind = _preset(str(setting))
    if kind is None:
        kind = _PLATFORM_DEFAULT.get(jax.default_backend(), "f32")
    return _EPS[kind]


def precision_rtol(rtol: float, dtype=None) -> float:
    """`max(rtol, 4 * matmul_epsilon(dtype))`: a relative tolerance the arithmetic can reach."""
    return max(rtol, 4 * matmul_epsilon(dtype))
