"""What serving LoRA adapters costs: loading one, and running a batch that uses several. Pure.

The model (docs/lora.md has the figures for common layouts):

**Adapter size.** A LoRA of rank r adds, to each adapted linear layer W (in -> out), the
matrices A (r x in) and B (out x r): r x (in + out) weights. vLLM wraps every linear layer
of the decoder (q, k, v, o projections and the dense MLP's gate, up, down), so an adapter
trained on all of them for Llama-3.1-8B at r = 16 is 16 x 81,920 x 32 layers = 42 M
weights, 84 MB in bf16. MoE layers adapt their attention only (the experts are not wrapped).

**Per GPU (tensor parallel).** vLLM shards LoRA like the layer it wraps: for a
column-parallel layer (q, k, v, gate, up) A is replicated and B split; for a row-parallel
one (o, down) A is split and B replicated. A GPU holds r x (in + out / tp) of the first
kind and r x (in / tp + out) of the second.

**Load** (`load_s`: vLLM's `add_lora`, or the first request of an adapter that is not in
the CPU cache): every worker reads the whole safetensors file and builds its tensors in
pinned host memory: `LOAD_FIXED_S` + bytes / `DISK_GBPS`. This blocks the engine loop
(vLLM loads adapters synchronously, between or at the start of iterations).

**Activation** (`activate_s`: an adapter from the CPU cache into a free GPU slot, LRU
evicting the oldest idle one): a host-to-device copy of the GPU's share at
`PCIE_EFFICIENCY` of the GPU's PCIe bandwidth, plus `ACTIVATE_FIXED_S` for the per-module
copies (a few hundred small tensors).

**Step cost** (`step_s`: Punica's SGMV / S-LoRA's batched LoRA kernels, as vLLM's punica
wrapper runs them): an iteration whose batch uses n distinct adapters runs, for each of
the 4 wrapped linear groups of a layer (qkv, o, gate_up, down), a "shrink" (x A) and an
"expand" (x B) kernel over the batch's tokens, each token using its own adapter's slot:

    step_s = layers x 8 x KERNEL_S                                 (launch-bound floor)
           + n x slot bytes per GPU / (HBM x HBM_EFFICIENCY)         (each adapter read once)
           + tokens x 2 x max_lora_rank x lora weights per rank / (bf16 x FLOP_EFFICIENCY)

The slots are allocated at `max_lora_rank` (vLLM pads every adapter to it), so reads and
FLOPs use that rank whatever the adapter's own. A batch with no adapter costs nothing
extra. The terms are small beside a decode step except the launch floor (~0.6 ms for a
32-layer model), which is why LoRA decode at low batch is slower than the base model, and
the per-adapter read, which is why many distinct adapters in one batch cost more
(S-LoRA, Fig. 7; Punica, Fig. 9).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from gpufleet.specs.gpus import GpuSpec
from gpufleet.specs.models import ModelSpec

# The constants below are physical estimates, not fitted (no measured multi-LoRA serving
# data ships with gpufleet); each says what it stands for.
DISK_GBPS = 2.0  # NVMe read + safetensors deserialization into pinned host memory
LOAD_FIXED_S = 0.015  # PEFT config, checks, tensor dict: per adapter load
PCIE_EFFICIENCY = 0.7  # pinned host-to-device copies reach ~70 % of the link
ACTIVATE_FIXED_S = 0.002  # per-module slot copies (4 groups x layers small tensors)
KERNEL_S = 2.5e-6  # one SGMV shrink or expand kernel on a small batch (latency-bound)
HBM_EFFICIENCY = 0.7  # reading a slot's A and B from HBM
FLOP_EFFICIENCY = 0.3  # skinny rank-r GEMMs reach a fraction of the tensor peak
KERNELS_PER_LAYER = 8  # shrink + expand for each of qkv, o, gate_up, down
BYTES_PER_WEIGHT = 2  # adapters are served in the model's bf16 / fp16


@runtime_checkable
class LoraCost(Protocol):
    """What the engine asks of a LoRA cost model (seconds)."""

    def load_s(self, rank: int) -> float:
        """Disk to host memory, for one adapter of `rank`."""
        ...

    def activate_s(self, rank: int) -> float:
        """Host memory into a GPU slot."""
        ...

    def step_s(self, num_adapters: int, num_tokens: int) -> float:
        """What one iteration of `num_tokens` tokens using `num_adapters` distinct
        adapters costs beyond the base model's step (0 with no adapter)."""
        ...


@dataclass(frozen=True, slots=True)
class LoraWeights:
    """Weights of a rank-1 adapter on one model: in total and per GPU of a TP group."""

    per_rank_total: int  # sum over adapted layers of (in + out)
    per_rank_per_gpu: float
    num_layers: int


def lora_weights(model: ModelSpec, tp: int = 1) -> LoraWeights:
    """The adapter weights per unit of rank (see the module doc: which layers, how split)."""
    h = model.hidden_size
    q = model.num_attention_heads * model.head_dim
    kv = model.num_kv_heads * model.head_dim
    total = 0
    per_gpu = 0.0
    for layer in model.layers:
        column = [(h, q), (h, kv), (h, kv)]  # q, k, v: (in, out)
        row = [(q, h)]  # o
        if not (layer.is_moe and model.moe is not None):
            column += [(h, model.intermediate_size)] * 2  # gate, up
            row.append((model.intermediate_size, h))  # down
        for din, dout in column:
            total += din + dout
            per_gpu += din + dout / tp
        for din, dout in row:
            total += din + dout
            per_gpu += din / tp + dout
    return LoraWeights(total, per_gpu, len(model.layers))


@dataclass(frozen=True, slots=True)
class RooflineLoraCost:
    """The module doc's model for one layout (model, GPU, TP, max_lora_rank)."""

    weights: LoraWeights
    hbm_gbps: float
    pcie_gbps: float
    bf16_tflops: float
    max_lora_rank: int

    def adapter_bytes(self, rank: int) -> float:
        return rank * self.weights.per_rank_total * BYTES_PER_WEIGHT

    def load_s(self, rank: int) -> float:
        return LOAD_FIXED_S + self.adapter_bytes(rank) / (DISK_GBPS * 1e9)

    def activate_s(self, rank: int) -> float:
        gpu_bytes = rank * self.weights.per_rank_per_gpu * BYTES_PER_WEIGHT
        return ACTIVATE_FIXED_S + gpu_bytes / (self.pcie_gbps * PCIE_EFFICIENCY * 1e9)

    def step_s(self, num_adapters: int, num_tokens: int) -> float:
        if num_adapters <= 0:
            return 0.0
        w = self.weights
        slot_bytes = self.max_lora_rank * w.per_rank_per_gpu * BYTES_PER_WEIGHT
        flops = num_tokens * 2.0 * self.max_lora_rank * w.per_rank_per_gpu
        return (
            w.num_layers * KERNELS_PER_LAYER * KERNEL_S
            + num_adapters * slot_bytes / (self.hbm_gbps * HBM_EFFICIENCY * 1e9)
            + flops / (self.bf16_tflops * FLOP_EFFICIENCY * 1e12)
        )


def lora_cost(
    model: ModelSpec, gpu: GpuSpec, *, tp: int = 1, max_lora_rank: int = 16
) -> RooflineLoraCost:
    """The LoRA cost model of one replica layout."""
    return RooflineLoraCost(
        weights=lora_weights(model, tp),
        hbm_gbps=gpu.hbm_gbps,
        pcie_gbps=gpu.pcie_gbps,
        bf16_tflops=gpu.tflops("bf16"),
        max_lora_rank=max_lora_rank,
    )


def lora_cost_of(model: str, gpu: str, *, tp: int = 1, max_lora_rank: int = 16) -> RooflineLoraCost:
    """`lora_cost` of a catalog model on a catalog GPU, by name."""
    from gpufleet.specs.catalog import load_model
    from gpufleet.specs.gpus import load_gpu

    return lora_cost(load_model(model), load_gpu(gpu), tp=tp, max_lora_rank=max_lora_rank)


@dataclass(frozen=True, slots=True)
class FixedLoraCost:
    """Explicit constants (tests, or a cost measured by hand): loads and activations take
    fixed seconds; a step pays `step_fixed_s` plus `per_adapter_s` per distinct adapter."""

    load_fixed_s: float = 0.05
    activate_fixed_s: float = 0.002
    step_fixed_s: float = 0.0
    per_adapter_s: float = 0.0

    def load_s(self, rank: int) -> float:
        return self.load_fixed_s

    def activate_s(self, rank: int) -> float:
        return self.activate_fixed_s

    def step_s(self, num_adapters: int, num_tokens: int) -> float:
        if num_adapters <= 0:
            return 0.0
        return self.step_fixed_s + num_adapters * self.per_adapter_s
