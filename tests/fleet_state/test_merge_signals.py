"""Several workers' signals as one: per-model latencies survive the merge (a model group's
autoscaler behind `gateway --workers N` reads them)."""

from __future__ import annotations

from gpufleet.fleet_state import LatencyWindows, merge_signals
from gpufleet.fleet_state.signals import GatewaySignals, build_signals


def _worker(samples: list[tuple[str, float]]) -> LatencyWindows:
    windows = LatencyWindows(60.0)
    for i, (model, ttft_s) in enumerate(samples):
        windows.observe(float(i), ttft_s, 0.01, model)
    return windows


def test_workers_latency_windows_merge_per_model() -> None:
    a = _worker([("llama", 0.1), ("llama", 0.3), ("qwen", 2.0)])
    b = _worker([("qwen", 4.0), ("llama", 0.2)])
    parts = [build_signals(10.0, [], {}, w) for w in (a, b)]
    merged = LatencyWindows(60.0)
    for w in (a, b):
        merged.merge_json(w.to_json())
    signals = merge_signals(10.0, parts, merged)
    assert signals.streamed_requests_in_window == 5
    assert signals.latency_by_model["llama"].streamed_requests == 3
    assert signals.latency_by_model["qwen"].streamed_requests == 2
    qwen = signals.for_model("qwen")
    assert qwen.ttft_s.p50_s == 3.0  # the median of 2.0 and 4.0: both workers' samples


def test_tokens_per_request_over_the_window_survive_the_merge_and_json() -> None:
    a, b = LatencyWindows(60.0), LatencyWindows(60.0)
    a.observe(1.0, 0.1, 0.01, "llama", tokens=1000)
    a.observe(2.0, 0.1, 0.01, "llama")  # a request whose tokens were not counted
    b.observe(3.0, 0.2, 0.01, "llama", tokens=3000)
    parts = [build_signals(10.0, [], {}, w) for w in (a, b)]
    assert parts[0].tokens_per_request == 1000.0
    merged = LatencyWindows(60.0)
    for w in (a, b):
        merged.merge_json(w.to_json())
    signals = merge_signals(10.0, parts, merged)
    assert signals.tokens_per_request == 2000.0
    assert GatewaySignals.from_json(signals.to_json()).tokens_per_request == 2000.0
    assert signals.for_model("llama").tokens_per_request == 2000.0  # the only model
    b.observe(4.0, 0.2, 0.01, "qwen", tokens=10)
    two = build_signals(10.0, [], {}, b)
    assert two.for_model("llama").tokens_per_request is None  # the count is the fleet's
    assert build_signals(100.0, [], {}, a).tokens_per_request is None  # out of the window


def test_prompt_tokens_per_request_survive_the_merge_and_json() -> None:
    a, b = LatencyWindows(60.0), LatencyWindows(60.0)
    a.observe(1.0, 0.1, 0.01, "llama", tokens=1000, prompt_tokens=800)
    a.observe(2.0, 0.1, 0.01, "llama", prompt_tokens=500)  # no total: not counted
    b.observe(3.0, 0.2, 0.01, "llama", tokens=3000, prompt_tokens=1000)
    parts = [build_signals(10.0, [], {}, w) for w in (a, b)]
    merged = LatencyWindows(60.0)
    for w in (a, b):
        merged.merge_json(w.to_json())
    signals = merge_signals(10.0, parts, merged)
    assert signals.prompt_tokens_per_request == 900.0  # over the same requests as the total
    assert GatewaySignals.from_json(signals.to_json()).prompt_tokens_per_request == 900.0
    assert signals.for_model("llama").prompt_tokens_per_request == 900.0
    b.observe(4.0, 0.2, 0.01, "qwen", tokens=10, prompt_tokens=5)
    two = build_signals(10.0, [], {}, b)
    assert two.for_model("llama").prompt_tokens_per_request is None  # the fleet's count
