"""Per-layer attention shapes read from a `config.json`, for models whose attention layers
are not all of one shape:

* MiMo-V2-Flash: its sliding-window layers have their own KV heads and head sizes
  (`swa_num_key_value_heads`, `swa_head_dim`, `swa_v_head_dim`); every layer's value
  head (`v_head_dim`) is smaller than its key head.
* Gemma 4: its global (full-attention) layers have their own head size
  (`global_head_dim`) and, where K doubles as V (`attention_k_eq_v`, no `v_proj`), their
  own KV-head count (`num_global_key_value_heads`), as HF transformers' Gemma 4 reads them.

A layer of the model's own shape gets no override (`LayerSpec` fields stay None), so a
model of one shape is read exactly as before.
"""

from __future__ import annotations

from typing import Any

from gpufleet.errors import UserError


def attention_shapes(
    cfg: dict[str, Any], windows: list[int | None], heads: int, src: str
) -> list[dict[str, Any]]:
    """One dict of `LayerSpec` overrides per layer (empty: the model's shape)."""
    shapes: list[dict[str, Any]] = [{} for _ in windows]
    if cfg.get("kv_lora_rank") is not None:
        return shapes  # MLA: one latent shape
    full: dict[str, Any] = {}
    sliding: dict[str, Any] = {}
    v_dim = cfg.get("v_head_dim")
    if v_dim and v_dim != _head_dim(cfg, heads):
        full["v_head_dim"] = sliding["v_head_dim"] = int(v_dim)
    if any(key.startswith("swa_") for key in cfg):
        swa_heads = cfg.get("swa_num_attention_heads")
        if swa_heads is not None and int(swa_heads) != heads:
            raise UserError(
                f"{src}: its sliding layers have {swa_heads} query heads, its full layers "
                f"{heads}; gpufleet plan models one query-head count",
                field="swa_num_attention_heads",
                fix="plan a model whose layers share one query-head count",
            )
        for key, field in (
            ("swa_num_key_value_heads", "kv_heads"),
            ("swa_head_dim", "head_dim"),
            ("swa_v_head_dim", "v_head_dim"),
        ):
            if cfg.get(key):
                sliding[field] = int(cfg[key])
    if cfg.get("global_head_dim"):
        full["head_dim"] = int(cfg["global_head_dim"])
        if cfg.get("attention_k_eq_v"):
            full["kv_shared"] = True
            global_kv = cfg.get("num_global_key_value_heads")
            if global_kv:
                full["kv_heads"] = int(global_kv)
    for i, window in enumerate(windows):
        shapes[i] = dict(sliding if window is not None else full)
    return shapes


def _head_dim(cfg: dict[str, Any], heads: int) -> int:
    return int(cfg.get("head_dim") or cfg.get("attention_head_dim") or cfg["hidden_size"] // heads)
