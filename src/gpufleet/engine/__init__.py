"""gpufleet.engine: one replica's behaviour as vLLM v1 schedules it (pure; see DESIGN.md)."""

from gpufleet.engine.engine import Engine, EngineConfig, SchedulerStats, StepOutcome
from gpufleet.engine.kv_cache import BlockPool
from gpufleet.engine.request import EngineRequest, FinishReason, RequestStatus

__all__ = [
    "BlockPool",
    "Engine",
    "EngineConfig",
    "EngineRequest",
    "FinishReason",
    "RequestStatus",
    "SchedulerStats",
    "StepOutcome",
]
