import math

import pytest

from gpufleet.bench.config import BenchConfig
from gpufleet.bench.scrape import counter_deltas, parse_counters
from gpufleet.bench.sweep import find_knee, parse_sweep
from gpufleet.errors import UserError

BEFORE = """
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="m"} 100
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{model_name="m"} 400
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{model_name="m"} 2
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3
# TYPE gpufleet_gateway_replica_requests counter
gpufleet_gateway_replica_requests_total{replica="r0",status="200"} 10
gpufleet_gateway_replica_requests_total{replica="r1",status="200"} 5
# TYPE gpufleet_gateway_replica_retries counter
gpufleet_gateway_replica_retries_total{replica="r0"} 1
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="+Inf"} 7
vllm:e2e_request_latency_seconds_count 7
vllm:e2e_request_latency_seconds_sum 3.5
"""

AFTER = """
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="m"} 400
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{model_name="m"} 800
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{model_name="m"} 1
# TYPE gpufleet_gateway_replica_requests counter
gpufleet_gateway_replica_requests_total{replica="r0",status="200"} 30
gpufleet_gateway_replica_requests_total{replica="r1",status="200"} 25
gpufleet_gateway_replica_requests_total{replica="r1",status="502"} 2
# TYPE gpufleet_gateway_replica_retries counter
gpufleet_gateway_replica_retries_total{replica="r0"} 2
gpufleet_gateway_replica_retries_total{replica="r1"} 2
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="+Inf"} 17
vllm:e2e_request_latency_seconds_count 17
vllm:e2e_request_latency_seconds_sum 9.5
"""


def test_counter_deltas_known_and_generic() -> None:
    d = counter_deltas(parse_counters(BEFORE), parse_counters(AFTER))
    assert d.prefix_cache_hits == 300 and d.prefix_cache_queries == 400
    assert d.prefix_cache_hit_rate == pytest.approx(0.75)
    assert d.preemptions == 1  # went down: the server restarted, so the delta is the new value
    assert d.gateway_retries == 3
    assert d.per_replica() == {
        "r0": {
            'gpufleet_gateway_replica_requests_total{status="200"}': 20.0,
            "gpufleet_gateway_replica_retries_total": 1.0,
        },
        "r1": {
            'gpufleet_gateway_replica_requests_total{status="200"}': 20.0,
            'gpufleet_gateway_replica_requests_total{status="502"}': 2.0,
            "gpufleet_gateway_replica_retries_total": 2.0,
        },
    }
    flat = d.to_dict()["counter_deltas"]
    assert flat["vllm:e2e_request_latency_seconds_count"] == 10
    assert flat["vllm:e2e_request_latency_seconds_sum"] == 6
    assert not any("num_requests_running" in k for k in flat)  # gauges are not deltas


def test_absent_series_read_as_none() -> None:
    d = counter_deltas({}, parse_counters("# TYPE x counter\nx_total 3\n"))
    assert d.prefix_cache_hit_rate is None and d.preemptions is None
    assert d.to_dict()["counter_deltas"] == {"x_total": 3.0}


def test_knee_on_a_rate_sweep() -> None:
    rates = [2, 4, 8, 16]
    thr = [2.0, 3.9, 7.5, 9.0]
    ttft = [50, 55, 90, 900]
    knee, why = find_knee("rate", rates, thr, ttft)
    assert knee == 2 and "16" in why
    # TTFT blow-up alone also marks the knee
    knee, _ = find_knee("rate", rates, [2, 4, 8, 16], [50, 60, 200, 400])
    assert knee == 1
    # all served: no knee inside the sweep
    assert find_knee("rate", rates, [2, 4, 8, 16], [50, 50, 50, 50])[0] is None
    # a short run's drain time is not mistaken for falling behind
    assert find_knee("rate", [160.0], [119.0], [20.0], requests=[40], drain_s=0.08)[0] is None


def test_knee_on_a_concurrency_sweep() -> None:
    knee, _ = find_knee("concurrency", [1, 2, 4, 8], [10, 19, 36, 38], [10, 10, 11, 30])
    assert knee == 2


def test_parse_sweep() -> None:
    assert parse_sweep("rate=2,4,8,16") == ("rate", [2.0, 4.0, 8.0, 16.0])
    assert parse_sweep("concurrency=1,4") == ("concurrency", [1.0, 4.0])
    for bad in ("rate", "speed=1,2", "rate=4,2", "rate=1", "concurrency=1.5,2", "rate=a,b"):
        with pytest.raises(UserError) as e:
            parse_sweep(bad)
        assert e.value.field == "--sweep"


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"url": "127.0.0.1:8000"}, "--url"),
        ({"rate": 0.0}, "--rate"),
        ({"concurrency": 4, "rate": 5.0}, "--concurrency"),
        ({"ramp": (1.0, 5.0)}, "--ramp"),
        ({"duration_s": 5.0}, "--duration"),
        ({"range_ratio": 1.0}, "--range-ratio"),
        ({"sessions": 3, "prefix_groups": 2}, "--prefix-groups"),
        ({"turns": 0}, "--turns"),
        ({"percentiles": (99.0, 101.0)}, "--percentiles"),
        ({"output_tokens": 0}, "--output-tokens"),
        ({"trace": "t.csv", "rate": 5.0}, "--rate"),
        ({"warmup_requests": -1}, "--warmup"),
    ],
)
def test_config_errors_name_the_flag(kwargs: dict, flag: str) -> None:
    base = {"url": "http://127.0.0.1:1"} | kwargs
    with pytest.raises(UserError) as e:
        BenchConfig(**base).validate()
    assert e.value.field == flag
    assert e.value.fix


def test_config_to_dict_hides_the_key_and_writes_inf() -> None:
    d = BenchConfig(url="http://x", api_key="secret").to_dict()
    assert d["api_key"] == "***" and d["rate"] == "inf"
    assert BenchConfig(url="http://x", rate=math.inf, duration_s=3, concurrency=2).validate()
