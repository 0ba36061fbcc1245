"""The LoRA cost model: adapter sizes from the model's shapes, loads, slot copies, SGMV steps."""

from __future__ import annotations

import pytest

from gpufleet.perf.lora import (
    DISK_GBPS,
    LOAD_FIXED_S,
    FixedLoraCost,
    LoraCost,
    lora_cost,
    lora_weights,
)
from gpufleet.specs.catalog import load_model
from gpufleet.specs.gpus import load_gpu


def test_llama_8b_rank_16_adapter_is_84_mb() -> None:
    model = load_model("meta-llama/Llama-3.1-8B")
    w = lora_weights(model)
    # q, k, v, o, gate, up, down: (4096+4096) + 2 (4096+1024) + (4096+4096) + 3 (4096+14336)
    assert w.per_rank_total == 32 * 81_920
    cost = lora_cost(model, load_gpu("h100-sxm"))
    assert cost.adapter_bytes(16) == 16 * 32 * 81_920 * 2  # 83.9 MB in bf16
    assert cost.load_s(16) == pytest.approx(LOAD_FIXED_S + 83.886e6 / (DISK_GBPS * 1e9), rel=1e-4)
    assert cost.load_s(64) > cost.load_s(16)


def test_tensor_parallel_splits_one_matrix_of_each_pair() -> None:
    model = load_model("meta-llama/Llama-3.1-8B")
    one, two = lora_weights(model, 1), lora_weights(model, 2)
    assert one.per_rank_per_gpu == one.per_rank_total
    # Half of every layer's (in + out) is split, the other half replicated: between 1/2 and 1.
    assert one.per_rank_total / 2 < two.per_rank_per_gpu < one.per_rank_total


def test_step_cost_is_zero_without_adapters_and_grows_with_them() -> None:
    cost = lora_cost(load_model("meta-llama/Llama-3.1-8B"), load_gpu("h100-sxm"))
    assert cost.step_s(0, 512) == 0.0
    one, eight = cost.step_s(1, 64), cost.step_s(8, 64)
    assert 0.0 < one < eight
    assert cost.step_s(1, 8192) > cost.step_s(1, 64)  # FLOPs grow with the tokens
    assert isinstance(cost, LoraCost)


def test_fixed_cost_for_tests() -> None:
    cost = FixedLoraCost(load_fixed_s=0.1, activate_fixed_s=0.01, step_fixed_s=0.002,
                         per_adapter_s=0.001)  # fmt: skip
    assert (cost.load_s(8), cost.activate_s(8)) == (0.1, 0.01)
    assert cost.step_s(0, 10) == 0.0
    assert cost.step_s(3, 10) == pytest.approx(0.005)
    assert isinstance(cost, LoraCost)
