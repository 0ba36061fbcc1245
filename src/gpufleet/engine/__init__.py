"""gpufleet.engine: one replica's behaviour as vLLM v1 schedules it (pure; see DESIGN.md)."""

from gpufleet.engine.driver import BLOCKED_RETRY_S, Arrivals, EngineDriver, run_virtual
from gpufleet.engine.engine import Engine, EngineConfig, SchedulerStats, StepOutcome
from gpufleet.engine.kv_cache import BlockPool
from gpufleet.engine.request import EngineRequest, FinishReason, RequestStatus

__all__ = [
    "BLOCKED_RETRY_S",
    "Arrivals",
    "BlockPool",
    "Engine",
    "EngineConfig",
    "EngineDriver",
    "EngineRequest",
    "FinishReason",
    "RequestStatus",
    "SchedulerStats",
    "StepOutcome",
    "run_virtual",
]
