"""The /metrics reader on texts recorded from real engines (engine_fixtures/SOURCES.md):
vLLM V0 and V1 names, SGLang 0.4 and 0.5, TGI 3, trtllm-serve's Prometheus text and its
JSON iteration statistics."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.fleet_state import ScrapedMetrics, parse_engine_metrics

FIXTURES = Path(__file__).parent / "engine_fixtures"


def recorded(name: str) -> str:
    return (FIXTURES / name).read_text()


# file -> (engine, running, waiting, KV usage, KV capacity tokens, load reported)
EXPECTED = {
    "vllm-0.4.3-v0.prom": ("vllm", 0, 0, 0.0, 7281 * 16, True),
    "vllm-v0-issue-qwen3vl-55.prom": ("vllm", 0, 0, 0.0, 2048 * 16, True),
    "vllm-v1-0.7-production-stack-318.prom": ("vllm", 0, 0, 0.0, None, True),
    "sglang-0.4-docs.prom": ("sglang", 162, 2826, 0.28, None, True),
    "sglang-0.5.10-datadog.prom": ("sglang", 0, 0, 0.25, 430839, True),
    "tgi-3-datadog.prom": ("tgi", 0, 0, None, None, True),
    "trtllm-iteration-stats-issue-3376.json": ("trtllm", 1, 7, 5495 / 7240, 7240 * 64, True),
    "trtllm-1.x-prometheus-aibrix-2004.prom": (None, 0, 0, None, None, False),
}


def test_every_fixture_is_checked() -> None:
    on_disk = {p.name for p in FIXTURES.iterdir() if p.suffix in (".prom", ".json")}
    assert on_disk == set(EXPECTED)
    sources = (FIXTURES / "SOURCES.md").read_text()
    for name in on_disk:  # each says where it came from (JSON has no comments: SOURCES.md)
        assert f"`{name}`" in sources
        assert name.endswith(".json") or recorded(name).startswith("# source: ")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recorded_text(name: str) -> None:
    engine, running, waiting, kv, capacity, reported = EXPECTED[name]
    s = parse_engine_metrics(recorded(name))
    assert (s.engine, s.num_running, s.num_waiting) == (engine, running, waiting)
    assert s.kv_cache_usage == (pytest.approx(kv) if kv is not None else None)
    assert (s.kv_capacity_tokens, s.load_reported) == (capacity, reported)


def test_both_vllm_kv_names_are_one_signal_never_added() -> None:
    """vLLM 0.9-0.10 exports kv_cache_usage_perc and the deprecated gpu_cache_usage_perc:
    the newer name is read, the two are not summed (nor averaged)."""
    text = recorded("vllm-0.4.3-v0.prom")
    text = text.replace(
        'vllm:kv_cache_usage_perc{model_name="facebook/opt-125m"} 0.0',
        'vllm:kv_cache_usage_perc{model_name="facebook/opt-125m"} 0.25',
    )
    text = text.replace('vllm:gpu_cache_usage_perc{model_name="facebook/opt-125m"} 0.0',
                        'vllm:gpu_cache_usage_perc{model_name="facebook/opt-125m"} 0.5')  # fmt: skip
    assert parse_engine_metrics(text).kv_cache_usage == 0.25
    # V0 exports only the old name: it is read.
    v0 = recorded("vllm-v0-issue-qwen3vl-55.prom").replace(
        'vllm:gpu_cache_usage_perc{model_name="qwenvl"} 0.0',
        'vllm:gpu_cache_usage_perc{model_name="qwenvl"} 0.5',
    )
    assert parse_engine_metrics(v0).kv_cache_usage == 0.5


def test_vllm_v0_swapped_requests_wait_in_the_engine() -> None:
    text = recorded("vllm-v0-issue-qwen3vl-55.prom")
    text = text.replace(
        'vllm:num_requests_swapped{model_name="qwenvl"} 0.0',
        'vllm:num_requests_swapped{model_name="qwenvl"} 2.0',
    )
    text = text.replace('vllm:num_requests_waiting{model_name="qwenvl"} 0.0',
                        'vllm:num_requests_waiting{model_name="qwenvl"} 3.0')  # fmt: skip
    assert parse_engine_metrics(text).num_waiting == 5


def test_sglang_data_parallel_ranks_are_summed_and_tp_ranks_count_once() -> None:
    """SGLang with DP attention labels each scheduler by dp_rank (its series shaped as in
    vllm-project/aibrix#1614); two tp ranks of one scheduler are the same requests."""
    labels = 'engine_type="unified",model_name="m",pp_rank="0"'
    lines = []
    for dp, running, queued, usage, pool in ((0, 3, 1, 0.5, 1000), (1, 5, 0, 0.1, 3000)):
        for tp in (dp * 2, dp * 2 + 1):
            rank = f'dp_rank="{dp}",{labels},tp_rank="{tp}"'
            lines += [f"sglang:num_running_reqs{{{rank}}} {running}.0",
                      f"sglang:num_queue_reqs{{{rank}}} {queued}.0",
                      f"sglang:token_usage{{{rank}}} {usage}",
                      f"sglang:max_total_num_tokens{{{rank}}} {pool}.0"]  # fmt: skip
    s = parse_engine_metrics("\n".join(lines) + "\n")
    assert (s.num_running, s.num_waiting, s.kv_capacity_tokens) == (8, 1, 4000)
    assert s.kv_cache_usage == pytest.approx((0.5 * 1000 + 0.1 * 3000) / 4000)


def test_trtllm_prometheus_gauges() -> None:
    """Recent trtllm-serve releases: gauges named as in TensorRT-LLM's metrics inventory
    (no recorded text of them was found; these lines follow its names)."""
    text = (
        'trtllm_num_requests_running{model_name="m"} 4.0\n'
        'trtllm_num_requests_waiting{model_name="m"} 2.0\n'
        'trtllm_kv_cache_utilization{model_name="m"} 0.5\n'
        'trtllm_kv_cache_max_blocks{model_name="m"} 100.0\n'
        'trtllm_kv_cache_tokens_per_block{model_name="m"} 32.0\n'
    )
    assert parse_engine_metrics(text) == ScrapedMetrics(4, 2, 0.5, 3200, "trtllm")


def test_trtllm_iteration_stats_without_iterations_say_nothing() -> None:
    assert parse_engine_metrics("[]") == ScrapedMetrics.no_load("trtllm")
    with pytest.raises(ValueError):
        parse_engine_metrics("[{")


def test_a_configured_engine_reads_only_its_own_names() -> None:
    sglang = recorded("sglang-0.4-docs.prom")
    assert parse_engine_metrics(sglang, engine="sglang").num_running == 162
    assert parse_engine_metrics(sglang, engine="vllm") == ScrapedMetrics.no_load("vllm")
    with pytest.raises(KeyError, match="unknown engine"):
        parse_engine_metrics(sglang, engine="nope")


def test_names_that_extend_a_known_name_are_not_read_as_it() -> None:
    """vLLM 0.11+ adds num_requests_waiting_by_reason beside num_requests_waiting."""
    text = (
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 3.0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} NaN\n'
    )
    s = parse_engine_metrics(text)
    assert (s.num_running, s.num_waiting) == (2, 3)
    assert s.kv_cache_usage is None  # NaN is no reading
