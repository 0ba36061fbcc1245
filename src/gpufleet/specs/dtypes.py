"""Bytes per element of every dtype gpufleet talks about, in one place."""

from __future__ import annotations

from typing import Final

# Storage size of one parameter (or one KV element) in bytes, without quantization scales.
BYTES_PER_PARAM: Final[dict[str, float]] = {
    "fp32": 4.0,
    "tf32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
    "fp4": 0.5,
}

# Extra bytes per quantized parameter for its scales, as the usual checkpoints store them:
# fp8 / int8 use one scale per output channel (or per 128x128 block): negligible.
# int4 (AWQ / GPTQ, group 128): an fp16 scale plus a packed 4-bit zero per 128 weights.
# fp4 (MXFP4, as gpt-oss ships): one 8-bit shared exponent per 32 weights.
SCALE_BYTES_PER_PARAM: Final[dict[str, float]] = {
    "fp8": 0.0,
    "int8": 0.0,
    "int4": (2.0 + 0.5) / 128,
    "fp4": 1.0 / 32,
}

# What a layout may choose for weights and KV cache.
WEIGHT_DTYPES: Final[tuple[str, ...]] = ("bf16", "fp8", "int8", "int4", "fp4")
KV_DTYPES: Final[tuple[str, ...]] = ("bf16", "fp8")


def weight_bytes_per_param(dtype: str) -> float:
    """Storage of one quantized weight including its scale overhead."""
    return BYTES_PER_PARAM[dtype] + SCALE_BYTES_PER_PARAM.get(dtype, 0.0)
