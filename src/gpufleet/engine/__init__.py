"""gpufleet.engine: one replica's behaviour as vLLM v1 schedules it (pure; see docs/design.md).

`Engine` drives a `Scheduler` (which requests run next) over a `KVCacheManager` (which
request holds which blocks of the `BlockPool`), prices each iteration with a step-time
model, and jumps over runs of plain decode iterations (`plan_decode_run` / `run_decode`).
"""

from gpufleet.engine.block_pool import BlockPool
from gpufleet.engine.decode_run import DecodeRun
from gpufleet.engine.driver import BLOCKED_RETRY_S, Advance, Arrivals, EngineDriver, run_virtual
from gpufleet.engine.engine import Engine
from gpufleet.engine.kv_cache_manager import KVCacheManager
from gpufleet.engine.outputs import (
    DecodeRunOutcome,
    EngineConfig,
    ScheduledBatch,
    SchedulerStats,
    StepOutcome,
)
from gpufleet.engine.request import EngineRequest, FinishReason, RequestStatus
from gpufleet.engine.scheduler import Scheduler

__all__ = [
    "BLOCKED_RETRY_S",
    "Advance",
    "Arrivals",
    "BlockPool",
    "DecodeRun",
    "DecodeRunOutcome",
    "Engine",
    "EngineConfig",
    "EngineDriver",
    "EngineRequest",
    "FinishReason",
    "KVCacheManager",
    "RequestStatus",
    "ScheduledBatch",
    "Scheduler",
    "SchedulerStats",
    "StepOutcome",
    "run_virtual",
]
