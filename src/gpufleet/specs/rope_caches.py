"""Rows of vLLM's rotary cos/sin caches a config implies (`ModelSpec.rope_cache_positions`):
vLLM keeps one cache per distinct RoPE on every GPU, counted in the weights it logs."""

from __future__ import annotations

from typing import Any

__all__ = ["rope_cache_positions"]


def rope_cache_positions(
    cfg: dict[str, Any], model_type: str, max_pos: int, rotary_dim: int
) -> int:
    """Rows of vLLM's rotary cos/sin caches (one per distinct RoPE), counted in rows of
    `rotary_dim`: a linear-scaled RoPE caches max_position × factor positions
    (LinearScalingRotaryEmbedding); Gemma 3 adds its sliding layers' unscaled local RoPE
    (`rope_local_base_freq`, 10,000 by default). A config with one RoPE per layer type
    (Gemma 4's `rope_parameters`) gets one cache per type present in `layer_types`, each
    as wide as that type's rotary dims, except a "proportional" RoPE (Gemma4RotaryEmbedding),
    which zero-pads its frequencies and caches the whole head (`global_head_dim` on
    full-attention layers) whatever its partial_rotary_factor."""
    per_type = cfg.get("rope_parameters")
    if (
        isinstance(per_type, dict)
        and per_type
        and all(isinstance(v, dict) for v in per_type.values())
    ):
        present = set(cfg.get("layer_types") or per_type)
        head = int(cfg.get("head_dim") or rotary_dim)
        columns = 0
        for layer_type, params in per_type.items():
            if layer_type not in present:
                continue
            width = head
            if layer_type == "full_attention":
                width = int(cfg.get("global_head_dim") or head)
            if params.get("rope_type") != "proportional":
                width = int(width * float(params.get("partial_rotary_factor") or 1.0))
            columns += width
        return max_pos * columns // rotary_dim if rotary_dim else max_pos
    scaling = cfg.get("rope_scaling") or {}
    kind = scaling.get("rope_type") or scaling.get("type")
    rows = int(max_pos * float(scaling.get("factor") or 1)) if kind == "linear" else max_pos
    return rows + (max_pos if model_type.startswith("gemma3") else 0)
