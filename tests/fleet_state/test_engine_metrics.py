"""The one reader of a replica's /metrics: names, the rules that combine several engines,
and what it does with text it cannot use."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from gpufleet.fleet_state import KV_USAGE_RULE, ScrapedMetrics, parse_engine_metrics


def _vllm_exposition(engines: dict[str, tuple[int, int, float, int | None]]) -> str:
    """A real exposition (prometheus_client renders it) of vLLM's gauges, one label set per
    engine: (running, waiting, KV usage, num_gpu_blocks or None)."""
    reg = CollectorRegistry()
    labels = ["engine", "model_name"]
    running = Gauge("vllm:num_requests_running", "running", labels, registry=reg)
    waiting = Gauge("vllm:num_requests_waiting", "waiting", labels, registry=reg)
    kv = Gauge("vllm:kv_cache_usage_perc", "kv", labels, registry=reg)
    info = Gauge("vllm:cache_config_info", "info", ["engine", "block_size", "num_gpu_blocks"],
                 registry=reg)  # fmt: skip
    ttft = Gauge("vllm:time_to_first_token_seconds_sum", "other", labels, registry=reg)
    for engine, (r, w, usage, blocks) in engines.items():
        running.labels(engine, "m").set(r)
        waiting.labels(engine, "m").set(w)
        kv.labels(engine, "m").set(usage)
        ttft.labels(engine, "m").set(99)
        if blocks is not None:
            info.labels(engine, "16", str(blocks)).set(1)
    return generate_latest(reg).decode()


def test_one_engine() -> None:
    s = parse_engine_metrics(_vllm_exposition({"0": (3, 7, 0.25, 1000)}))
    assert s == ScrapedMetrics(3, 7, 0.25, 16000, "vllm", load_reported=True)
    assert s.load == 10


def test_requests_of_several_engines_are_summed() -> None:
    s = parse_engine_metrics(_vllm_exposition({"0": (3, 7, 0.5, 1000), "1": (2, 0, 0.1, 1000)}))
    assert (s.num_running, s.num_waiting) == (5, 7)
    assert s.kv_capacity_tokens == 2 * 16000  # every engine's blocks


def test_kv_usage_of_several_engines_is_their_capacity_weighted_mean() -> None:
    """KV_USAGE_RULE: the share of the replica's KV blocks in use. Not the sum (1.2 here:
    more than full) and not the max (0.9: the replica still has room on engine 1)."""
    assert KV_USAGE_RULE == "capacity-weighted mean over the replica's engines"
    s = parse_engine_metrics(_vllm_exposition({"0": (1, 0, 0.9, 1000), "1": (1, 0, 0.3, 3000)}))
    assert s.kv_cache_usage == pytest.approx((0.9 * 1000 + 0.3 * 3000) / 4000)
    # Engines without a reported capacity weigh equally.
    s = parse_engine_metrics(_vllm_exposition({"0": (1, 0, 0.9, None), "1": (1, 0, 0.3, None)}))
    assert s.kv_cache_usage == pytest.approx(0.6)
    assert s.kv_capacity_tokens is None


def test_older_vllm_names_and_hand_written_text() -> None:
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 3\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 2\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 7\n'
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="1000",engine="0"} 1.0\n'
        'vllm:time_to_first_token_seconds_bucket{le="0.1"} 9\n'
    )
    s = parse_engine_metrics(text)
    assert (s.num_running, s.num_waiting, s.kv_cache_usage) == (5, 7, 0.5)
    assert s.kv_capacity_tokens == 16000  # engine 1 did not report its cache


def test_text_without_known_names_reports_no_load() -> None:
    """Not zeros (that would read as an idle replica): no load at all."""
    s = parse_engine_metrics("# HELP other x\n# TYPE other gauge\nother 4\n")
    assert s == ScrapedMetrics.no_load()
    assert (s.engine, s.load_reported, s.kv_cache_usage) == (None, False, None)


def test_malformed_text_is_an_error() -> None:
    with pytest.raises(ValueError):
        parse_engine_metrics('vllm:num_requests_running{engine="0" 3\n')
