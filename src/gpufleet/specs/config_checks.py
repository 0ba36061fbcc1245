"""Checks on the fields of a config.json that size tensors, so a broken config is named
instead of planned as a model of no heads, layers or vocabulary."""

from __future__ import annotations

from typing import Any

from gpufleet.errors import UserError


def check_shape(source: str, **fields: Any) -> None:
    """Each field must be an integer >= 1."""
    for key, value in fields.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            fix = f"set {key!r} to the checkpoint's own value (a positive integer)"
            raise UserError(f"{source}: {key!r} must be >= 1, got {value!r}", field=key, fix=fix)


def check_sizes(source: str, hidden: int, layers: int, heads: int, vocab: int, pos: int) -> None:
    """The sizes every config states (already read as non-negative integers) are >= 1."""
    check_shape(
        source,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        vocab_size=vocab,
        max_position_embeddings=pos,
    )


def check_kv_heads(source: str, heads: int, kv_heads: Any, head_dim: Any) -> None:
    """Grouped-query attention: each KV head serves heads / kv_heads query heads."""
    check_shape(source, num_key_value_heads=kv_heads, head_dim=head_dim)
    if heads % kv_heads:
        raise UserError(
            f"{source}: num_key_value_heads ({kv_heads}) does not divide "
            f"num_attention_heads ({heads})",
            field="num_key_value_heads",
            fix=f"set num_key_value_heads to a divisor of {heads} (the checkpoint's own)",
        )
