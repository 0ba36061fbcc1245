"""gpufleet.specs: the GPU catalog and model specs parsed from HF config.json files."""

from gpufleet.specs.catalog import load_model, model_names
from gpufleet.specs.config_parse import parse_config
from gpufleet.specs.dtypes import (
    BYTES_PER_PARAM,
    KV_DTYPES,
    SCALE_BYTES_PER_PARAM,
    WEIGHT_DTYPES,
    weight_bytes_per_param,
)
from gpufleet.specs.gpus import GpuSpec, gpu_names, load_gpu
from gpufleet.specs.models import KvBytesPerToken, LayerSpec, ModelSpec, MoESpec

__all__ = [
    "BYTES_PER_PARAM",
    "KV_DTYPES",
    "SCALE_BYTES_PER_PARAM",
    "WEIGHT_DTYPES",
    "GpuSpec",
    "KvBytesPerToken",
    "LayerSpec",
    "MoESpec",
    "ModelSpec",
    "gpu_names",
    "load_gpu",
    "load_model",
    "model_names",
    "parse_config",
    "weight_bytes_per_param",
]
