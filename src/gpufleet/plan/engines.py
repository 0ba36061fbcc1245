"""The serving engines' own rules, as their documentation and source state them: how much
memory the KV cache gets, which requests they admit, how they schedule prefill, how large a
batch their CUDA graphs cover.

* vLLM (V1): the KV cache gets `--gpu-memory-utilization` (0.9) × total GPU memory, less
  the weights, the activation peak of one profiling pass of max_num_batched_tokens tokens
  and the non-torch memory that pass allocates (NCCL, cuBLAS workspaces). It admits a
  request when blocks for its prompt are free, and preempts (recomputes) when decoding
  runs out of blocks, so a request holds the blocks it has filled: prompt + tokens so
  far. Chunked prefill shares iterations with decodes (budget 8192 tokens on ≥ 70 GiB
  GPUs other than the A100, 2048 on those; max_num_seqs 1024 / 256). CUDA graphs cover
  batches up to 512.
* SGLang: `--mem-fraction-static` of total memory holds weights + KV pool; the default is
  (total − reserved) / total with reserved = 512 MiB + 1.5 × max(chunked_prefill_size,
  2048) MiB + 2 × cuda_graph_max_bs MiB + tp × pp / 8 GiB, at least 10 GiB on > 60 GiB
  GPUs (server_args._handle_gpu_memory_settings). The pool is that fraction of the memory
  free before loading (after the CUDA context and the process groups) less what loading
  took (ModelRunner.profile_max_num_token). It admits a request when
  its prompt plus `new_token_ratio` × its max new tokens fit beside the running requests'
  own reservations (the ratio decays from 0.7 towards ~0.1 while nothing is retracted);
  prefill batches run as iterations of their own (no mixed chunks by default); chunked
  prefill 8192 tokens on 60–160 GiB GPUs, 16384 above, 4096 / 2048 below.
* TensorRT-LLM (trtllm-serve, PyTorch backend): the KV cache gets
  `kv_cache_free_gpu_memory_fraction` (0.9) of the memory still free after the weights and
  an activation-profiling pass; the default GUARANTEED_NO_EVICT scheduler admits a request
  only with blocks reserved for its whole input + max output; in-flight batching mixes
  context and generation (max_num_tokens 8192, max_batch_size 2048); CUDA graphs up to
  batch 128 (the LLM API's cuda_graph_config default).

SGLang and TRT-LLM (PyTorch backend) overlap scheduling with the GPU by default: the next
iteration's batch is formed while the current one runs, so a new request joins one
iteration later than it would otherwise. vLLM's async scheduling is opt-in
(`--async-scheduling`).

Routed experts in block-scaled fp8 on Hopper: vLLM (<= 0.12) runs them through DeepGEMM's
contiguous grouped GEMM unless TP is 8 (fp8.py's backend choice; PR #29346 turned it off
at TP 8 only). Without EP token counts on the host it sizes that GEMM for the worst case,
M x top_k + local_experts x 127 rows rounded to 128 (deep_gemm_utils.compute_aligned_M),
so every step computes a 128-row block for every local expert: decode reads all of its
experts' weights whatever the batch (`moe_padded_expert_rows`). SGLang (fused_moe_triton)
and TRT-LLM pad only the experts the batch routes to.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.errors import UserError
from gpufleet.specs.gpus import GpuSpec
from gpufleet.specs.models import ModelSpec
from gpufleet.specs.quant import QuantScheme

GIB = 1 << 30
MIB = 1 << 20
ENGINES = ("vllm", "sglang", "trtllm")
# DeepGEMM's M alignment of the contiguous (grouped) layout on Hopper.
DEEPGEMM_BLOCK_ROWS = 128


def moe_padded_expert_rows(
    engine: str, gpu: GpuSpec, model: ModelSpec, scheme: QuantScheme, tp: int
) -> int:
    """Rows the engine's MoE GEMM computes for every local expert each step whether the
    batch routes tokens to it or not (0: only the routed experts are computed). vLLM's
    DeepGEMM path for block-scaled fp8 experts on Hopper (see the module notes)."""
    if model.moe is None:
        return 0
    first_moe = next((i for i, spec in enumerate(model.layers) if spec.is_moe), 0)
    experts = scheme.format(first_moe, "experts")
    block_fp8 = experts.name == "fp8" and experts.bytes_per_param > 1.0
    hopper = gpu.architecture == "hopper"  # DeepGEMM's sm90 kernels
    if engine.lower() == "vllm" and block_fp8 and hopper and tp != 8:
        return DEEPGEMM_BLOCK_ROWS
    return 0


@dataclass(frozen=True)
class EngineRules:
    """One engine's defaults on one GPU and layout."""

    name: str
    memory_fraction: float  # the engine's own flag's default
    memory_fraction_flag: str
    max_num_batched_tokens: int  # token budget per iteration (chunked prefill size)
    max_num_seqs: int  # requests running at once, at most
    mixed_prefill: bool  # prefill chunks share iterations with decodes
    cuda_graph_max_batch: int  # decode batches above this run without CUDA graphs
    block_tokens: int  # KV block (page) size
    # The scheduler builds iteration i+1 while the GPU runs iteration i (SGLang's overlap
    # schedule, TRT-LLM's overlap scheduler: both on by default; vLLM's async scheduling is
    # opt-in): a request that arrives during iteration i waits for i+1 as well.
    overlap_scheduling: bool = False
    # TRT-LLM's batch waiting (batch_wait_timeout_iters, batch_wait_max_tokens_ratio of
    # max_num_tokens): off by default, set by some launch recipes (see closed_loop).
    batch_wait_iters: int = 0
    batch_wait_max_tokens_ratio: float = 0.0
    # TRT-LLM's attention-DP balancing (attention_dp_config: enable_balance, timeout_iters;
    # off by default, set by some launch recipes): 0 when off.
    adp_balance_timeout_iters: int = 0
    # TRT-LLM's multi-token prediction (speculative_config decoding_type MTP,
    # num_nextn_predict_layers): draft tokens per sequence per iteration; off (0) by
    # default, set by some launch recipes (`perf.speculative`).
    mtp_draft_tokens: int = 0

    def admission_tokens(self, input_tokens: int, output_tokens: int) -> float:
        """KV tokens one running request counts against the cache, on average over its
        life, under the engine's admission rule."""
        if self.name == "trtllm":  # GUARANTEED_NO_EVICT: the whole request, reserved
            return float(input_tokens + output_tokens)
        held = input_tokens + output_tokens / 2.0  # blocks filled so far, on average
        if self.name == "sglang":  # plus the decayed reservation of what is still to come
            return held + SGLANG_MIN_NEW_TOKEN_RATIO * sglang_mean_reserved_tokens(output_tokens)
        return held


# SGLang's scheduler defaults (python/sglang/srt: managers/schedule_policy.py PrefillAdder,
# managers/scheduler.py, model_executor/model_runner.py, env SGLANG_* defaults):
# - new_token_ratio starts at SGLANG_INIT_NEW_TOKEN_RATIO x --schedule-conservativeness (1.0)
#   and decays by (init - min) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS every decode step to
#   init x SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR; a retraction raises it again.
SGLANG_INIT_NEW_TOKEN_RATIO = 0.7
SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS = 600
SGLANG_MIN_NEW_TOKEN_RATIO = SGLANG_INIT_NEW_TOKEN_RATIO * SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
# A running request reserves new_token_ratio x min(max_new_tokens - generated, this) KV
# tokens (SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION); a request joining a prefill batch
# reserves its prompt plus min(max_new_tokens, this) at ratio 1 for that batch.
SGLANG_CLIP_MAX_NEW_TOKENS = 4096
# --max-prefill-tokens: prompt tokens one prefill batch takes at most; the chunk budget
# (--chunked-prefill-size, `_sglang_sizes`) caps it first on every GPU up to 16384.
SGLANG_MAX_PREFILL_TOKENS = 16384
# max_running_requests when not given: the request pool, KV tokens / context_len x 512
# clamped to [2048, 4096], and at most KV tokens / 2 (ModelRunner's max_num_reqs).
SGLANG_REQUESTS_PER_CONTEXT = 512
SGLANG_MIN_REQUEST_POOL = 2048
SGLANG_MAX_REQUEST_POOL = 4096


def sglang_mean_reserved_tokens(output_tokens: int) -> float:
    """Mean over a running request's life of min(tokens still to generate,
    SGLANG_CLIP_MAX_NEW_TOKENS): what SGLang's admission reserves for it, per unit of
    new_token_ratio (generated tokens spread evenly over 0 .. output_tokens)."""
    clip = SGLANG_CLIP_MAX_NEW_TOKENS
    if output_tokens <= clip:
        return output_tokens / 2.0
    return clip - clip * clip / (2.0 * output_tokens)


def sglang_max_running_requests(kv_capacity_tokens: int, context_tokens: int) -> int:
    """SGLang's default max_running_requests for a KV pool of `kv_capacity_tokens` and a
    model context of `context_tokens` (ModelRunner: the request pool, then the KV half)."""
    pool = int(kv_capacity_tokens / max(1, context_tokens) * SGLANG_REQUESTS_PER_CONTEXT)
    pool = min(max(pool, SGLANG_MIN_REQUEST_POOL), SGLANG_MAX_REQUEST_POOL)
    return max(1, min(pool, kv_capacity_tokens // 2))


def engine_max_running(rules: EngineRules, kv_capacity_tokens: int, context_tokens: int) -> int:
    """Requests the engine runs at once at most by its own default, before its KV
    admission rule: vLLM's and TRT-LLM's fixed max_num_seqs / max_batch_size, SGLang's
    from its KV pool and the model's context (`sglang_max_running_requests`)."""
    if rules.name == "sglang":
        return min(
            rules.max_num_seqs, sglang_max_running_requests(kv_capacity_tokens, context_tokens)
        )
    return rules.max_num_seqs


def kv_admitted_running(
    rules: EngineRules,
    kv_capacity_tokens: int,
    tokens_per_request: float,
    context_tokens: int | None,
    max_num_seqs: int | None = None,
) -> int:
    """Requests the engine runs at once: `max_num_seqs` when set, else its own default for
    its KV pool (`engine_max_running`; the fixed default without a model context), and
    fewer when its KV cache holds fewer requests of `tokens_per_request` tokens (its
    admission footprint; 0: no such bound). 0 when the cache holds not one request: the
    caller names the shortfall, since only it knows the layout."""
    if max_num_seqs:
        running = max_num_seqs
    elif context_tokens:
        running = engine_max_running(rules, kv_capacity_tokens, context_tokens)
    else:
        running = rules.max_num_seqs
    if tokens_per_request > 0:
        running = min(running, int(kv_capacity_tokens // tokens_per_request))
    return max(0, running)


def _sglang_sizes(gpu: GpuSpec, tp: int) -> tuple[int, int]:
    """SGLang's (chunked_prefill_size, cuda_graph_max_bs) defaults by GPU memory."""
    mem = gpu.memory_bytes
    if mem < 20 * GIB:
        return 2048, 8 if tp < 4 else 80
    if mem < 35 * GIB:
        return 2048, 24 if tp < 4 else 80
    if mem < 60 * GIB:
        return 4096, 32 if tp < 4 else 160
    if mem < 160 * GIB:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def sglang_mem_fraction_static(gpu: GpuSpec, tp: int, pp: int = 1, dp_attention: int = 1) -> float:
    """SGLang's default --mem-fraction-static (server_args._handle_gpu_memory_settings)."""
    chunk, graph_bs = _sglang_sizes(gpu, tp)
    gpu_mib = gpu.memory_bytes / MIB
    reserved = 512 + max(chunk, 2048) * 1.5 + graph_bs * 2 + tp * pp / 8 * 1024
    if dp_attention > 1:
        reserved += graph_bs * dp_attention * 3
        if graph_bs > 300:
            reserved += graph_bs * dp_attention * 1.5
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mib - reserved) / gpu_mib, 3)


def engine_rules(
    engine: str,
    gpu: GpuSpec,
    *,
    tp: int = 1,
    pp: int = 1,
    dp: int = 1,
    memory_fraction: float | None = None,
) -> EngineRules:
    """The engine's defaults for a layout of tp × dp × pp GPUs; `memory_fraction`
    overrides its memory flag (--gpu-memory-utilization, --mem-fraction-static,
    kv_cache_free_gpu_memory_fraction)."""
    name = engine.lower()
    if memory_fraction is not None and not 0.0 < memory_fraction <= 1.0:
        raise UserError(
            f"memory fraction {memory_fraction} is outside (0, 1]",
            field="--gpu-memory-utilization",
            fix="use a fraction such as 0.9",
        )
    # vLLM's larger serving defaults are for >= 70 GiB GPUs other than the A100
    # (EngineArgs._set_default_args: "a100" not in the device name).
    big = gpu.memory_bytes >= 70 * GIB and not gpu.name.startswith("a100")
    if name == "vllm":
        return EngineRules(
            name, memory_fraction or 0.9, "--gpu-memory-utilization",
            8192 if big else 2048, 1024 if big else 256, True, 512, 16,
        )  # fmt: skip
    if name == "sglang":
        chunk, graph_bs = _sglang_sizes(gpu, tp)
        frac = memory_fraction or sglang_mem_fraction_static(gpu, tp, pp, dp)
        return EngineRules(
            name, frac, "--mem-fraction-static", min(chunk, SGLANG_MAX_PREFILL_TOKENS),
            SGLANG_MAX_REQUEST_POOL, False, graph_bs, 1, True,
        )  # fmt: skip
    if name == "trtllm":
        return EngineRules(
            name, memory_fraction or 0.9, "--kv_cache_free_gpu_memory_fraction",
            8192, 2048, True, 128, 32, True,
        )  # fmt: skip
    raise UserError(
        f"unknown engine {engine!r}", field="--engine", fix=f"use one of {', '.join(ENGINES)}"
    )
