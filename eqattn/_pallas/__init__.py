"""eqattn's fused attention kernel in Pallas (Triton on NVIDIA GPUs, interpret mode on CPU)."""

from ._attention import attention_core as attention_core
