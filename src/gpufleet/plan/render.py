"""Launch commands for a chosen layout: `vllm serve …` and `python -m sglang.launch_server …`.

Flag spellings follow the engines' documented CLIs (vLLM engine args; SGLang server
arguments). A checkpoint whose config.json carries its quantization (DeepSeek's fp8,
gpt-oss' MXFP4, AWQ/GPTQ) needs no --quantization flag: both engines read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.plan.layout import Layout
from gpufleet.specs.gpus import GpuSpec
from gpufleet.specs.models import ModelSpec


@dataclass(frozen=True)
class LaunchCommands:
    vllm: str
    sglang: str
    notes: tuple[str, ...]


def _vllm_quantization(
    model: ModelSpec, layout: Layout, gpu: GpuSpec
) -> tuple[str | None, str | None]:
    """(--quantization value or None, a note for the user or None)."""
    w = layout.weight_dtype
    if w == model.checkpoint_dtype:
        return None, None
    if w == "fp8":
        return "fp8", None  # vLLM quantizes bf16 weights to fp8 at load time
    if w == "int4":
        method = "awq" if gpu.name.startswith("mi") else "awq_marlin"
        return method, "int4 needs an AWQ int4 checkpoint of this model as --model"
    if w == "int8":
        return "compressed-tensors", "int8 (W8A8) needs a compressed-tensors int8 checkpoint"
    if w == "bf16":
        return None, f"bf16 needs a bf16 copy of this {model.checkpoint_dtype} checkpoint"
    return None, None


def render_launch_commands(
    model: ModelSpec,
    gpu: GpuSpec,
    layout: Layout,
    *,
    max_model_len: int,
    gpu_memory_utilization: float = 0.9,
    gpus_per_node: int = 8,
    port: int = 8000,
) -> LaunchCommands:
    quantization, note = _vllm_quantization(model, layout, gpu)
    notes: list[str] = [note] if note else []
    multi_node = layout.num_gpus > gpus_per_node

    vllm = [f"vllm serve {model.name}", f"--tensor-parallel-size {layout.tp}"]
    if layout.pp > 1:
        vllm.append(f"--pipeline-parallel-size {layout.pp}")
    if multi_node:
        vllm.append("--distributed-executor-backend ray")
        notes.append(
            f"vLLM spans {layout.pp} nodes through Ray: `ray start --head` on one node, "
            "`ray start --address <head>:6379` on the others, then run vllm serve on the head"
        )
    if layout.ep > 1:
        vllm.append("--enable-expert-parallel")
    if quantization:
        vllm.append(f"--quantization {quantization}")
    if layout.kv_dtype == "fp8":
        vllm.append("--kv-cache-dtype fp8")
    vllm += [
        f"--max-model-len {max_model_len}",
        f"--gpu-memory-utilization {gpu_memory_utilization:g}",
        "--enable-prefix-caching",
        f"--port {port}",
    ]

    sglang = [
        f"python -m sglang.launch_server --model-path {model.name}",
        f"--tp-size {layout.tp}",
    ]
    if layout.pp > 1:
        sglang.append(f"--pp-size {layout.pp}")
    if layout.ep > 1:
        sglang.append(f"--ep-size {layout.ep}")
    if quantization == "fp8":
        sglang.append("--quantization fp8")
    elif quantization == "awq_marlin" or quantization == "awq":
        sglang.append("--quantization awq")
    if layout.kv_dtype == "fp8":
        sglang.append("--kv-cache-dtype fp8_e4m3")
    sglang += [
        f"--context-length {max_model_len}",
        f"--mem-fraction-static {gpu_memory_utilization:g}",
    ]
    if multi_node:
        sglang += [f"--nnodes {layout.pp}", "--node-rank 0", "--dist-init-addr <head>:5000"]
        notes.append("SGLang: run the same command on every node with --node-rank 0..N-1")
    sglang += ["--host 0.0.0.0", f"--port {port}"]
    # SGLang's radix cache (prefix caching) is on by default.
    return LaunchCommands(
        vllm=" \\\n    ".join(vllm), sglang=" \\\n    ".join(sglang), notes=tuple(notes)
    )
