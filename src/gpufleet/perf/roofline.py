"""The roofline step-time model: how long one engine iteration takes on one layout.

Per layer, on one GPU of the group:
* GEMMs (attention projections, dense MLP or shared experts, router): time is the larger
  of compute (2 FLOPs per weight per token, at the weight dtype's tensor rate x GEMM
  efficiency) and memory (weights + activations over HBM x memory efficiency). Prefill is
  compute-bound, small decode batches are bandwidth-bound.
* Routed experts: only the experts the batch touches are read — for G tokens each picking
  k of E experts, E(1 - (1 - k/E)^G) distinct ones — split over EP ranks; their FLOPs are
  the tokens' k expert MLPs.
* Attention: prefill FLOPs grow with the context each new token attends over (causal,
  capped by a sliding window); decode reads every cached K/V byte (MLA: the compressed
  latent, absorbed) — each as its own roofline with the attention efficiency.
* TP: two all-reduces of the tokens' hidden states per layer, from the bandwidth-vs-size
  curve in perf_comm plus a per-call latency. EP: an all-to-all dispatch and combine per
  MoE layer. PP: a send/recv between consecutive stages.
* lm_head for the sequences that sample, and a fixed per-iteration overhead.

Everything that does not depend on the batch is computed once in __init__; `step_time_s`
does a few dozen float operations (the engine calls it every iteration).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from gpufleet.perf.calibration import Calibration, default_calibration
from gpufleet.perf.comm import AllReduceCurve, all_to_all_s, send_recv_s
from gpufleet.perf.step_time import StepBatch
from gpufleet.specs.dtypes import BYTES_PER_PARAM, weight_bytes_per_param
from gpufleet.specs.gpus import GpuSpec
from gpufleet.specs.models import ModelSpec

ACT_BYTES = 2.0  # activations and all-reduce messages travel in bf16
# Activation bytes a token reads and writes per layer, in units of hidden_size (inputs and
# outputs of the projections and MLP, norms, residual): small next to weights in decode.
_ACT_IO_HIDDEN_PER_LAYER = 12.0
_COMPUTE_DTYPE = {"fp8": "fp8", "int8": "int8", "fp4": "fp4"}  # W8A8 / W4A4 paths
# Decode runs at least this long are evaluated with numpy (a fixed cost of some tens of µs,
# then a few ns a step); shorter ones step by step in Python.
_VECTOR_MIN_STEPS = 48


class LayoutLike(Protocol):
    """What the model needs from a layout (gpufleet.plan.layout.Layout has these)."""

    @property
    def tp(self) -> int: ...
    @property
    def pp(self) -> int: ...
    @property
    def ep(self) -> int: ...
    @property
    def weight_dtype(self) -> str: ...
    @property
    def kv_dtype(self) -> str: ...


@dataclass(frozen=True, slots=True)
class _LayerClass:
    """Layers that cost the same, and how many of them there are (per whole model)."""

    count: int
    window: int | None
    dense_weight_bytes: float  # per GPU: attention projections + dense MLP / shared / router
    dense_flops_per_token: float  # per GPU
    is_moe: bool


@dataclass(frozen=True, slots=True)
class _DecodeParts:
    """What a decode-only step of one batch size costs apart from attention over context."""

    layers: tuple[tuple[int, float, float | None, int | None], ...]  # count, GEMM, MoE, window
    tail_s: tuple[float, ...]  # all-reduces, lm_head, PP hops: added in this order
    overhead_s: float


def compute_dtype_for(weight_dtype: str, gpu: GpuSpec) -> str:
    """GEMMs run at the weight dtype where the GPU has tensor cores for it (fp8, int8,
    fp4); weight-only int4 (AWQ / GPTQ Marlin) and anything unsupported run at bf16."""
    dtype = _COMPUTE_DTYPE.get(weight_dtype, "bf16")
    return dtype if gpu.supports(dtype) else "bf16"


def kv_bytes_per_element(kv_dtype: str) -> float:
    return BYTES_PER_PARAM["bf16"] if kv_dtype in ("auto", "", None) else BYTES_PER_PARAM[kv_dtype]


class RooflineStepTimeModel:
    """`StepTimeModel` for one layout: `step_time_s(batch)` is one iteration end to end
    (all pipeline stages). `pipeline_stages` tells the engine how many micro-batches it may
    keep in flight: a new one may start every step_time_s / pipeline_stages.

    attention_dp: attention data-parallel ranks (DeepSeek-style serving): each rank runs
    attention on its own batch (the batch given here), while the MoE layers see every
    rank's tokens. moe_weight_dtype: expert weights' dtype when it differs from the rest.
    """

    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        layout: LayoutLike,
        *,
        calibration: Calibration | None = None,
        backend: str | None = None,
        attention_dp: int = 1,
        moe_weight_dtype: str | None = None,
    ) -> None:
        cal = calibration or default_calibration()
        self.model = model
        self.gpu = gpu
        self.layout = layout
        self.pipeline_stages = max(1, layout.pp)
        tp, ep, dp = max(1, layout.tp), max(1, layout.ep), max(1, attention_dp)
        self._tp, self._ep, self._dp = tp, ep, dp
        # Expert weights are split over the group's GPUs: EP ranks x the rest as TP.
        moe_tp = max(1, (tp * dp) // ep)
        backend_cal = cal.backend(backend)
        self._overhead_s = backend_cal.step_overhead_s

        # MXFP4 (fp4) quantizes only the experts (as gpt-oss ships); the rest stays bf16.
        dense_dtype = "bf16" if layout.weight_dtype == "fp4" else layout.weight_dtype
        w_bytes = weight_bytes_per_param(dense_dtype)
        moe_dtype = moe_weight_dtype or layout.weight_dtype
        moe_w_bytes = weight_bytes_per_param(moe_dtype)
        peak = gpu.tflops(compute_dtype_for(dense_dtype, gpu)) * 1e12
        moe_peak = gpu.tflops(compute_dtype_for(moe_dtype, gpu)) * 1e12
        self._gemm_flops_s = peak * cal.gemm_efficiency
        self._moe_flops_s = moe_peak * cal.gemm_efficiency * backend_cal.moe_gemm_efficiency
        self._moe_hbm_bytes_s = (
            gpu.hbm_gbps * 1e9 * cal.memory_efficiency * backend_cal.moe_efficiency
        )
        self._attn_flops_s = gpu.tflops("bf16") * 1e12 * cal.attention_efficiency
        self._hbm_bytes_s = gpu.hbm_gbps * 1e9 * cal.memory_efficiency

        h = model.hidden_size
        # Per-layer classes: (window, is_moe) -> count; weights per GPU.
        counts: dict[tuple[int | None, bool], int] = {}
        for spec in model.layers:
            key = (spec.sliding_window, spec.is_moe)
            counts[key] = counts.get(key, 0) + 1
        classes = []
        for (window, is_moe), count in counts.items():
            layer_id = next(
                i
                for i, s in enumerate(model.layers)
                if s.sliding_window == window and s.is_moe == is_moe
            )
            attn = model.attention_params(layer_id) / tp
            if is_moe and model.moe is not None:
                mlp = model.shared_expert_params() / moe_tp + model.router_params()
            else:
                mlp = model.mlp_params(layer_id) / tp
            classes.append(
                _LayerClass(
                    count=count,
                    window=window,
                    dense_weight_bytes=(attn + mlp) * w_bytes,
                    dense_flops_per_token=2.0 * (attn + mlp),
                    is_moe=is_moe and model.moe is not None,
                )
            )
        self._classes = tuple(classes)
        self._act_io_bytes_per_token = _ACT_IO_HIDDEN_PER_LAYER * h * ACT_BYTES

        # Routed experts.
        moe = model.moe
        self._num_experts = moe.num_experts if moe else 0
        self._top_k = moe.experts_per_token if moe else 0
        self._experts_per_rank = (moe.num_experts / ep) if moe else 0.0
        expert_params_rank = model.expert_params() / moe_tp if moe else 0.0
        self._expert_bytes = expert_params_rank * moe_w_bytes
        self._expert_flops_per_assignment = 2.0 * expert_params_rank
        self._moe_ranks = ep * moe_tp

        # Attention per layer per GPU.
        heads = max(1, model.num_attention_heads // tp)
        kv_elem = kv_bytes_per_element(layout.kv_dtype)
        self._kv_bytes_per_token_layer = model.kv_elements_per_token_per_layer(tp) * kv_elem
        if model.attention_kind == "mla":
            qk = model.qk_nope_head_dim + model.qk_rope_head_dim
            # Prefill attends with full heads; decode in the absorbed latent space.
            self._prefill_attn_flops_per_pair = 2.0 * heads * (qk + model.v_head_dim)
            latent = model.kv_lora_rank + model.qk_rope_head_dim
            self._decode_attn_flops_per_pair = 2.0 * heads * (latent + model.kv_lora_rank)
        else:
            self._prefill_attn_flops_per_pair = 4.0 * heads * model.head_dim
            self._decode_attn_flops_per_pair = 4.0 * heads * model.head_dim

        # lm_head (vocab split over TP, kept bf16 by quantized checkpoints) reads its
        # weights once per iteration.
        lm_params = model.vocab_size * h / tp
        self._lm_bytes = lm_params * BYTES_PER_PARAM["bf16"]
        self._lm_flops_per_seq = 2.0 * lm_params
        self._bf16_flops_s = gpu.tflops("bf16") * 1e12 * cal.gemm_efficiency

        # Communication.
        # A TP group wider than a node all-reduces over the inter-node network.
        tp_link_gbps = gpu.network_gbps if tp > gpu.gpus_per_node else gpu.intra_node_gbps
        self._curve = AllReduceCurve(tp_link_gbps, cal.allreduce_latency_s)
        self._allreduces_per_layer = 2 if tp > 1 else 0
        self._ep_link_gbps = gpu.network_gbps if ep > gpu.gpus_per_node else gpu.intra_node_gbps
        self._a2a_latency_s = cal.allreduce_latency_s
        group = tp * max(1, layout.pp)
        self._pp_link_gbps = gpu.network_gbps if group > gpu.gpus_per_node else gpu.intra_node_gbps
        self._h = h
        # decode batch size -> the parts of a decode step's time that do not depend on context
        self._decode_parts: dict[int, _DecodeParts] = {}

    # ---------------------------------------------------------------------------------

    def step_time_s(self, batch: StepBatch) -> float:
        # Hot path (called every simulated engine step): attributes are read into locals
        # and max() is spelled out, but every float is computed in the same order as the
        # plain formulas, so results are bit-identical.
        prefill_tokens = batch.prefill_tokens
        prefill_ctx = batch.prefill_context_tokens
        n_dec = batch.num_decode
        n_seqs = len(prefill_tokens) + n_dec
        if n_seqs == 0:
            return 0.0
        tokens = sum(prefill_tokens) + n_dec
        dec_ctx_mean = batch.decode_context_tokens / n_dec if n_dec else 0.0

        full_pairs = 0.0
        for n, ctx in zip(prefill_tokens, prefill_ctx, strict=True):
            full_pairs += n * (ctx + (n + 1) / 2.0)
        moe_s = self._moe_s(tokens) if self._num_experts else 0.0

        gemm_flops_s = self._gemm_flops_s
        hbm_bytes_s = self._hbm_bytes_s
        act_io = tokens * self._act_io_bytes_per_token
        prefill_pair_flops = self._prefill_attn_flops_per_pair
        decode_pair_flops = self._decode_attn_flops_per_pair
        attn_flops_s = self._attn_flops_s
        kv_bytes_layer = self._kv_bytes_per_token_layer
        total = 0.0
        for cls in self._classes:
            # Dense GEMMs.
            compute_s = tokens * cls.dense_flops_per_token / gemm_flops_s
            memory_s = (cls.dense_weight_bytes + act_io) / hbm_bytes_s
            gemm_s = memory_s if memory_s > compute_s else compute_s
            # Attention: prefill pairs (query token, key token), causal, window-capped.
            window = cls.window
            if window is None:
                pairs, dec_pairs = full_pairs, n_dec * dec_ctx_mean
            else:
                pairs = 0.0
                for n, ctx in zip(prefill_tokens, prefill_ctx, strict=True):
                    pairs += n * min(ctx + (n + 1) / 2.0, window)
                dec_pairs = n_dec * min(dec_ctx_mean, window)
            compute_s = (pairs * prefill_pair_flops + dec_pairs * decode_pair_flops) / attn_flops_s
            memory_s = dec_pairs * kv_bytes_layer / hbm_bytes_s
            attn_s = memory_s if memory_s > compute_s else compute_s
            layer_s = gemm_s + attn_s
            if cls.is_moe:
                layer_s += moe_s
            total += cls.count * layer_s

        # All-reduces: message is the tokens' hidden states.
        if self._allreduces_per_layer:
            ar = self._curve.all_reduce_s(tokens * self._h * ACT_BYTES, self._tp)
            total += self.model.num_layers * self._allreduces_per_layer * ar
        # lm_head on the sequences that sample this iteration.
        compute_s = n_seqs * self._lm_flops_per_seq / self._bf16_flops_s
        memory_s = self._lm_bytes / hbm_bytes_s
        total += memory_s if memory_s > compute_s else compute_s
        if self.pipeline_stages > 1:
            hop = send_recv_s(tokens * self._h * ACT_BYTES, self._pp_link_gbps, 5e-6)
            total += (self.pipeline_stages - 1) * hop
        return total + self._overhead_s

    def _moe_s(self, tokens: int) -> float:
        """Routed experts on one GPU for one MoE layer, plus EP dispatch and combine."""
        global_tokens = tokens * self._dp
        k, e = self._top_k, self._num_experts
        touched = self._experts_per_rank * (1.0 - (1.0 - k / e) ** global_tokens)
        assignments = global_tokens * k / self._moe_ranks  # token-expert pairs per GPU
        expert_s = max(
            assignments * self._expert_flops_per_assignment / self._moe_flops_s,
            (touched * self._expert_bytes + assignments * self._h * ACT_BYTES * 2)
            / self._moe_hbm_bytes_s,
        )
        if self._ep > 1:
            # Each GPU sends its tokens' k copies out and gets them back.
            local = tokens if self._tp == 1 else tokens / self._tp
            a2a = all_to_all_s(
                local * k * self._h * ACT_BYTES, self._ep, self._ep_link_gbps, self._a2a_latency_s
            )
            expert_s += 2.0 * a2a
        return expert_s

    # ---------------------------------------------------------------- decode runs
    # The engine jumps over runs of decode-only steps; these give the times of such a run
    # with the very float operations, in the same order, that step_time_s performs (so the
    # results are bit-identical), leaving out only what does not depend on context.

    def _decode_parts_for(self, n: int) -> _DecodeParts:
        parts = self._decode_parts.get(n)
        if parts is not None:
            return parts
        moe_s = self._moe_s(n) if self._num_experts else 0.0
        act_io = n * self._act_io_bytes_per_token
        layers = []
        for cls in self._classes:
            compute_s = n * cls.dense_flops_per_token / self._gemm_flops_s
            memory_s = (cls.dense_weight_bytes + act_io) / self._hbm_bytes_s
            gemm_s = memory_s if memory_s > compute_s else compute_s
            layers.append((cls.count, gemm_s, moe_s if cls.is_moe else None, cls.window))
        tail = []
        if self._allreduces_per_layer:
            ar = self._curve.all_reduce_s(n * self._h * ACT_BYTES, self._tp)
            tail.append(self.model.num_layers * self._allreduces_per_layer * ar)
        compute_s = n * self._lm_flops_per_seq / self._bf16_flops_s
        memory_s = self._lm_bytes / self._hbm_bytes_s
        tail.append(memory_s if memory_s > compute_s else compute_s)
        if self.pipeline_stages > 1:
            hop = send_recv_s(n * self._h * ACT_BYTES, self._pp_link_gbps, 5e-6)
            tail.append((self.pipeline_stages - 1) * hop)
        parts = _DecodeParts(tuple(layers), tuple(tail), self._overhead_s)
        self._decode_parts[n] = parts
        return parts

    def decode_step_times_s(
        self, num_decode: int, context_tokens: int, num_steps: int
    ) -> list[float]:
        """`step_time_s` of each step of a decode run (see `perf.step_time.DecodeStepTimes`)."""
        if num_steps >= _VECTOR_MIN_STEPS:
            return self._decode_step_times_np(num_decode, context_tokens, num_steps)
        n = num_decode
        parts = self._decode_parts_for(n)
        prefill_pair_flops = self._prefill_attn_flops_per_pair
        decode_pair_flops = self._decode_attn_flops_per_pair
        attn_flops_s = self._attn_flops_s
        kv_bytes_layer = self._kv_bytes_per_token_layer
        hbm_bytes_s = self._hbm_bytes_s
        out = []
        for ctx in range(context_tokens, context_tokens + n * num_steps, n):
            dec_ctx_mean = ctx / n
            total = 0.0
            for count, gemm_s, moe_s, window in parts.layers:
                dec_pairs = n * (dec_ctx_mean if window is None else min(dec_ctx_mean, window))
                compute_s = (0.0 * prefill_pair_flops + dec_pairs * decode_pair_flops) / (
                    attn_flops_s
                )
                memory_s = dec_pairs * kv_bytes_layer / hbm_bytes_s
                layer_s = gemm_s + (memory_s if memory_s > compute_s else compute_s)
                if moe_s is not None:
                    layer_s += moe_s
                total += count * layer_s
            for part_s in parts.tail_s:
                total += part_s
            out.append(total + parts.overhead_s)
        return out

    def _decode_step_times_np(self, n: int, context_tokens: int, num_steps: int) -> list[float]:
        parts = self._decode_parts_for(n)
        ctx = np.arange(num_steps, dtype=np.int64) * n + context_tokens
        dec_ctx_mean = ctx / n
        total = np.zeros(num_steps)
        for count, gemm_s, moe_s, window in parts.layers:
            mean = dec_ctx_mean if window is None else np.minimum(dec_ctx_mean, float(window))
            dec_pairs = n * mean
            compute_s = (
                0.0 * self._prefill_attn_flops_per_pair
                + dec_pairs * self._decode_attn_flops_per_pair
            ) / self._attn_flops_s
            memory_s = dec_pairs * self._kv_bytes_per_token_layer / self._hbm_bytes_s
            layer_s = gemm_s + np.where(memory_s > compute_s, memory_s, compute_s)
            if moe_s is not None:
                layer_s += moe_s
            total += count * layer_s
        for part_s in parts.tail_s:
            total += part_s
        result: list[float] = (total + parts.overhead_s).tolist()
        return result

    def breakdown_s(self, batch: StepBatch) -> dict[str, float]:
        """Where one iteration's time goes (for the planner's explanations)."""
        total = self.step_time_s(batch)
        ar = 0.0
        if self._allreduces_per_layer and batch.num_seqs:
            ar = (
                self.model.num_layers
                * self._allreduces_per_layer
                * self._curve.all_reduce_s(batch.num_tokens * self._h * ACT_BYTES, self._tp)
            )
        return {
            "total_s": total,
            "allreduce_s": ar,
            "overhead_s": self._overhead_s if batch.num_seqs else 0.0,
            "compute_and_memory_s": max(0.0, total - ar - self._overhead_s),
        }
