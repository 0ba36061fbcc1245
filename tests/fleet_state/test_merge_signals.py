"""Several workers' signals as one: per-model latencies survive the merge (a model group's
autoscaler behind `gateway --workers N` reads them)."""

from __future__ import annotations

from gpufleet.fleet_state import LatencyWindows, merge_signals
from gpufleet.fleet_state.signals import build_signals


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
