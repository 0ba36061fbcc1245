"""A `ModelSpec` from any Hugging Face `config.json`: field synonyms, MoE layer patterns,
sliding-window layers and the checkpoint's quantization."""

from __future__ import annotations

from typing import Any

from gpufleet.errors import UserError
from gpufleet.specs.config_checks import check_kv_heads, check_sizes
from gpufleet.specs.layer_shapes import attention_shapes
from gpufleet.specs.models import LayerSpec, LinearAttentionSpec, MambaSpec, ModelSpec, MoESpec
from gpufleet.specs.quant import parse_quantization_config
from gpufleet.specs.rope_caches import rope_cache_positions

_SYNONYMS: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "vocab_size": ("vocab_size",),
    "max_position_embeddings": (
        "max_position_embeddings",
        "n_positions",
        "max_sequence_length",
        "seq_length",
    ),
}


def _get(cfg: dict[str, Any], key: str, source: str) -> Any:
    for k in _SYNONYMS.get(key, (key,)):
        if cfg.get(k) is not None:
            return cfg[k]
    raise UserError(
        f"{source} has no {key!r}",
        field=key,
        fix=f"add {key!r} to the config (it is in every Hugging Face config.json of this kind)",
    )


def _int(cfg: dict[str, Any], key: str, source: str) -> int:
    value = _get(cfg, key, source)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise UserError(
            f"{source}: {key!r} must be a non-negative integer, got {value!r}",
            field=key,
            fix=f"set {key!r} to an integer",
        )
    return value


# tie_word_embeddings when a config leaves it out: the default of the model's transformers
# config class (PretrainedConfig's is True; these classes set False).
_UNTIED_BY_DEFAULT = frozenset(
    {"llama", "llama4", "llama4_text", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3",
     "qwen3_moe", "deepseek_v2", "deepseek_v3", "kimi_k2", "glm4", "glm4_moe", "gpt_oss",
     "minimax", "minimax_m2", "phi3", "olmo", "olmo2", "gpt_neox", "granite", "internlm2"}
)  # fmt: skip

# Models whose configs give one sliding_window but alternate sliding and full layers
# without listing layer_types: every n-th layer (1-based) attends globally, the rest
# within the window (transformers' Gemma2 / Gemma3 / Cohere2 layer patterns).
_GLOBAL_EVERY: dict[str, tuple[str, int]] = {
    "gemma2": ("", 2),
    "gemma3": ("sliding_window_pattern", 6),
    "gemma3_text": ("sliding_window_pattern", 6),
    "cohere2": ("sliding_window_pattern", 4),
}


def _tied(cfg: dict[str, Any], model_type: str) -> bool:
    if "tie_word_embeddings" in cfg and cfg["tie_word_embeddings"] is not None:
        return bool(cfg["tie_word_embeddings"])
    return model_type not in _UNTIED_BY_DEFAULT


def _moe_layers(cfg: dict[str, Any], model_type: str, num_layers: int) -> list[bool]:
    if "first_k_dense_replace" in cfg:  # DeepSeek, Kimi K2, GLM-4.5
        first_dense = int(cfg.get("first_k_dense_replace", 0) or 0)
        freq = int(cfg.get("moe_layer_freq", 1) or 1)
        return [i >= first_dense and i % freq == 0 for i in range(num_layers)]
    if model_type.startswith("llama4"):
        step = int(cfg.get("interleave_moe_layer_step", 1) or 1)
        moe_ids = cfg.get("moe_layers") or list(range(step - 1, num_layers, step))
        return [i in set(moe_ids) for i in range(num_layers)]
    if "decoder_sparse_step" in cfg or "mlp_only_layers" in cfg:  # qwen2_moe / qwen3_moe
        step = int(cfg.get("decoder_sparse_step", 1) or 1)
        dense_ids = set(cfg.get("mlp_only_layers") or [])
        return [i not in dense_ids and (i + 1) % step == 0 for i in range(num_layers)]
    return [True] * num_layers


# Architectures whose layers are not all attention + MLP in a way ModelSpec can count:
# (config key or model_type, what it is). Planning them as a plain transformer would put
# every layer's KV cache and weights in the wrong place, so they are refused by name.
_UNSUPPORTED: tuple[tuple[str, str], ...] = (
    ("moe_latent_size", "experts that run in a smaller latent space (Nemotron 3 Super)"),
    ("layers_block_type", "a Mamba / attention hybrid (Jamba, Zamba)"),
    ("attn_layer_indices", "a Mamba / attention hybrid"),
    ("mamba_d_ssm", "parallel Mamba + attention layers (Falcon-H1)"),
    ("num_kv_shared_layers", "layers that share another layer's KV cache (Gemma 3n / 4)"),
    ("hidden_size_per_layer_input", "per-layer input embeddings (Gemma 3n, Gemma 4 E2B / E4B)"),
)
_UNSUPPORTED_IF_SET = ("num_kv_shared_layers", "hidden_size_per_layer_input")
_UNSUPPORTED_TYPES = ("mamba", "mamba2", "rwkv", "jamba", "falcon_h1", "bamba")
_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention", "linear_attention")


def _refuse_unsupported(cfg: dict[str, Any], model_type: str, src: str) -> None:
    for key, what in _UNSUPPORTED:
        if key in cfg and (key not in _UNSUPPORTED_IF_SET or cfg[key]):
            raise UserError(
                f"{src} is {what} ({key!r} in its config): gpufleet plan does not model "
                "this architecture's layers, and planning it as a plain transformer would "
                "be wrong",
                field=key,
                fix="plan a transformer with attention + MLP (or MoE) layers only, or size "
                "this model by hand",
            )
    if model_type in _UNSUPPORTED_TYPES:
        raise UserError(
            f"{src}: model_type {model_type!r} (state-space layers) is not modelled by "
            "gpufleet plan",
            field="model_type",
            fix="plan a transformer with attention + MLP (or MoE) layers only",
        )
    layer_types = cfg.get("layer_types")
    if layer_types is not None:
        unknown = sorted({str(t) for t in layer_types} - set(_LAYER_TYPES))
        if unknown or len(layer_types) < int(cfg.get("num_hidden_layers") or 0):
            raise UserError(
                f"{src}: layer_types lists {unknown or 'fewer layers than num_hidden_layers'}"
                f"; gpufleet plan knows {', '.join(_LAYER_TYPES)}",
                field="layer_types",
                fix="give one known type per layer (num_hidden_layers of them)",
            )


def _linear_layers(cfg: dict[str, Any], num_layers: int) -> list[bool]:
    """Linear-attention (Gated DeltaNet) layers: `layer_types` says `linear_attention`, or
    (Qwen3-Next) every `full_attention_interval`-th layer is full attention, the rest
    linear."""
    layer_types = cfg.get("layer_types")
    if layer_types:
        return [t == "linear_attention" for t in layer_types][:num_layers]
    interval = cfg.get("full_attention_interval")
    if interval and cfg.get("linear_num_value_heads"):
        return [(i + 1) % int(interval) != 0 for i in range(num_layers)]
    return [False] * num_layers


# Nemotron-H's hybrid_override_pattern: one block per character, each a single mixer or
# MLP: (recurrent mixer, has mixer, has MLP, MLP is MoE).
_NEMOTRON_BLOCKS = {
    "M": (True, True, False, False),  # Mamba-2
    "*": (False, True, False, False),  # attention
    "-": (False, False, True, False),  # dense MLP
    "E": (False, False, True, True),  # MoE
}


def _hybrid_blocks(cfg: dict[str, Any], num_layers: int, src: str) -> list[tuple[bool, ...]]:
    pattern = str(cfg.get("hybrid_override_pattern") or "")
    if len(pattern) != num_layers or set(pattern) - set(_NEMOTRON_BLOCKS):
        raise UserError(
            f"{src}: hybrid_override_pattern {pattern!r} must give one of "
            f"{''.join(_NEMOTRON_BLOCKS)} per layer ({num_layers})",
            field="hybrid_override_pattern",
            fix="use M (Mamba-2), * (attention), - (MLP) or E (MoE), one per layer",
        )
    return [_NEMOTRON_BLOCKS[c] for c in pattern]


def _nas_blocks(
    cfg: dict[str, Any], num_layers: int, src: str
) -> tuple[list[bool], list[int], int]:
    """Nemotron NAS (DeciLM) `block_configs`: per layer, attention or none (`no_op`), and
    an MLP of `ffn_mult` (DeciLM's width: 2/3 of ffn_mult x hidden, rounded up to 256).
    Attention must share one KV-head count; linear replacements and windows are refused."""
    blocks = cfg["block_configs"]
    hidden, heads = _int(cfg, "hidden_size", src), _int(cfg, "num_attention_heads", src)
    attention, widths, groups = [], [], set()
    for b in blocks if isinstance(blocks, list) else []:
        attn, ffn = b.get("attention") or {}, b.get("ffn") or {}
        unsupported = (
            attn.get("replace_with_linear")
            or ffn.get("replace_with_linear")
            or attn.get("window_length")
            or ffn.get("no_op")
        )
        if unsupported:
            break
        attention.append(not attn.get("no_op"))
        if not attn.get("no_op"):
            groups.add(int(attn.get("n_heads_in_group") or 1))
        width = int(2 * float(ffn.get("ffn_mult") or 0) * hidden / 3)
        widths.append(-(-width // 256) * 256)
    if len(attention) != num_layers or len(groups) != 1:
        raise UserError(
            f"{src}: block_configs must give {num_layers} blocks, each attention (one "
            "n_heads_in_group for all) or no_op, and an MLP of ffn_mult; linear "
            "replacements, windows and MLP-less blocks are not modelled",
            field="block_configs",
            fix="size this model by hand",
        )
    return attention, widths, heads // groups.pop()


# vLLM's SSM-state dtype with --mamba-ssm-cache-dtype auto (the planner's launch), by mixer;
# the conv state follows --mamba-cache-dtype, auto: the model's dtype (bf16 here).
# * Mamba-2 (NemotronH): the config's `mamba_ssm_cache_dtype`, else float32
#   (vllm-project/vllm#39032; float16 from #29978 before it). `mamba_ssm_dtype` is not read.
# * Gated DeltaNet (Qwen3.5 / 3.6): the config's `mamba_ssm_dtype`
#   (Qwen3_5ForConditionalGenerationConfig), else the conv state's dtype; Qwen3-Next's
#   configs name none (bf16, as its vLLM 0.10.2 log's 544-token block says).
#   `mamba_ssm_cache_dtype` is not read.
_MAMBA2_SSM_DEFAULT = "float32"


def _state_bytes(cfg: dict[str, Any], key: str, default: str = "bfloat16") -> int:
    """Bytes per element of a recurrent layer's SSM state: the config's `key`, else
    `default` (fp32: 4, else 2)."""
    dtype = str(cfg.get(key) or default)
    return 4 if dtype in ("float32", "fp32") else 2


def _mamba_spec(cfg: dict[str, Any], src: str) -> MambaSpec:
    return MambaSpec(
        num_heads=_int(cfg, "mamba_num_heads", src),
        head_dim=_int(cfg, "mamba_head_dim", src),
        n_groups=_int(cfg, "n_groups", src),
        state_size=_int(cfg, "ssm_state_size", src),
        conv_kernel=int(cfg.get("conv_kernel") or 4),
        ssm_state_bytes=_state_bytes(cfg, "mamba_ssm_cache_dtype", _MAMBA2_SSM_DEFAULT),
    )


def _linear_spec(cfg: dict[str, Any], src: str) -> LinearAttentionSpec:
    return LinearAttentionSpec(
        num_key_heads=_int(cfg, "linear_num_key_heads", src),
        num_value_heads=_int(cfg, "linear_num_value_heads", src),
        key_head_dim=_int(cfg, "linear_key_head_dim", src),
        value_head_dim=_int(cfg, "linear_value_head_dim", src),
        conv_kernel=int(cfg.get("linear_conv_kernel_dim") or 4),
        ssm_state_bytes=_state_bytes(cfg, "mamba_ssm_dtype"),
    )


def _sliding_windows(cfg: dict[str, Any], model_type: str, num_layers: int) -> list[int | None]:
    window = cfg.get("sliding_window")
    layer_types = cfg.get("layer_types")
    if layer_types and window:
        return [window if t == "sliding_attention" else None for t in layer_types][:num_layers]
    pattern = cfg.get("hybrid_layer_pattern")
    if isinstance(pattern, list) and window and len(pattern) >= num_layers:
        # MiMo-V2-Flash: 1 marks a sliding-window layer, 0 a full-attention one.
        return [int(window) if pattern[i] else None for i in range(num_layers)]
    chunk = cfg.get("attention_chunk_size")
    if model_type.startswith("llama4") and chunk:
        # Llama 4: RoPE layers attend within chunks of attention_chunk_size tokens, every
        # no_rope_layer_interval-th layer (NoPE) attends globally. A chunked layer never
        # needs more than one chunk of KV, so it is bounded like a window.
        interval = int(cfg.get("no_rope_layer_interval", 4) or 4)
        flags = cfg.get("no_rope_layers") or [
            int((i + 1) % interval != 0) for i in range(num_layers)
        ]
        return [chunk if flags[i] else None for i in range(num_layers)]
    if window and model_type in _GLOBAL_EVERY:
        key, default_every = _GLOBAL_EVERY[model_type]
        every = int(cfg.get(key) or default_every) if key else default_every
        return [None if (i + 1) % every == 0 else int(window) for i in range(num_layers)]
    if window and model_type.startswith(("qwen2", "qwen3")):
        # Qwen: off unless use_sliding_window; then layers from max_window_layers on.
        if not cfg.get("use_sliding_window", False):
            return [None] * num_layers
        first = int(cfg.get("max_window_layers") or 0)
        return [int(window) if i >= first else None for i in range(num_layers)]
    if window and cfg.get("use_sliding_window", True):
        return [int(window)] * num_layers
    return [None] * num_layers


def _vision_params(cfg: dict[str, Any]) -> int:
    """A multimodal checkpoint's vision encoder and projector, which vLLM loads beside the
    language model: ViT layers (attention 4h², MLP 2h·inter, 3h·inter gated in Pixtral and
    Gemma 4) plus the projection into the text model's hidden size (Mistral 3: a merger of
    spatial_merge_size² patches and a second text-width layer; Gemma 4: one h → text
    layer, and a learned table of position_embedding_size × 2 axes × h). 0 for text-only
    configs."""
    vision = cfg.get("vision_config")
    if not isinstance(vision, dict):
        return 0
    h = int(vision.get("hidden_size") or 0)
    layers = int(vision.get("num_hidden_layers") or vision.get("depth") or 0)
    inter = int(vision.get("intermediate_size") or 4 * h)
    patch = int(vision.get("patch_size") or 14)
    channels = int(vision.get("num_channels") or 3)
    gemma4 = vision.get("model_type") == "gemma4_vision"
    mlp = 3 if vision.get("model_type") == "pixtral" or gemma4 else 2
    body = layers * (4 * h * h + mlp * h * inter + 4 * h)
    text_h = int((cfg.get("text_config") or cfg).get("hidden_size") or 0)
    out = int(vision.get("vision_output_dim") or vision.get("out_hidden_size") or h)
    projector = out * text_h + h * out
    if merge := int(cfg.get("spatial_merge_size") or 0):
        projector = h * merge * merge * h + h * text_h + text_h * text_h
    if gemma4:
        projector = h * text_h + int(vision.get("position_embedding_size") or 0) * 2 * h
    return body + channels * patch * patch * h + projector


def _vision_shape(cfg: dict[str, Any]) -> tuple[int, int]:
    """vision_config's (layers, width) as SGLang reads them (24, 1024 if unsaid); 0s if none."""
    v = cfg.get("vision_config")
    if not isinstance(v, dict):
        return (0, 0)
    return int(v.get("num_hidden_layers", 24)), int(v.get("hidden_size", 1024))


def parse_config(cfg: dict[str, Any], name: str, source: str | None = None) -> ModelSpec:
    """A ModelSpec from a config.json dict. Missing required fields raise UserError."""
    src = source or name
    raw = cfg
    top_type = str(cfg.get("model_type", ""))
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers (Llama 4, ...)
        cfg = {**cfg, **cfg["text_config"]}
    model_type = str(cfg.get("model_type", top_type))
    _refuse_unsupported(cfg, model_type, src)
    hidden = _int(cfg, "hidden_size", src)
    num_layers = _int(cfg, "num_hidden_layers", src)
    heads = _int(cfg, "num_attention_heads", src)
    vocab = _int(cfg, "vocab_size", src)
    max_pos = _int(cfg, "max_position_embeddings", src)
    nas = _nas_blocks(cfg, num_layers, src) if cfg.get("block_configs") else None
    kv_heads = nas[2] if nas else (cfg.get("num_key_value_heads") or heads)  # HF default: MHA
    check_sizes(src, hidden, num_layers, heads, vocab, max_pos)
    head_dim = cfg.get("head_dim") or cfg.get("attention_head_dim") or hidden // heads
    if nas is None:
        check_kv_heads(src, heads, kv_heads, head_dim)
    blocks = _hybrid_blocks(cfg, num_layers, src) if "hybrid_override_pattern" in cfg else None

    num_experts = cfg.get("n_routed_experts") or cfg.get("num_local_experts")
    num_experts = num_experts or cfg.get("num_experts")
    moe: MoESpec | None = None
    moe_flags = [False] * num_layers
    if num_experts:
        experts_per_token = cfg.get("num_experts_per_tok") or cfg.get("experts_per_token")
        experts_per_token = experts_per_token or cfg.get("top_k_experts")  # Gemma 4
        if not experts_per_token:
            experts_per_token = _int(cfg, "num_experts_per_tok", src)
        expert_inter = cfg.get("moe_intermediate_size") or _int(cfg, "intermediate_size", src)
        shared_n = int(cfg.get("n_shared_experts") or 0)
        shared_inter = shared_n * expert_inter
        for key in ("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size"):
            if cfg.get(key):
                shared_n, shared_inter = 1, int(cfg[key])
        if model_type.startswith("llama4") or cfg.get("enable_moe_block"):
            # Llama 4, Gemma 4: a dense MLP beside the routed experts in every MoE layer.
            shared_n, shared_inter = 1, int(cfg["intermediate_size"])
        moe = MoESpec(
            num_experts=int(num_experts),
            experts_per_token=int(experts_per_token),
            expert_intermediate_size=int(expert_inter),
            num_shared_experts=shared_n,
            shared_expert_intermediate_size=shared_inter,
            expert_bias=model_type == "gpt_oss",
        )
        moe_flags = _moe_layers(cfg, model_type, num_layers)
        if blocks is not None:
            moe_flags = [b[3] for b in blocks]

    if nas is not None:
        dense_inter = max(nas[1])  # the widest layer's (activation peak); each has its own
    elif model_type.startswith("llama4"):
        dense_inter = int(cfg.get("intermediate_size_mlp") or cfg.get("intermediate_size") or 0)
    elif moe is not None and all(moe_flags):
        dense_inter = int(cfg.get("intermediate_size") or 0)  # unused: every layer is MoE
    else:
        dense_inter = _int(cfg, "intermediate_size", src)

    windows = _sliding_windows(cfg, model_type, num_layers)
    # Llama 4's windows are attention chunks (vLLM's ChunkedLocalAttentionSpec).
    chunked = model_type.startswith("llama4") and bool(cfg.get("attention_chunk_size"))
    linear = _linear_layers(cfg, num_layers)
    mixer, mlp = [True] * num_layers, [True] * num_layers
    if blocks is not None:
        linear, mixer, mlp = [b[0] for b in blocks], [b[1] for b in blocks], [b[2] for b in blocks]
    widths: list[int | None] = [None] * num_layers
    if nas is not None:
        mixer, widths = nas[0], list(nas[1])
    shapes = attention_shapes(cfg, windows, heads, src)
    layers = tuple(
        LayerSpec(
            sliding_window=windows[i],
            chunked=chunked and windows[i] is not None,
            is_moe=moe_flags[i],
            linear=linear[i],
            mixer=mixer[i],
            mlp=mlp[i],
            intermediate=widths[i],
            **shapes[i],
        )
        for i in range(num_layers)
    )
    is_mla = cfg.get("kv_lora_rank") is not None
    mla: dict[str, Any] = {}
    if is_mla:
        mla = dict(
            q_lora_rank=cfg.get("q_lora_rank"),
            kv_lora_rank=_int(cfg, "kv_lora_rank", src),
            qk_rope_head_dim=_int(cfg, "qk_rope_head_dim", src),
            qk_nope_head_dim=_int(cfg, "qk_nope_head_dim", src),
            v_head_dim=_int(cfg, "v_head_dim", src),
            index_head_dim=int(cfg.get("index_head_dim") or 0),
            index_n_heads=int(cfg.get("index_n_heads") or 0),
        )
    rotary_dim = int(int(head_dim) * float(cfg.get("partial_rotary_factor") or 1.0))
    attention_bias = cfg.get("attention_bias")
    if attention_bias is None:
        attention_bias = model_type in ("qwen2", "qwen2_moe")
    return ModelSpec(
        name=name,
        model_type=model_type,
        hidden_size=hidden,
        num_layers=num_layers,
        vocab_size=vocab,
        num_attention_heads=heads,
        num_kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        intermediate_size=dense_inter,
        tie_word_embeddings=_tied(cfg, model_type),
        max_position_embeddings=max_pos,
        rope_cache_positions=rope_cache_positions(cfg, model_type, max_pos, rotary_dim),
        attention_kind="mla" if is_mla else "gqa",
        layers=layers,
        moe=moe,
        num_mtp_layers=int(cfg.get("num_nextn_predict_layers") or 0),
        attention_bias=bool(attention_bias),
        qk_norm=model_type in ("qwen3", "qwen3_moe") or model_type.startswith("qwen3_"),
        attention_sinks=model_type == "gpt_oss",
        quant=parse_quantization_config(cfg, num_layers),
        rotary_dim=rotary_dim if not is_mla else 0,
        vision_params=_vision_params(raw),
        vision_shape=_vision_shape(raw),
        linear_attention=_linear_spec(cfg, src) if any(linear) and blocks is None else None,
        mamba=_mamba_spec(cfg, src) if blocks is not None and any(linear) else None,
        # relu2 MLPs (Nemotron-H) and Phi-1/2's fc1 / fc2 have no gate
        gated_mlp=cfg.get("mlp_hidden_act", cfg.get("hidden_act")) != "relu2"
        and model_type != "phi",
        attn_output_gate=bool(cfg.get("attn_output_gate", model_type == "qwen3_next")),
        **mla,
    )
