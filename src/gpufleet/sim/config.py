"""What one simulated fleet is: its replicas, gateway settings and autoscaler."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.autoscale.decision import ScalingPolicy
from gpufleet.engine import EngineConfig
from gpufleet.engine.lora import LoraConfig
from gpufleet.perf.lora import LoraCost
from gpufleet.perf.step_time import StepTimeModel
from gpufleet.routing.prefix import ROUTING_BLOCK_TOKENS


@dataclass(frozen=True, slots=True)
class AutoscaleSpec:
    policy: ScalingPolicy
    interval_s: float = 1.0
    startup_s: float = 30.0
    drain_deadline_s: float = 60.0


@dataclass(frozen=True)
class SimLora:
    """Replicas serve LoRA adapters (`gpufleet replica --enable-lora`): their slots, the
    cost model, and the rank of every adapter the workload names. The simulated gateway
    loads an adapter onto a replica the first time it sends it a request for it."""

    config: LoraConfig
    cost: LoraCost
    rank: int = 16


@dataclass(frozen=True)
class SimConfig:
    engine: EngineConfig
    step_time_model: StepTimeModel
    model: str = "model"
    replicas: int = 1  # the fixed fleet, or the initial one when autoscaling
    autoscale: AutoscaleSpec | None = None
    scrape_interval_s: float = 1.0  # gateway: scrape_interval_s
    signals_window_s: float = 60.0  # gateway: signals_window_s
    queue_timeout_s: float = 60.0  # gateway: queue.timeout_s
    queue_max_size: int = 256  # gateway: queue.max_size (beyond it: 503)
    queue_retry_after_s: int = 5  # gateway: queue.retry_after_s
    closed_loop_clients: int | None = None  # None: open loop at the requests' arrival times
    tail_s: float = 0.0  # keep the autoscaler ticking this long after the last request
    # The gateway hashes 256 bytes of prompt text per routing block, ≈ 64 tokens.
    routing_block_tokens: int = ROUTING_BLOCK_TOKENS
    seed: int = 0
    # Advance each engine over runs of plain decode iterations in one event (the results
    # are the same as stepping; False steps one iteration per event, for comparison).
    jump_decode_runs: bool = True
    lora: SimLora | None = None  # replicas serve LoRA adapters
    max_events: int = 200_000_000  # a hang guard, far above any real run
