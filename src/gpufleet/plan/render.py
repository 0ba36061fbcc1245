"""Launch commands for a chosen layout: `vllm serve …`, `python -m sglang.launch_server …`
and `trtllm-serve …`.

Flag spellings follow the engines' documented CLIs (vLLM engine args; SGLang server
arguments; trtllm-serve options). A checkpoint whose config.json carries its quantization
(DeepSeek's fp8, gpt-oss' MXFP4, NVFP4 / AWQ exports) needs no --quantization flag: the
engines read it. The memory flag of each engine carries its own default (vLLM 0.9, SGLang's
computed --mem-fraction-static, TRT-LLM's 0.9 of free memory) unless the plan set one.

Parallelism, as each engine spells it for tp attention ranks × dp attention data-parallel
groups with experts over ep GPUs:
* vLLM: --tensor-parallel-size tp --data-parallel-size dp --enable-expert-parallel;
* SGLang: --tp-size tp×dp --dp-size dp --enable-dp-attention --ep-size ep (its --tp-size
  counts every GPU of the group);
* TRT-LLM: --tp_size tp×dp --ep_size ep, attention DP in the extra options file.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.plan.engines import engine_rules
from gpufleet.plan.layout import Layout
from gpufleet.specs.gpus import GpuSpec
from gpufleet.specs.models import ModelSpec


@dataclass(frozen=True)
class LaunchCommands:
    vllm: str
    sglang: str
    notes: tuple[str, ...]
    trtllm: str = ""


@dataclass(frozen=True)
class DisaggCommands:
    """Disaggregated prefill / decode: one command per pool and engine, and the router in
    front that sends each request to a prefill worker and then to a decode worker."""

    vllm_prefill: str
    vllm_decode: str
    vllm_router: str
    sglang_prefill: str
    sglang_decode: str
    sglang_router: str
    notes: tuple[str, ...]


def _quantization(model: ModelSpec, layout: Layout, gpu: GpuSpec) -> tuple[str | None, str | None]:
    """(vLLM --quantization value or None, a note for the user or None)."""
    w = layout.weight_dtype
    if w == model.checkpoint_dtype:
        return None, None
    if w == "fp8":
        return "fp8", None  # vLLM and SGLang quantize bf16 weights to fp8 at load time
    if w == "int4":
        # Marlin kernels are CUDA only: AMD (CDNA) GPUs take the plain AWQ path.
        method = "awq" if gpu.architecture.startswith("cdna") else "awq_marlin"
        return method, "int4 needs an AWQ int4 checkpoint of this model as --model"
    if w == "int8":
        return None, "int8 (W8A8) needs a compressed-tensors int8 checkpoint as --model"
    if w == "nvfp4":
        where = "" if gpu.supports("fp4") else f" ({gpu.name} has no fp4 tensor cores: W4A16)"
        return None, f"nvfp4 needs an NVFP4 checkpoint of this model as --model{where}"
    if w == "mxfp4":
        return None, "mxfp4 needs an MXFP4 checkpoint of this model as --model"
    if w == "bf16":
        return None, f"bf16 needs a bf16 copy of this {model.checkpoint_dtype} checkpoint"
    return None, None


def _join(parts: list[str]) -> str:
    return " \\\n    ".join(parts)


def render_launch_commands(
    model: ModelSpec,
    gpu: GpuSpec,
    layout: Layout,
    *,
    max_model_len: int,
    gpu_memory_utilization: float | None = None,
    gpus_per_node: int = 8,
    port: int = 8000,
) -> LaunchCommands:
    quantization, note = _quantization(model, layout, gpu)
    notes: list[str] = [note] if note else []
    nodes = -(-layout.num_gpus // gpus_per_node)
    multi_node = nodes > 1
    moe = model.moe is not None
    group = layout.stage_gpus  # the GPUs of one pipeline stage (attention groups together)

    def frac(engine: str) -> float:
        rules = engine_rules(engine, gpu, tp=layout.tp, pp=layout.pp, dp=layout.dp,
                             memory_fraction=gpu_memory_utilization)  # fmt: skip
        return rules.memory_fraction

    vllm = [f"vllm serve {model.name}", f"--tensor-parallel-size {layout.tp}"]
    if layout.pp > 1:
        vllm.append(f"--pipeline-parallel-size {layout.pp}")
    if layout.dp > 1:
        vllm.append(f"--data-parallel-size {layout.dp}")
    if layout.ep > 1 and moe:
        vllm.append("--enable-expert-parallel")
    if multi_node and layout.pp > 1:
        vllm.append("--distributed-executor-backend ray")
        notes.append(
            f"vLLM spans {nodes} nodes through Ray: `ray start --head` on one node, "
            "`ray start --address <head>:6379` on the others, then run vllm serve on the head"
        )
    elif multi_node and layout.dp > 1:
        local = max(1, gpus_per_node // layout.tp)
        vllm += [f"--data-parallel-size-local {local}", "--data-parallel-address <head-ip>",
                 "--data-parallel-rpc-port 13345"]  # fmt: skip
        notes.append(
            f"vLLM data parallel over {nodes} nodes: this command on the head; on node i add "
            f"--headless --data-parallel-start-rank {local}*i (same other flags)"
        )
    if layout.ep > 1 and group > gpu.gpus_per_node:
        notes.append(
            "expert parallelism across nodes: set VLLM_ALL2ALL_BACKEND=deepep_low_latency "
            "(decode) or deepep_high_throughput (prefill) for vLLM, --moe-a2a-backend deepep "
            "for SGLang"
        )
    if quantization:
        vllm.append(f"--quantization {quantization}")
    if layout.kv_dtype == "fp8":
        vllm.append("--kv-cache-dtype fp8")
    vllm += [
        f"--max-model-len {max_model_len}",
        f"--gpu-memory-utilization {frac('vllm'):g}",
        "--enable-prefix-caching",
        f"--port {port}",
    ]

    sglang = [f"python -m sglang.launch_server --model-path {model.name}", f"--tp-size {group}"]
    if layout.dp > 1:
        sglang += [f"--dp-size {layout.dp}", "--enable-dp-attention"]
    if layout.pp > 1:
        sglang.append(f"--pp-size {layout.pp}")
    if layout.ep > 1 and moe:
        sglang.append(f"--ep-size {layout.ep}")
        if group > gpu.gpus_per_node:
            sglang.append("--moe-a2a-backend deepep")
    if quantization == "fp8":
        sglang.append("--quantization fp8")
    elif quantization in ("awq_marlin", "awq"):
        sglang.append("--quantization awq")
    if layout.kv_dtype == "fp8":
        sglang.append("--kv-cache-dtype fp8_e4m3")
    sglang += [f"--context-length {max_model_len}", f"--mem-fraction-static {frac('sglang'):g}"]
    if multi_node:
        sglang += [f"--nnodes {nodes}", "--node-rank 0", "--dist-init-addr <head-ip>:5000"]
        notes.append(f"SGLang: run the same command on every node with --node-rank 0..{nodes - 1}")
    sglang += ["--host 0.0.0.0", f"--port {port}"]

    trt = [f"trtllm-serve {model.name}", f"--tp_size {group}"]
    if layout.pp > 1:
        trt.append(f"--pp_size {layout.pp}")
    if layout.ep > 1 and moe:
        trt.append(f"--ep_size {layout.ep}")
    trt += [
        f"--max_seq_len {max_model_len}",
        f"--kv_cache_free_gpu_memory_fraction {frac('trtllm'):g}",
    ]
    if layout.dp > 1:
        # The file's content goes in a note: a `# comment` inside the command would swallow
        # the line's backslash and cut the command there when pasted into a shell.
        trt.append("--extra_llm_api_options extra.yaml")
        notes.append("TRT-LLM attention DP: extra.yaml holds `enable_attention_dp: true`")
    if multi_node:
        notes.append(f"TRT-LLM across {nodes} nodes: launch trtllm-serve under mpirun / srun")
    trt += ["--host 0.0.0.0", f"--port {port}"]
    # SGLang's radix cache (prefix caching) is on by default.
    return LaunchCommands(
        vllm=_join(vllm), sglang=_join(sglang), notes=tuple(notes), trtllm=_join(trt)
    )


NIXL_KV = """'{"kv_connector":"NixlConnector","kv_role":"kv_both"}'"""


def render_disagg_commands(
    model: ModelSpec,
    gpu: GpuSpec,
    prefill: Layout,
    decode: Layout,
    *,
    max_model_len: int,
    gpu_memory_utilization: float | None = None,
) -> DisaggCommands:
    """vLLM: both pools with the NIXL KV connector behind vllm-router; SGLang: both pools
    with --disaggregation-mode and the NIXL transfer backend behind sglang_router. Ports:
    prefill 8100, decode 8200, router 8000."""

    def pool(layout: Layout, port: int) -> LaunchCommands:
        return render_launch_commands(
            model, gpu, layout, max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization, gpus_per_node=gpu.gpus_per_node,
            port=port,
        )  # fmt: skip

    p, d = pool(prefill, 8100), pool(decode, 8200)
    vllm_kv = f"--kv-transfer-config {NIXL_KV}"
    sglang_kv = "--disaggregation-transfer-backend nixl"
    notes = [
        "start one prefill command per prefill replica and one decode command per decode "
        "replica (each on its own GPUs), then the router with every replica's address",
        "KV moves over RDMA (NIXL / UCX): set UCX_NET_DEVICES to the GPUs' NICs; vLLM "
        "workers sharing a host need distinct VLLM_NIXL_SIDE_CHANNEL_PORT values",
        *(n for n in p.notes if "TRT-LLM" not in n),
        *(n for n in d.notes if n not in p.notes and "TRT-LLM" not in n),
    ]
    return DisaggCommands(
        vllm_prefill=_join([p.vllm, vllm_kv]),
        vllm_decode=_join([d.vllm, vllm_kv]),
        vllm_router=_join(
            [
                "vllm-router --pd-disaggregation",
                "--prefill http://<prefill-host>:8100",
                "--decode http://<decode-host>:8200",
                "--host 0.0.0.0 --port 8000",
            ]
        ),
        sglang_prefill=_join([p.sglang, "--disaggregation-mode prefill", sglang_kv]),
        sglang_decode=_join([d.sglang, "--disaggregation-mode decode", sglang_kv]),
        sglang_router=_join(
            [
                "python -m sglang_router.launch_router --pd-disaggregation",
                "--prefill http://<prefill-host>:8100 8998",
                "--decode http://<decode-host>:8200",
                "--host 0.0.0.0 --port 8000",
            ]
        ),
        notes=tuple(notes),
    )
