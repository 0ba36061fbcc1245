"""Model specs parsed from any Hugging Face `config.json` (dense, GQA, MLA, MoE, sliding
window). Parsing a config.json is in `config_parse`, the catalog of shipped configs in
`catalog`.

Parameter counts follow the module shapes of the reference implementations (HF
transformers / vLLM): q/k/v/o projections (or MLA's low-rank ones), gated MLPs with three
matrices, routers, RMSNorm weights, embeddings and an untied lm_head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpufleet.specs.quant import FORMATS, UNQUANTIZED, QuantScheme, uniform_scheme


@dataclass(frozen=True)
class MoESpec:
    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0  # total width of the shared MLP (all shared)
    expert_bias: bool = False  # gpt-oss experts carry biases


@dataclass(frozen=True)
class LinearAttentionSpec:
    """Gated DeltaNet layers (Qwen3-Next, Qwen3.5): a fixed-size recurrent state per
    sequence instead of a KV cache that grows with it (`linear_*` config keys)."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int = 4
    ssm_state_bytes: int = 2  # bytes per element of the recurrent state (config's dtype)

    @property
    def conv_dim(self) -> int:
        return (
            2 * self.num_key_heads * self.key_head_dim + self.num_value_heads * self.value_head_dim
        )

    def params(self, hidden: int) -> int:
        """in_proj_qkvz + in_proj_ba + depthwise conv + dt_bias/A_log + gated norm + out_proj."""
        nk, nv = self.num_key_heads, self.num_value_heads
        dk, dv = self.key_head_dim, self.value_head_dim
        in_proj = hidden * (2 * nk * dk + 2 * nv * dv) + hidden * 2 * nv
        return in_proj + self.conv_dim * self.conv_kernel + 2 * nv + dv + nv * dv * hidden

    def state_bytes(self, tp: int = 1) -> float:
        """One sequence's state in one layer on one GPU: the conv window (bf16) and the
        per-head dk x dv recurrent state, both sharded over TP ranks."""
        conv = self.conv_dim * (self.conv_kernel - 1) * 2
        ssm = self.num_value_heads * self.key_head_dim * self.value_head_dim * self.ssm_state_bytes
        return (conv + ssm) / tp


@dataclass(frozen=True)
class MambaSpec:
    """Mamba-2 mixers (Nemotron-H): a fixed conv window and SSM state per sequence."""

    num_heads: int
    head_dim: int
    n_groups: int
    state_size: int
    conv_kernel: int = 4
    ssm_state_bytes: int = 2

    @property
    def conv_dim(self) -> int:
        return self.num_heads * self.head_dim + 2 * self.n_groups * self.state_size

    def params(self, hidden: int) -> int:
        """in_proj (z, x, B, C, dt) + conv (with bias) + dt_bias / A_log / D + gated norm
        + out_proj."""
        inner = self.num_heads * self.head_dim
        in_proj = hidden * (inner + self.conv_dim + self.num_heads)
        conv = self.conv_dim * (self.conv_kernel + 1)
        return in_proj + conv + 3 * self.num_heads + inner + inner * hidden

    def state_bytes(self, tp: int = 1) -> float:
        conv = self.conv_dim * (self.conv_kernel - 1) * 2
        ssm = self.num_heads * self.head_dim * self.state_size * self.ssm_state_bytes
        return (conv + ssm) / tp


@dataclass(frozen=True)
class LayerSpec:
    sliding_window: int | None = None  # tokens a layer attends over; None = full attention
    chunked: bool = False  # the window is an attention chunk (Llama 4), not a sliding window
    is_moe: bool = False
    linear: bool = False  # a recurrent mixer (linear attention, Mamba): state, no KV
    mixer: bool = True  # False: an MLP-only block (Nemotron-H `-` / `E`)
    mlp: bool = True  # False: a mixer-only block (Nemotron-H `M` / `*`)
    intermediate: int | None = None  # this layer's dense MLP width (Nemotron NAS)
    # This attention layer's own shape where it is not the model's (None: the model's):
    # MiMo-V2-Flash's sliding layers, Gemma 4's global layers.
    kv_heads: int | None = None
    head_dim: int | None = None  # query / key head size
    v_head_dim: int | None = None  # value head size (None: the key head size)
    kv_shared: bool = False  # K doubles as V: no v_proj (Gemma 4's `attention_k_eq_v`)


@dataclass(frozen=True)
class KvBytesPerToken:
    """KV cache bytes one token costs on one GPU, split by attention kind.

    Full-attention layers grow with the sequence; a sliding-window (or chunked-local)
    layer never holds more than its window, so it is listed per window.
    """

    full_bytes: float
    sliding_bytes_by_window: tuple[tuple[int, float], ...] = ()
    state_bytes: float = 0.0  # per sequence, whatever its length (linear-attention layers)

    @property
    def sliding_bytes(self) -> float:
        return sum(b for _, b in self.sliding_bytes_by_window)

    @property
    def total_bytes(self) -> float:
        """Per token while the sequence is shorter than every window."""
        return self.full_bytes + self.sliding_bytes

    def bytes_for_sequence(self, tokens: int, block_tokens: int = 16) -> float:
        """KV bytes a sequence of `tokens` holds. Sliding layers keep their window plus
        one partially filled block (vLLM frees only whole blocks that left the window);
        linear-attention layers their fixed state."""
        sliding = sum(
            b * min(tokens, window + block_tokens) for window, b in self.sliding_bytes_by_window
        )
        return self.full_bytes * tokens + sliding + self.state_bytes


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
    quant: QuantScheme = UNQUANTIZED  # the checkpoint's per-module storage formats
    vision_params: int = 0  # a multimodal checkpoint's vision encoder + projector
    vision_shape: tuple[int, int] = (0, 0)  # vision_config (num_hidden_layers, hidden_size)
    rotary_dim: int = 0  # dims RoPE rotates per head (0: head_dim; MLA: qk_rope_head_dim)
    rope_cache_positions: int = 0  # rows of vLLM's cos/sin caches (0: max_position_embeddings)
    linear_attention: LinearAttentionSpec | None = None  # layers with `linear=True`
    attn_output_gate: bool = False  # q_proj also yields a sigmoid gate (Qwen3-Next, 3.5)
    mamba: MambaSpec | None = None  # layers with `linear=True` in Mamba hybrids
    gated_mlp: bool = True  # False: up + down only (relu2 MLPs and experts, Nemotron-H)
    index_head_dim: int = 0  # DeepSeek-V3.2 sparse attention's indexer keys (fp8 cache)
    index_n_heads: int = 0

    def rope_cache_elements(self) -> int:
        """vLLM's rotary cos/sin cache: one row of rotary_dim per position up to
        max_position_embeddings, on every GPU (Llama 4's 10M positions: 2.5 GiB in bf16);
        `rope_cache_positions` rows where the config scales it or keeps several (Gemma 3, 4)."""
        dim = self.rotary_dim or (
            self.qk_rope_head_dim if self.attention_kind == "mla" else self.head_dim
        )
        return (self.rope_cache_positions or self.max_position_embeddings) * dim

    @property
    def checkpoint_dtype(self) -> str:
        """How most of the published weights are stored: bf16, fp8, int8, int4, mxfp4 or
        nvfp4 (the per-module detail is in `quant`)."""
        return self.quant.headline

    def weight_scheme(self, weight_dtype: str) -> QuantScheme:
        """Per-module formats when serving at `weight_dtype`: the checkpoint's own scheme
        when that is its precision (modules it left unquantized stay so), else every
        decoder linear layer in `weight_dtype` (an online re-quantization or another
        checkpoint of the same model)."""
        if weight_dtype == self.checkpoint_dtype:
            return self.quant
        return uniform_scheme(FORMATS[weight_dtype])

    # ---- parameters -------------------------------------------------------------------
    def attention_params(self, layer: int = 0) -> int:
        h = self.hidden_size
        spec = self.layers[layer]
        if not spec.mixer:
            return 0
        recurrent = self.recurrent_mixer
        if spec.linear and recurrent is not None:
            return recurrent.params(h)
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
            return q + kv_a + kv_b + o + self.indexer_params()
        kv_heads, k_dim, v_dim = self.layer_attention_shape(layer)
        q_width = n * k_dim
        kv_width = kv_heads * (k_dim + (0 if spec.kv_shared else v_dim))
        gate = 2 if self.attn_output_gate else 1
        params = gate * h * q_width + h * kv_width + n * v_dim * h
        if self.attention_bias:
            params += q_width + kv_width + h
        if self.qk_norm:
            params += 2 * k_dim
        if self.attention_sinks:
            params += n
        return params

    def layer_attention_shape(self, layer: int) -> tuple[int, int, int]:
        """A GQA layer's (KV heads, key head size, value head size)."""
        spec = self.layers[layer]
        k_dim = spec.head_dim or self.head_dim
        return (spec.kv_heads or self.num_kv_heads, k_dim, spec.v_head_dim or k_dim)

    @property
    def kv_reference_layer(self) -> int:
        """The layer whose KV shape the step-time model reads per token: the first
        full-attention layer (else the first attention layer). Layers of other shapes
        are scaled to it (`perf.layer_costs`)."""
        attention = [i for i, s in enumerate(self.layers) if s.mixer and not s.linear]
        full = [i for i in attention if self.layers[i].sliding_window is None]
        return (full or attention or [0])[0]

    @property
    def recurrent_mixer(self) -> LinearAttentionSpec | MambaSpec | None:
        """What a `linear=True` layer is: Gated DeltaNet or Mamba-2."""
        return self.linear_attention or self.mamba

    @property
    def _mlp_matrices(self) -> int:
        return 3 if self.gated_mlp else 2

    def indexer_params(self) -> int:
        """DeepSeek-V3.2's lightning indexer: its query heads from the q latent, one key
        head from the hidden state (+ LayerNorm), and per-head weights."""
        if not self.index_head_dim:
            return 0
        d, heads = self.index_head_dim, self.index_n_heads
        q_in = self.q_lora_rank or self.hidden_size
        return q_in * heads * d + self.hidden_size * d + 2 * d + self.hidden_size * heads

    def indexer_bytes_per_token(self) -> float:
        """DeepSeek-V3.2 caches one fp8 indexer key per token and layer, with one fp32
        scale per 128 dims (vLLM's indexer cache), on every rank, whatever the KV dtype."""
        if not self.index_head_dim:
            return 0.0
        return self.index_head_dim + 4 * -(-self.index_head_dim // 128)

    def expert_params(self) -> int:
        """One routed expert (gated MLP: gate, up, down)."""
        if self.moe is None:
            return 0
        h, e = self.hidden_size, self.moe.expert_intermediate_size
        bias = (2 * e + h) if self.moe.expert_bias else 0
        return self._mlp_matrices * h * e + bias

    def shared_expert_params(self) -> int:
        if self.moe is None or self.moe.shared_expert_intermediate_size == 0:
            return 0
        return self._mlp_matrices * self.hidden_size * self.moe.shared_expert_intermediate_size

    def router_params(self) -> int:
        if self.moe is None:
            return 0
        bias = self.moe.num_experts if self.moe.expert_bias else 0
        return self.hidden_size * self.moe.num_experts + bias

    def mlp_params(self, layer: int = 0) -> int:
        """Dense MLP, or for an MoE layer: all routed experts + shared experts + router."""
        if not self.layers[layer].mlp:
            return 0
        if self.layers[layer].is_moe and self.moe is not None:
            return (
                self.moe.num_experts * self.expert_params()
                + self.shared_expert_params()
                + self.router_params()
            )
        width = self.layers[layer].intermediate or self.intermediate_size
        return self._mlp_matrices * self.hidden_size * width

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
        """One RMSNorm before each of the block's mixer and MLP."""
        spec = self.layers[layer]
        return self.hidden_size * (int(spec.mixer) + int(spec.mlp))

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

    def kv_elements_per_token_per_layer(self, tp: int, layer: int | None = None) -> int:
        """K and V elements one token caches in `layer` (default: `kv_reference_layer`)
        on one GPU. vLLM caches K and V apiece even where K doubles as V."""
        if self.attention_kind == "mla":
            # MLA caches the compressed latent + the rope key, replicated on every rank.
            return self.kv_lora_rank + self.qk_rope_head_dim
        ref = self.kv_reference_layer if layer is None else layer
        kv_heads, k_dim, v_dim = self.layer_attention_shape(ref)
        return max(1, kv_heads // tp) * (k_dim + v_dim)

    def kv_breakdown(
        self, kv_dtype_bytes: float, tp: int = 1, layer_ids: range | None = None
    ) -> KvBytesPerToken:
        """KV bytes per token on one GPU for the given layers (default: all; a pipeline
        stage passes its own range)."""
        ids = range(self.num_layers) if layer_ids is None else layer_ids
        indexer = self.indexer_bytes_per_token()
        full = state = 0.0
        by_window: dict[int, float] = {}
        for i in ids:
            window = self.layers[i].sliding_window
            recurrent = self.recurrent_mixer
            if not self.layers[i].mixer:
                continue
            per_layer = self.kv_elements_per_token_per_layer(tp, i) * kv_dtype_bytes + indexer
            if self.layers[i].linear and recurrent is not None:
                state += recurrent.state_bytes(tp)
            elif window is None:
                full += per_layer
            else:
                by_window[window] = by_window.get(window, 0.0) + per_layer
        return KvBytesPerToken(full, tuple(sorted(by_window.items())), state)

    def kv_bytes_per_token(self, kv_dtype_bytes: float, tp: int = 1) -> float:
        """Per GPU, summed over all layers (sliding ones included, i.e. for sequences
        shorter than their window). Use `kv_breakdown` for the full / sliding split."""
        return self.kv_breakdown(kv_dtype_bytes, tp).total_bytes

    def kv_bytes_per_token_full(self, kv_dtype_bytes: float, tp: int = 1) -> float:
        return self.kv_breakdown(kv_dtype_bytes, tp).full_bytes

    def kv_bytes_per_token_sliding(self, kv_dtype_bytes: float, tp: int = 1) -> float:
        return self.kv_breakdown(kv_dtype_bytes, tp).sliding_bytes
