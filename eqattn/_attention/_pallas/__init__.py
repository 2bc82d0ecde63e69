"""eqattn's fused attention kernels in Pallas: Triton on NVIDIA GPUs, Mosaic on TPUs, interpret
mode on CPU (tests)."""

from ._attention import attention_core as attention_core
