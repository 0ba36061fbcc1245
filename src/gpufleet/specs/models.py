"""Model specs parsed from any Hugging Face `config.json` (dense, GQA, MLA, MoE, sliding
window), and the catalog of configs shipped in `data/models/` (named `ORG--NAME.json`).

Parameter counts follow the module shapes of the reference implementations (HF
transformers / vLLM): q/k/v/o projections (or MLA's low-rank ones), gated MLPs with three
matrices, routers, RMSNorm weights, embeddings and an untied lm_head.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from gpufleet.errors import UserError


@dataclass(frozen=True)
class MoESpec:
    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0  # total width of the shared MLP (all shared)
    expert_bias: bool = False  # gpt-oss experts carry biases


@dataclass(frozen=True)
class LayerSpec:
    sliding_window: int | None = None  # tokens a layer attends over; None = full attention
    is_moe: bool = False


@dataclass(frozen=True)
class KvBytesPerToken:
    """KV cache bytes one token costs on one GPU, split by attention kind.

    Full-attention layers grow with the sequence; a sliding-window (or chunked-local)
    layer never holds more than its window, so it is listed per window.
    """

    full_bytes: float
    sliding_bytes_by_window: tuple[tuple[int, float], ...] = ()

    @property
    def sliding_bytes(self) -> float:
        return sum(b for _, b in self.sliding_bytes_by_window)

    @property
    def total_bytes(self) -> float:
        """Per token while the sequence is shorter than every window."""
        return self.full_bytes + self.sliding_bytes

    def bytes_for_sequence(self, tokens: int, block_tokens: int = 16) -> float:
        """KV bytes a sequence of `tokens` holds. Sliding layers keep their window plus
        one partially filled block (vLLM frees only whole blocks that left the window)."""
        sliding = sum(
            b * min(tokens, window + block_tokens) for window, b in self.sliding_bytes_by_window
        )
        return self.full_bytes * tokens + sliding


@dataclass(frozen=True)
class ModelSpec:
    name: str
    model_type: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # dense MLP width (layers that are not MoE)
    tie_word_embeddings: bool
    max_position_embeddings: int
    attention_kind: Literal["gqa", "mla"]
    layers: tuple[LayerSpec, ...]
    moe: MoESpec | None = None
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    num_mtp_layers: int = 0
    attention_bias: bool = False
    qk_norm: bool = False
    attention_sinks: bool = False
    checkpoint_dtype: str = "bf16"  # how the published weights are stored (bf16|fp8|fp4)

    # ---- parameters -------------------------------------------------------------------
    def attention_params(self, layer: int = 0) -> int:
        h = self.hidden_size
        n = self.num_attention_heads
        if self.attention_kind == "mla":
            qk_head = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * n * qk_head
            else:
                q = h * n * qk_head
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
            kv_b = self.kv_lora_rank * n * (self.qk_nope_head_dim + self.v_head_dim)
            o = n * self.v_head_dim * h
            return q + kv_a + kv_b + o
        q_width = n * self.head_dim
        kv_width = self.num_kv_heads * self.head_dim
        params = h * q_width + 2 * h * kv_width + q_width * h
        if self.attention_bias:
            params += q_width + 2 * kv_width + h
        if self.qk_norm:
            params += 2 * self.head_dim
        if self.attention_sinks:
            params += n
        return params

    def expert_params(self) -> int:
        """One routed expert (gated MLP: gate, up, down)."""
        if self.moe is None:
            return 0
        h, e = self.hidden_size, self.moe.expert_intermediate_size
        bias = (2 * e + h) if self.moe.expert_bias else 0
        return 3 * h * e + bias

    def shared_expert_params(self) -> int:
        if self.moe is None or self.moe.shared_expert_intermediate_size == 0:
            return 0
        return 3 * self.hidden_size * self.moe.shared_expert_intermediate_size

    def router_params(self) -> int:
        if self.moe is None:
            return 0
        bias = self.moe.num_experts if self.moe.expert_bias else 0
        return self.hidden_size * self.moe.num_experts + bias

    def mlp_params(self, layer: int = 0) -> int:
        """Dense MLP, or for an MoE layer: all routed experts + shared experts + router."""
        if self.layers[layer].is_moe and self.moe is not None:
            return (
                self.moe.num_experts * self.expert_params()
                + self.shared_expert_params()
                + self.router_params()
            )
        return 3 * self.hidden_size * self.intermediate_size

    def active_mlp_params(self, layer: int = 0) -> int:
        """MLP weights one token touches: k routed experts + shared + router."""
        if self.layers[layer].is_moe and self.moe is not None:
            return (
                self.moe.experts_per_token * self.expert_params()
                + self.shared_expert_params()
                + self.router_params()
            )
        return self.mlp_params(layer)

    def norm_params(self, layer: int = 0) -> int:
        return 2 * self.hidden_size

    def layer_params(self, layer: int) -> int:
        return self.attention_params(layer) + self.mlp_params(layer) + self.norm_params(layer)

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def lm_head_params(self) -> int:
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    def mtp_params(self) -> int:
        """DeepSeek-style multi-token-prediction modules as published: each is one more
        (MoE) decoder layer, two norms, a 2h→h projection, a head norm, and its own copy of
        the embedding and lm_head."""
        if self.num_mtp_layers == 0:
            return 0
        h = self.hidden_size
        last = self.num_layers - 1
        per = (
            self.layer_params(last)
            + 3 * h
            + 2 * h * h
            + self.embedding_params()
            + self.vocab_size * h
        )
        return self.num_mtp_layers * per

    def total_params(self, include_mtp: bool = False) -> int:
        body = sum(self.layer_params(i) for i in range(self.num_layers))
        total = body + self.embedding_params() + self.lm_head_params() + self.hidden_size
        return total + (self.mtp_params() if include_mtp else 0)

    def active_params(self) -> int:
        """Parameters used per token (embedding and lm_head included, as published)."""
        body = sum(
            self.attention_params(i) + self.active_mlp_params(i) + self.norm_params(i)
            for i in range(self.num_layers)
        )
        return body + self.embedding_params() + self.lm_head_params() + self.hidden_size

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def num_moe_layers(self) -> int:
        return sum(1 for layer in self.layers if layer.is_moe)

    # ---- KV cache ---------------------------------------------------------------------
    def kv_heads_per_rank(self, tp: int) -> int:
        """vLLM shards KV heads over TP ranks and replicates them when tp > kv heads."""
        return max(1, self.num_kv_heads // tp)

    def kv_elements_per_token_per_layer(self, tp: int) -> int:
        if self.attention_kind == "mla":
            # MLA caches the compressed latent + the rope key, replicated on every rank.
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.kv_heads_per_rank(tp) * self.head_dim

    def kv_breakdown(
        self, kv_dtype_bytes: float, tp: int = 1, layer_ids: range | None = None
    ) -> KvBytesPerToken:
        """KV bytes per token on one GPU for the given layers (default: all; a pipeline
        stage passes its own range)."""
        ids = range(self.num_layers) if layer_ids is None else layer_ids
        per_layer = self.kv_elements_per_token_per_layer(tp) * kv_dtype_bytes
        full = 0.0
        by_window: dict[int, float] = {}
        for i in ids:
            window = self.layers[i].sliding_window
            if window is None:
                full += per_layer
            else:
                by_window[window] = by_window.get(window, 0.0) + per_layer
        return KvBytesPerToken(full, tuple(sorted(by_window.items())))

    def kv_bytes_per_token(self, kv_dtype_bytes: float, tp: int = 1) -> float:
        """Per GPU, summed over all layers (sliding ones included, i.e. for sequences
        shorter than their window). Use `kv_breakdown` for the full / sliding split."""
        return self.kv_breakdown(kv_dtype_bytes, tp).total_bytes

    def kv_bytes_per_token_full(self, kv_dtype_bytes: float, tp: int = 1) -> float:
        return self.kv_breakdown(kv_dtype_bytes, tp).full_bytes

    def kv_bytes_per_token_sliding(self, kv_dtype_bytes: float, tp: int = 1) -> float:
        return self.kv_breakdown(kv_dtype_bytes, tp).sliding_bytes


# ---- parsing ------------------------------------------------------------------------

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


def _checkpoint_dtype(cfg: dict[str, Any]) -> str:
    quant = cfg.get("quantization_config") or {}
    method = str(quant.get("quant_method", "")).lower()
    if method == "fp8":
        return "fp8"
    if method == "mxfp4":
        return "fp4"
    if method in ("awq", "gptq") and quant.get("bits") == 4:
        return "int4"
    return "bf16"


def _moe_layers(cfg: dict[str, Any], model_type: str, num_layers: int) -> list[bool]:
    if model_type.startswith("deepseek"):
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


def _sliding_windows(cfg: dict[str, Any], model_type: str, num_layers: int) -> list[int | None]:
    window = cfg.get("sliding_window")
    layer_types = cfg.get("layer_types")
    if layer_types and window:
        return [window if t == "sliding_attention" else None for t in layer_types][:num_layers]
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
    if window and cfg.get("use_sliding_window", True):
        return [int(window)] * num_layers
    return [None] * num_layers


def parse_config(cfg: dict[str, Any], name: str, source: str | None = None) -> ModelSpec:
    """A ModelSpec from a config.json dict. Missing required fields raise UserError."""
    src = source or name
    top_type = str(cfg.get("model_type", ""))
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers (Llama 4, ...)
        cfg = {**cfg, **cfg["text_config"]}
    model_type = str(cfg.get("model_type", top_type))
    hidden = _int(cfg, "hidden_size", src)
    num_layers = _int(cfg, "num_hidden_layers", src)
    heads = _int(cfg, "num_attention_heads", src)
    vocab = _int(cfg, "vocab_size", src)
    max_pos = _int(cfg, "max_position_embeddings", src)
    kv_heads = cfg.get("num_key_value_heads") or heads  # HF default: multi-head attention
    head_dim = cfg.get("head_dim") or hidden // heads

    num_experts = cfg.get("n_routed_experts") or cfg.get("num_local_experts")
    num_experts = num_experts or cfg.get("num_experts")
    moe: MoESpec | None = None
    moe_flags = [False] * num_layers
    if num_experts:
        experts_per_token = cfg.get("num_experts_per_tok") or cfg.get("experts_per_token")
        if not experts_per_token:
            experts_per_token = _int(cfg, "num_experts_per_tok", src)
        expert_inter = cfg.get("moe_intermediate_size") or _int(cfg, "intermediate_size", src)
        shared_n = int(cfg.get("n_shared_experts") or 0)
        shared_inter = shared_n * expert_inter
        if cfg.get("shared_expert_intermediate_size"):
            shared_n, shared_inter = 1, int(cfg["shared_expert_intermediate_size"])
        if model_type.startswith("llama4"):
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

    if model_type.startswith("llama4"):
        dense_inter = int(cfg.get("intermediate_size_mlp") or cfg.get("intermediate_size") or 0)
    elif moe is not None and all(moe_flags):
        dense_inter = int(cfg.get("intermediate_size") or 0)  # unused: every layer is MoE
    else:
        dense_inter = _int(cfg, "intermediate_size", src)

    windows = _sliding_windows(cfg, model_type, num_layers)
    layers = tuple(
        LayerSpec(sliding_window=windows[i], is_moe=moe_flags[i]) for i in range(num_layers)
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
        )
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
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_position_embeddings=max_pos,
        attention_kind="mla" if is_mla else "gqa",
        layers=layers,
        moe=moe,
        num_mtp_layers=int(cfg.get("num_nextn_predict_layers") or 0),
        attention_bias=bool(attention_bias),
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        attention_sinks=model_type == "gpt_oss",
        checkpoint_dtype=_checkpoint_dtype(cfg),
        **mla,
    )


# ---- catalog ------------------------------------------------------------------------

# Suffixes that name a variant of the same architecture (chat tuning, a quantized copy).
_VARIANT_SUFFIX = re.compile(
    r"(-(instruct|chat|it|base|hf|fp8|fp8-dynamic|awq|gptq|int4|int8|w4a16|w8a8|bf16|v0\.\d+))+$"
)


def _name_keys(name: str) -> set[str]:
    """Every spelling a user might type for a model named `org/Name`."""
    full = name.strip().lower()
    short = full.rsplit("/", 1)[-1]
    keys = {full, short}
    for k in list(keys):
        keys.add(_VARIANT_SUFFIX.sub("", k))
    for k in list(keys):
        if k.rsplit("/", 1)[-1].startswith("meta-"):
            keys.add(k.rsplit("/", 1)[-1].removeprefix("meta-"))
    return keys


@functools.cache
def _catalog_files() -> dict[str, str]:
    """Canonical `org/Name` -> file name."""
    root = resources.files("gpufleet.specs").joinpath("data/models")
    out: dict[str, str] = {}
    for entry in root.iterdir():
        if entry.name.endswith(".json"):
            out[entry.name.removesuffix(".json").replace("--", "/")] = entry.name
    return out


@functools.cache
def _catalog_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for canonical in _catalog_files():
        for key in _name_keys(canonical):
            index.setdefault(key, canonical)
    return index


def model_names() -> list[str]:
    """Canonical names (`org/Name`) of every model config that ships with gpufleet."""
    return sorted(_catalog_files())


@functools.cache
def _load_catalog_model(canonical: str) -> ModelSpec:
    file_name = _catalog_files()[canonical]
    root = resources.files("gpufleet.specs").joinpath("data/models")
    cfg = json.loads(root.joinpath(file_name).read_text())
    return parse_config(cfg, canonical, source=f"catalog config {file_name}")


def load_model(name_or_path: str) -> ModelSpec:
    """A catalog name (usual spellings, case-insensitive: `meta-llama/Llama-3.1-70B`,
    `Meta-Llama-3.1-70B`), a path to a config.json, or a directory holding one."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        config_path = path / "config.json"
        if not config_path.is_file():
            raise UserError(
                f"directory {str(path)!r} holds no config.json",
                field="--model",
                fix="point --model at a Hugging Face model directory or its config.json",
            )
        return _load_path(config_path, name=str(path))
    if path.is_file():
        # A model directory's config.json names the directory (what engines load).
        return _load_path(path, name=str(path.parent) if path.name == "config.json" else "")

    index = _catalog_index()
    for key in sorted(_name_keys(name_or_path), key=len, reverse=True):
        if key in index:
            return _load_catalog_model(index[key])
    lowered = name_or_path.strip().lower()
    close = difflib.get_close_matches(lowered, list(index), n=8, cutoff=0.5)
    close_names = sorted({index[c] for c in close})
    hint = f" (close names: {', '.join(close_names)})" if close_names else ""
    raise UserError(
        f"unknown model {name_or_path!r}{hint}",
        field="--model",
        fix=f"use a catalog name ({', '.join(model_names())}), a config.json path, "
        "or a directory holding one",
    )


def _load_path(config_path: Path, name: str) -> ModelSpec:
    try:
        cfg = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(
            f"cannot read {str(config_path)!r}: {e}",
            field="--model",
            fix="pass a valid Hugging Face config.json",
        ) from e
    if not isinstance(cfg, dict):
        raise UserError(
            f"{str(config_path)!r} is not a JSON object",
            field="--model",
            fix="pass a valid Hugging Face config.json",
        )
    # ORG--NAME.json (how the shipped configs are named) reads as the hub id ORG/NAME.
    display = name or str(cfg.get("_name_or_path") or config_path.stem.replace("--", "/"))
    return parse_config(cfg, display, source=str(config_path))
