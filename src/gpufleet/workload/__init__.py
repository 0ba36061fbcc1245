"""The workload model shared by `bench`, `up --demo`, `sim` and the benchmarks.

One model of what is sent: arrival processes (`arrivals`) and request shapes (`shapes`:
lengths, shared-prefix groups, multi-turn sessions, trace replay), rendered two ways
(`render`): as prompt text for live traffic and as segments whose block hashes the
simulator uses. Same spec and seed → same shapes at the same times, live or simulated.
Prompts use the shared word tokenizer, so a prompt of N tokens is exactly N words.
"""

from gpufleet.workload.adapters import (
    AdapterPopularity,
    adapter_name,
    with_adapters,
)
from gpufleet.workload.arrivals import (
    RatePhase,
    arrival_offsets,
    iter_arrival_offsets,
    parse_rate_steps,
    phase_at,
    schedule_offsets,
    total_duration_s,
)
from gpufleet.workload.prompts import PromptFactory
from gpufleet.workload.render import SimRequest, sim_requests, text_conversations
from gpufleet.workload.segments import (
    KIND_ANSWER,
    KIND_PREFIX,
    KIND_TRACE_BLOCK,
    KIND_UNIQUE,
    SegmentHasher,
    Segments,
    common_prefix_tokens,
    placeholder_token_ids,
    segment_key,
)
from gpufleet.workload.shapes import (
    ConversationShape,
    LengthSampler,
    TurnShape,
    WorkloadSpec,
    spec_from_flags,
    synthetic_shapes,
    trace_shapes,
)
from gpufleet.workload.traces import (
    MOONCAKE_BLOCK_TOKENS,
    SAMPLE_TRACES,
    TraceRecord,
    read_azure_csv,
    read_mooncake_jsonl,
    read_trace,
    slice_records,
    tile_records,
    trace_path,
)
from gpufleet.workload.types import Conversation, Turn

__all__ = [
    "KIND_ANSWER",
    "KIND_PREFIX",
    "KIND_TRACE_BLOCK",
    "KIND_UNIQUE",
    "MOONCAKE_BLOCK_TOKENS",
    "SAMPLE_TRACES",
    "AdapterPopularity",
    "Conversation",
    "ConversationShape",
    "LengthSampler",
    "PromptFactory",
    "RatePhase",
    "SegmentHasher",
    "Segments",
    "SimRequest",
    "TraceRecord",
    "Turn",
    "TurnShape",
    "WorkloadSpec",
    "adapter_name",
    "arrival_offsets",
    "common_prefix_tokens",
    "iter_arrival_offsets",
    "parse_rate_steps",
    "phase_at",
    "placeholder_token_ids",
    "read_azure_csv",
    "read_mooncake_jsonl",
    "read_trace",
    "schedule_offsets",
    "segment_key",
    "sim_requests",
    "slice_records",
    "spec_from_flags",
    "synthetic_shapes",
    "text_conversations",
    "tile_records",
    "total_duration_s",
    "trace_path",
    "trace_shapes",
    "with_adapters",
]
