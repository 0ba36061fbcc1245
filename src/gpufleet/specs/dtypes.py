"""Bytes per element of every dtype gpufleet talks about, in one place."""

from __future__ import annotations

from typing import Final

from gpufleet.specs.quant import FORMATS

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
    "mxfp4": 0.5,
    "nvfp4": 0.5,
}

# Extra bytes per quantized parameter for its scales, as the usual checkpoints store them
# (the formats themselves, with their compute paths, are in `specs.quant`).
SCALE_BYTES_PER_PARAM: Final[dict[str, float]] = {
    name: fmt.bytes_per_param - BYTES_PER_PARAM[name] for name, fmt in FORMATS.items()
}

# What a layout may choose for weights and KV cache.
WEIGHT_DTYPES: Final[tuple[str, ...]] = tuple(FORMATS)
KV_DTYPES: Final[tuple[str, ...]] = ("bf16", "fp8")


def weight_bytes_per_param(dtype: str) -> float:
    """Storage of one quantized weight including its scale overhead."""
    return FORMATS[dtype].bytes_per_param if dtype in FORMATS else BYTES_PER_PARAM[dtype]
