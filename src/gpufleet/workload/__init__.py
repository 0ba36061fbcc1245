"""Workloads: trace readers and prompt builders shared by `bench`, `sim` and the benchmarks.

A workload is a sequence of `Conversation`s. A single request is a conversation of one
turn; a multi-turn session is one whose later turns carry the earlier answers. Prompts
are built with the shared word tokenizer, so a prompt of N tokens is exactly N words.
"""

from gpufleet.workload.builders import (
    LengthSampler,
    prefix_group_conversations,
    random_conversations,
    sample_lengths,
    session_conversations,
    trace_conversations,
)
from gpufleet.workload.prompts import PromptFactory
from gpufleet.workload.traces import (
    MOONCAKE_BLOCK_TOKENS,
    TraceRecord,
    read_azure_csv,
    read_mooncake_jsonl,
    read_trace,
)
from gpufleet.workload.types import Conversation, Turn

__all__ = [
    "MOONCAKE_BLOCK_TOKENS",
    "Conversation",
    "LengthSampler",
    "PromptFactory",
    "TraceRecord",
    "Turn",
    "prefix_group_conversations",
    "random_conversations",
    "read_azure_csv",
    "read_mooncake_jsonl",
    "read_trace",
    "sample_lengths",
    "session_conversations",
    "trace_conversations",
]
