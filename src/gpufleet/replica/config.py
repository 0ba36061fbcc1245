"""What one replica runs with: its engine, timing, address and injected faults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpufleet.engine import EngineConfig
from gpufleet.engine.lora import LoraConfig
from gpufleet.perf.lora import LoraCost
from gpufleet.perf.step_time import StepTimeModel
from gpufleet.replica.lora import LoraModule


@dataclass
class Faults:
    fail_next: int = 0
    fail_status: int = 503
    slow_factor: float = 1.0
    unhealthy: bool = False

    def as_json(self) -> dict[str, Any]:
        return {
            "fail_next": self.fail_next,
            "fail_status": self.fail_status,
            "slow_factor": self.slow_factor,
            "unhealthy": self.unhealthy,
        }


@dataclass
class ReplicaConfig:
    served_model_names: list[str]
    engine_config: EngineConfig
    step_time_model: StepTimeModel
    host: str = "127.0.0.1"
    port: int = 8001
    time_scale: float = 1.0
    startup_s: float = 0.0
    seed: int = 0
    faults: Faults = field(default_factory=Faults)
    exit_after_s: float | None = None  # fault: exit abruptly this long after start
    access_log: bool = False  # log every HTTP request to stderr
    tp: int = 1  # reported by the SGLang-style /server_info only
    max_logprobs: int = 20  # vLLM's --max-logprobs: the most (top) logprobs a request gets
    engine: str = "vllm"  # whose API personality it speaks: vllm | sglang
    enable_metrics: bool = True  # serve /metrics (SGLang only with --enable-metrics)
    # LoRA (--enable-lora and its flags): the slots, their cost model, adapters at start
    lora: LoraConfig | None = None
    lora_cost: LoraCost | None = None
    lora_modules: list[LoraModule] = field(default_factory=list)
