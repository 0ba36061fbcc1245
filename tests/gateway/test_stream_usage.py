"""The gateway counts a streamed answer's prompt and output tokens apart where the stream
reports its usage (the autoscaler's capacity in work weighs them), without tokenizing."""

from __future__ import annotations

import json
from typing import Any

from gpufleet.fleet_state import LatencyWindows
from gpufleet.gateway.continuation import Transcript
from gpufleet.gateway.metrics import GatewayMetrics


def sse(*events: dict[str, Any] | str) -> bytes:
    return b"".join(
        b"data: " + (e.encode() if isinstance(e, str) else json.dumps(e).encode()) + b"\n\n"
        for e in events
    )


def chunk(content: str) -> dict[str, Any]:
    return {"id": "c1", "choices": [{"index": 0, "delta": {"content": content}}]}


def test_the_transcript_reads_the_streams_usage_once_without_refolding_it() -> None:
    t = Transcript(chat=True)
    t.add(sse(chunk("a"), chunk("b")))
    assert t.usage() is None  # no usage event (the client did not ask for one)
    usage = {"prompt_tokens": 900, "completion_tokens": 2, "total_tokens": 902}
    t.add(sse({"id": "c1", "choices": [], "usage": usage}, "[DONE]"))
    assert t.usage() == (900, 2)
    assert t.state().tokens == 2  # reading the usage did not count the tokens twice


def test_a_streams_usage_reaches_the_latency_window_apart() -> None:
    windows = LatencyWindows(60.0)
    metrics = GatewayMetrics(lambda: [], lambda: 0, windows)
    metrics.observe_stream("m", "t", 0.1, 1.0, 10, 5.0, usage=(900, 100))
    metrics.observe_stream("m", "t", 0.1, 1.0, 10, 6.0)  # no usage: no token count
    assert windows.tokens.mean(6.0) == 1000.0
    assert windows.prompt_tokens.mean(6.0) == 900.0
