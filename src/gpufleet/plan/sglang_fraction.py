"""SGLang's default --mem-fraction-static for a multimodal model.

When the fraction is left to its default and the model config has a vision_config, SGLang's
`ServerArgs._handle_gpu_memory_settings` (the release whose reserve rule
`engines.sglang_mem_fraction_static` implements) ends with `adjust_mem_fraction_for_vlm`:
the fraction × 0.95 × a factor for the vision tower's size, 1 − 0.1 × (layers × hidden² /
(24 × 1024²) − 1) clamped to [0.8, 1.05] (ViT-L/14 as the baseline; 24 layers and 1024 wide
where the config does not say). A fraction given on the command line is kept.

Earlier SGLang (0.4.x, `ModelRunner.__init__`) multiplied the fraction by a flat 0.95 for
every multimodal model, default or given; the newest server_args, when it sizes the KV cache
after capturing CUDA graphs (`post_capture_kv_sizing`), subtracts a flat 8 GiB of headroom
instead. Neither is modelled: the planner plans the release its reserve rule is read from.
"""

from __future__ import annotations

from gpufleet.specs.models import ModelSpec

VLM_BASE_FACTOR = 0.95
VIT_BASELINE = 24 * 1024**2  # ViT-L/14: 24 layers of 1024
VIT_SENSITIVITY = 0.1
VIT_FACTOR_RANGE = (0.8, 1.05)


def sglang_vlm_fraction(fraction: float, model: ModelSpec) -> float:
    """SGLang's default memory fraction `fraction` as adjusted for `model`'s vision tower
    (unchanged for a text-only model)."""
    layers, hidden = model.vision_shape
    if not layers:
        return fraction
    ratio = layers * hidden**2 / VIT_BASELINE
    low, high = VIT_FACTOR_RANGE
    factor = max(low, min(high, 1.0 - VIT_SENSITIVITY * (ratio - 1.0)))
    return fraction * VLM_BASE_FACTOR * factor
