"""The roofline step-time model: how long one engine iteration takes on one layout.

Per layer, on one GPU of the group:
* GEMMs (attention projections, dense MLP or shared experts, router), each module in its
  checkpoint format on its tensor-core path (`layer_costs`): compute (2 FLOPs per weight
  per token at the achieved tensor rate) and memory (weights + activations over HBM at the
  achieved bandwidth) overlap imperfectly: the time is their L3 norm, the shape the H200
  kernel measurements give across the ridge (a GEMM at the ridge point takes ~1.3x the
  larger of the two, not 1x nor 2x).
* Routed experts: only the experts the batch touches are read — for G tokens each picking
  k of E experts, E(1 - (1 - k/E)^G) distinct ones under uniform routing, fewer under the
  skewed popularity real routers show (`expert_routing`) — split over EP ranks (each
  expert over moe_tp GPUs), the busiest rank setting the pace; their FLOPs are the
  tokens' k expert MLPs. With attention data parallelism the MoE layers see the tokens of
  every DP rank.
* Attention: prefill FLOPs grow with the context each new token attends over (causal,
  capped by a sliding window); decode reads every cached K/V byte (MLA: the compressed
  latent, absorbed).
* Communication: TP all-reduces of the hidden states (two per layer): the engines' own
  NVLink kernels for small messages, else the measured NCCL bandwidth-vs-size curve; EP
  dispatch and combine all-to-alls per MoE layer under attention DP (under attention TP
  every GPU already holds every token and the TP all-reduce is the combine), the share
  to peers inside the NVLink domain at NVLink speed and the rest over the NIC (a GB200 /
  GB300 NVL72 rack is one 72-GPU domain); PP send/recv between stages.
* A fixed GPU time per kernel (`kernel_fixed_s`: ramp, tail and in-graph launch gap) for
  each GEMM and attention kernel of every layer: with the weights split 8 ways a small
  model's GEMVs are a few MB and this, not bandwidth, sets much of the step.
* lm_head for the sequences that sample; per-iteration engine overhead (scheduler,
  sampler) plus a per-sequence part; iterations the engine does not replay from a CUDA
  graph (prefill, or decode batches above the captured sizes) pay the kernel launches of
  every layer.

Everything that does not depend on the batch is computed once in __init__; `step_time_s`
does a few dozen float operations (the engine calls it every iteration).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from gpufleet.perf.calibration import Calibration, default_calibration
from gpufleet.perf.comm import CUSTOM_ALL_REDUCE_MAX_BYTES, AllReduceCurve, send_recv_s
from gpufleet.perf.decode_run import DecodeParts, decode_run_ends_s, decode_run_times_s
from gpufleet.perf.expert_routing import expert_routing
from gpufleet.perf.layer_costs import compute_dtype, layer_classes
from gpufleet.perf.moe_traffic import moe_activation_bytes
from gpufleet.perf.step_time import StepBatch
from gpufleet.specs.dtypes import BYTES_PER_PARAM
from gpufleet.specs.gpus import GpuSpec
from gpufleet.specs.models import ModelSpec
from gpufleet.specs.quant import FORMATS, QuantScheme

ACT_BYTES = 2.0  # activations and collective messages travel in bf16
# Activation bytes a token reads and writes per layer, in units of hidden_size (inputs and
# outputs of the projections and MLP, norms, residual): small next to weights in decode.
_ACT_IO_HIDDEN_PER_LAYER = 12.0
# Compute and memory overlap imperfectly in a GEMM: time = (c^3 + m^3)^(1/3), the shape that
# fits the H200 kernel measurements across the ridge (`_soft_max`).
NETWORK_LATENCY_S = 5e-6  # one RDMA hop between nodes (InfiniBand / RoCE), per call


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


def kv_bytes_per_element(kv_dtype: str) -> float:
    return BYTES_PER_PARAM["bf16"] if kv_dtype in ("auto", "") else BYTES_PER_PARAM[kv_dtype]


def _soft_max(a: float, b: float) -> float:
    if a <= 0.0:
        return b
    if b <= 0.0:
        return a
    big = a if a > b else b
    ra, rb = a / big, b / big
    return big * math.cbrt(ra * ra * ra + rb * rb * rb)


def _custom_max_bytes(gpu: GpuSpec, group_gpus: int) -> float:
    """The engines' own all-reduce kernels need NVLink peer-to-peer access to every peer."""
    if gpu.nvlink_gbps > 0 and group_gpus <= gpu.domain_gpus:
        return CUSTOM_ALL_REDUCE_MAX_BYTES
    return 0.0


class RooflineStepTimeModel:
    """`StepTimeModel` for one layout: `step_time_s(batch)` is one iteration end to end
    (all pipeline stages). `pipeline_stages` tells the engine how many micro-batches it may
    keep in flight: a new one may start every step_time_s / pipeline_stages.

    attention_dp: attention data-parallel ranks (default: the layout's `dp`, else 1); the
    batch given is one rank's, and the MoE layers see every rank's tokens. scheme: the
    per-module weight formats (default: the model's at the layout's weight dtype);
    moe_weight_dtype: the experts' format when it differs from the scheme's.
    cuda_graph_max_batch: the largest decode batch the engine replays from a CUDA graph
    (None: every iteration is replayed, no launch overhead).
    moe_padded_expert_rows: rows the engine's grouped GEMM computes for every local expert
    each step, routed to or not (`plan.engines.moe_padded_expert_rows`; 0: only the
    experts the batch touches are read).
    """

    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        layout: LayoutLike,
        *,
        calibration: Calibration | None = None,
        backend: str | None = None,
        attention_dp: int | None = None,
        scheme: QuantScheme | None = None,
        moe_weight_dtype: str | None = None,
        cuda_graph_max_batch: int | None = None,
        moe_padded_expert_rows: int = 0,
    ) -> None:
        cal = calibration or default_calibration()
        self.model = model
        self.gpu = gpu
        self.layout = layout
        self.pipeline_stages = max(1, layout.pp)
        dp = attention_dp if attention_dp is not None else int(getattr(layout, "dp", 1))
        tp, dp = max(1, layout.tp), max(1, dp)
        ep = max(1, min(layout.ep, tp * dp))
        self._tp, self._ep, self._dp = tp, ep, dp
        stage_gpus = tp * dp
        moe_tp = max(1, stage_gpus // ep)
        b = cal.backend(backend)
        self._overhead_s = b.step_overhead_s
        self._seq_overhead_s = b.seq_overhead_s
        self._eager_s = b.eager_layer_overhead_s * model.num_layers
        self._moe_fixed_s = b.moe_layer_overhead_s * model.num_moe_layers if model.moe else 0.0
        self._graph_max = cuda_graph_max_batch

        sch = scheme or model.weight_scheme(layout.weight_dtype)
        self._classes = layer_classes(
            model, gpu, sch, tp=tp, moe_tp=moe_tp, gemm_efficiency=cal.gemm_efficiency
        )
        # Per class: the fixed GPU time of its kernels, beside the roofline's bytes and FLOPs.
        self._classes_fixed_s = tuple((c, c.kernels * cal.kernel_fixed_s) for c in self._classes)
        self._hbm_bytes_s = gpu.hbm_gbps * 1e9 * cal.memory_efficiency
        self._attn_flops_s = gpu.tflops("bf16") * 1e12 * cal.attention_efficiency
        h = model.hidden_size
        self._h = h
        self._act_io_bytes_per_token = _ACT_IO_HIDDEN_PER_LAYER * h * ACT_BYTES

        # Routed experts (format of the first MoE layer's experts).
        moe = model.moe
        first_moe = next((i for i, s in enumerate(model.layers) if s.is_moe), 0)
        exp_fmt = (
            FORMATS[moe_weight_dtype] if moe_weight_dtype else sch.format(first_moe, "experts")
        )
        self._num_experts = moe.num_experts if moe else 0
        self._top_k = moe.experts_per_token if moe else 0
        self._routing = (
            expert_routing(moe.num_experts, moe.experts_per_token, cal.routing_skew, ep)
            if moe
            else None
        )
        expert_params_gpu = model.expert_params() / moe_tp if moe else 0.0
        # An engine that computes a padded block for every local expert reads them all
        # each step and multiplies their padding rows (`_moe_s`).
        self._pad_rows = max(0, moe_padded_expert_rows)
        self._local_experts = math.ceil(moe.num_experts / ep) if moe else 0
        self._expert_bytes = expert_params_gpu * exp_fmt.bytes_per_param
        # Activation bytes each token-expert assignment moves (`moe_activation_bytes`).
        inter = moe.expert_intermediate_size / moe_tp if moe else 0.0
        self._moe_gemm_act_bytes, self._moe_side_act_bytes = moe_activation_bytes(
            h, inter, self._top_k, ACT_BYTES
        )
        self._expert_flops_per_assignment = 2.0 * expert_params_gpu
        self._moe_gpus = stage_gpus
        # The experts' dense GEMM rate (DeepGEMM's padding runs at it), and the fused-MoE
        # kernels' share of it.
        self._pad_flops_s = gpu.tflops(compute_dtype(exp_fmt, gpu)) * 1e12 * cal.gemm_efficiency
        self._moe_flops_s = self._pad_flops_s * b.moe_gemm_efficiency
        # Expert reads at the backend's share of the dense kernels' bandwidth, never past
        # HBM peak (an efficiency product above 1 is no physical kernel).
        self._moe_hbm_bytes_s = min(gpu.hbm_gbps * 1e9, self._hbm_bytes_s * b.moe_efficiency)

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

        # lm_head (vocab split over TP) reads its weights once per iteration.
        lm_fmt = sch.format(0, "lm_head")
        lm_params = model.vocab_size * h / tp
        self._lm_bytes = lm_params * lm_fmt.bytes_per_param
        self._lm_flops_per_seq = 2.0 * lm_params
        self._lm_flops_s = gpu.tflops(compute_dtype(lm_fmt, gpu)) * 1e12 * cal.gemm_efficiency

        # Communication: TP inside its group's fabric; EP over the stage's GPUs.
        self._curve = AllReduceCurve(
            gpu.link_gbps(tp), cal.allreduce_latency_s, _custom_max_bytes(gpu, tp)
        )
        self._allreduces_per_layer = 2 if tp > 1 else 0
        self._latency_s = cal.allreduce_latency_s
        domain = gpu.domain_gpus
        peers = stage_gpus - 1
        off = max(0, stage_gpus - domain)  # peers reached over the network
        self._a2a_on_share = (peers - off) / peers if peers else 0.0
        self._a2a_off_share = off / peers if peers else 0.0
        self._nvlink_gbps = gpu.intra_node_gbps
        self._net_gbps = gpu.network_gbps
        # DP attention with TP-sharded experts: the MoE layers gather every rank's tokens
        # and scatter the result back (an all-reduce-sized exchange over the stage).
        self._dp_curve = AllReduceCurve(
            gpu.link_gbps(stage_gpus), cal.allreduce_latency_s, _custom_max_bytes(gpu, stage_gpus)
        )
        group = stage_gpus * max(1, layout.pp)
        self._pp_link_gbps = gpu.link_gbps(group)
        # decode batch size -> the parts of a decode step's time that do not depend on context
        self._decode_parts: dict[int, DecodeParts] = {}

    # ---------------------------------------------------------------------------------

    def _overheads_s(self, n_seqs: int, n_dec: int, has_prefill: bool) -> float:
        s = self._overhead_s + self._seq_overhead_s * n_seqs + self._moe_fixed_s
        if self._graph_max is not None and (has_prefill or n_dec > self._graph_max):
            s += self._eager_s
        return s

    def step_time_s(self, batch: StepBatch) -> float:
        prefill_tokens = batch.prefill_tokens
        prefill_ctx = batch.prefill_context_tokens
        n_dec = batch.num_decode
        n_seqs = len(prefill_tokens) + n_dec
        if n_seqs == 0:
            return 0.0
        tokens = sum(prefill_tokens) + n_dec
        dec_ctx_mean = batch.decode_context_tokens / n_dec if n_dec else 0.0

        full_pairs = 0.0
        for i, n in enumerate(prefill_tokens):  # (compiled: no generic zip call)
            full_pairs += n * (prefill_ctx[i] + (n + 1) / 2.0)
        moe_s = self._moe_s(tokens) if self._num_experts else 0.0

        hbm_bytes_s = self._hbm_bytes_s
        act_io = tokens * self._act_io_bytes_per_token
        prefill_pair_flops = self._prefill_attn_flops_per_pair
        decode_pair_flops = self._decode_attn_flops_per_pair
        attn_flops_s = self._attn_flops_s
        kv_bytes_layer = self._kv_bytes_per_token_layer
        total = 0.0
        for cls, fixed_s in self._classes_fixed_s:
            gemm_s = (
                _soft_max(tokens * cls.gemm_s_per_token, (cls.weight_bytes + act_io) / hbm_bytes_s)
                + fixed_s
            )
            window = cls.window
            if window is None:
                pairs, dec_pairs = full_pairs, n_dec * dec_ctx_mean
            else:
                pairs = 0.0
                for i, n in enumerate(prefill_tokens):
                    pairs += n * min(prefill_ctx[i] + (n + 1) / 2.0, window)
                dec_pairs = n_dec * min(dec_ctx_mean, window)
            compute_s = (pairs * prefill_pair_flops + dec_pairs * decode_pair_flops) / attn_flops_s
            memory_s = dec_pairs * kv_bytes_layer / hbm_bytes_s
            attn_s = memory_s if memory_s > compute_s else compute_s
            layer_s = gemm_s + attn_s
            if cls.is_moe:
                layer_s += moe_s
            total += cls.count * layer_s

        total += self._allreduce_s(tokens)
        compute_s = n_seqs * self._lm_flops_per_seq / self._lm_flops_s
        memory_s = self._lm_bytes / hbm_bytes_s
        total += memory_s if memory_s > compute_s else compute_s
        if self.pipeline_stages > 1:
            hop = send_recv_s(tokens * self._h * ACT_BYTES, self._pp_link_gbps, 5e-6)
            total += (self.pipeline_stages - 1) * hop
        return total + self._overheads_s(n_seqs, n_dec, bool(prefill_tokens))

    def _allreduce_s(self, tokens: int) -> float:
        if not self._allreduces_per_layer:
            return 0.0
        ar = self._curve.all_reduce_s(tokens * self._h * ACT_BYTES, self._tp)
        return self.model.num_layers * self._allreduces_per_layer * ar

    def _moe_s(self, tokens: int) -> float:
        """Routed experts on one GPU for one MoE layer, plus the token exchange."""
        global_tokens = tokens * self._dp
        routing = self._routing
        assert routing is not None
        # Token-expert pairs the busiest EP rank's experts receive; each of its moe_tp GPUs
        # computes its 1/moe_tp slice of every one (the per-assignment FLOPs are a slice).
        assignments = global_tokens * self._top_k * routing.busiest_assignment_share
        flops_s = assignments * self._expert_flops_per_assignment / self._moe_flops_s
        if self._pad_rows:
            # Every local expert gets a block of pad_rows rows, its tokens filling it first:
            # all of them are read, and the padding is multiplied as one dense fp8 GEMM per
            # block (DeepGEMM) at the dense GEMMs' rate, not the fused-MoE path's.
            touched = float(self._local_experts)
            padding = self._local_experts * (self._pad_rows - 1)
            flops_s += padding * self._expert_flops_per_assignment / self._pad_flops_s
        else:
            touched = routing.rank_distinct_experts(global_tokens)
        expert_s = max(
            flops_s,
            (touched * self._expert_bytes + assignments * self._moe_gemm_act_bytes)
            / self._moe_hbm_bytes_s,
        )
        # The kernels between the grouped GEMMs (gated activation, top-k combine) stream
        # every assignment's activations once more, at the copy bandwidth.
        side_s = assignments * self._moe_side_act_bytes / self._hbm_bytes_s
        return expert_s + side_s + self._exchange_s(tokens)

    def _exchange_s(self, tokens: int) -> float:
        """One MoE layer's token exchange between the GPUs holding experts."""
        if self._ep > 1 and self._dp == 1:
            # Attention TP leaves every token on every GPU of the group: each EP rank runs
            # its own experts on them and the layer's TP all-reduce (`_allreduce_s`) sums
            # the ranks' outputs. No dispatch; the combine is that all-reduce (vLLM,
            # SGLang and TRT-LLM all run EP without attention DP this way).
            return 0.0
        if self._ep > 1:
            # Attention DP: each rank holds only its own tokens. Dispatch and combine:
            # each GPU sends its tokens' k copies out and back.
            local = tokens / self._tp
            return 2.0 * self._a2a_s(local * self._top_k * self._h * ACT_BYTES)
        if self._dp > 1:
            global_bytes = tokens * self._dp * self._h * ACT_BYTES
            return self._dp_curve.all_reduce_s(global_bytes, self._moe_gpus)
        return 0.0

    def _a2a_s(self, bytes_per_gpu: float) -> float:
        """One all-to-all over the stage's GPUs: NVLink to domain peers, NIC to the rest."""
        on = bytes_per_gpu * self._a2a_on_share / (self._nvlink_gbps * 1e9)
        if self._a2a_off_share <= 0.0:
            return self._latency_s + on
        off = bytes_per_gpu * self._a2a_off_share / (self._net_gbps * 1e9)
        return self._latency_s + NETWORK_LATENCY_S + max(on, off)

    # ---------------------------------------------------------------- decode runs

    def decode_step_times_s(
        self, num_decode: int, context_tokens: int, num_steps: int
    ) -> list[float]:
        """`step_time_s` of each step of a decode run (see `perf.step_time.DecodeStepTimes`)."""
        parts = self._decode_parts.get(num_decode) or self._decode_parts_for(num_decode)
        return decode_run_times_s(parts, num_decode, context_tokens, num_steps)

    def decode_step_ends_s(
        self,
        num_decode: int,
        context_tokens: int,
        num_steps: int,
        start_s: float,
        extra_s: float | None = None,
    ) -> Sequence[float]:
        """When each step of a decode run ends (see `perf.step_time.decode_step_ends_fn`)."""
        parts = self._decode_parts.get(num_decode) or self._decode_parts_for(num_decode)
        return decode_run_ends_s(parts, num_decode, context_tokens, num_steps, start_s, extra_s)

    def _decode_parts_for(self, n: int) -> DecodeParts:
        """step_time_s's terms for a decode-only batch of n that do not depend on context."""
        moe_s = self._moe_s(n) if self._num_experts else 0.0
        act_io = n * self._act_io_bytes_per_token
        layers = []
        for cls, fixed_s in self._classes_fixed_s:
            gemm_s = (
                _soft_max(n * cls.gemm_s_per_token, (cls.weight_bytes + act_io) / self._hbm_bytes_s)
                + fixed_s
            )
            layers.append((cls.count, gemm_s, moe_s if cls.is_moe else None, cls.window))
        tail = [self._allreduce_s(n)] if self._allreduces_per_layer else []
        compute_s = n * self._lm_flops_per_seq / self._lm_flops_s
        memory_s = self._lm_bytes / self._hbm_bytes_s
        tail.append(memory_s if memory_s > compute_s else compute_s)
        if self.pipeline_stages > 1:
            hop = send_recv_s(n * self._h * ACT_BYTES, self._pp_link_gbps, 5e-6)
            tail.append((self.pipeline_stages - 1) * hop)
        parts = DecodeParts(
            tuple(layers),
            tuple(tail),
            self._overheads_s(n, n, False),
            self._decode_attn_flops_per_pair,
            self._attn_flops_s,
            self._kv_bytes_per_token_layer,
            self._hbm_bytes_s,
        )
        self._decode_parts[n] = parts
        return parts

    def breakdown_s(self, batch: StepBatch) -> dict[str, float]:
        """Where one iteration's time goes (for the planner's explanations)."""
        total = self.step_time_s(batch)
        ar = self._allreduce_s(batch.num_tokens) if batch.num_seqs else 0.0
        overhead = (
            self._overheads_s(batch.num_seqs, batch.num_decode, bool(batch.prefill_tokens))
            if batch.num_seqs
            else 0.0
        )
        exchange = 0.0
        if self._num_experts and batch.num_seqs:
            exchange = self.model.num_moe_layers * self._exchange_s(batch.num_tokens)
        return {
            "total_s": total,
            "allreduce_s": ar,
            "exchange_s": exchange,
            "overhead_s": overhead,
            "compute_and_memory_s": max(0.0, total - ar - exchange - overhead),
        }
