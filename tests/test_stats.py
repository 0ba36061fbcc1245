"""One percentile definition (numpy's linear, vLLM bench's) and one histogram everywhere."""

from __future__ import annotations

import random

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.bench.metrics import summarize as bench_summarize
from gpufleet.bench.records import RequestRecord
from gpufleet.fleet.summary import ReplicaTimeline, summary_lines
from gpufleet.fleet.summary import summarize as up_summarize
from gpufleet.fleet.traffic import result_from_record
from gpufleet.fleet_state.latency import RecentWindow
from gpufleet.routing.replay import ReplayReport
from gpufleet.stats import (
    Histogram,
    histogram_quantile,
    mean,
    percentile,
    percentiles,
    std,
    summarize_ms,
)

PS = (0.0, 1.0, 10.0, 50.0, 90.0, 95.0, 99.0, 99.9, 100.0)


def random_series(seed: int) -> list[float]:
    rng = random.Random(seed)
    n = rng.choice((1, 2, 3, 7, 100, 1001))
    return [rng.lognormvariate(-2.0, 1.0) for _ in range(n)]


@pytest.mark.parametrize("seed", range(12))
def test_percentile_is_numpy_linear_on_random_data(seed: int) -> None:
    xs = random_series(seed)
    want = [float(np.percentile(xs, p)) for p in PS]
    assert percentiles(xs, PS) == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert percentile(xs, 99.0) == pytest.approx(float(np.percentile(xs, 99.0)), rel=1e-12)
    assert mean(xs) == pytest.approx(float(np.mean(xs)))
    assert std(xs) == pytest.approx(float(np.std(xs)))  # population std (ddof=0)


def test_small_cases_interpolate_between_ranks() -> None:
    xs = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    assert percentile(xs, 50) == pytest.approx(3.5)
    assert percentile(xs, 90) == pytest.approx(6.0 + 0.3 * 3.0)  # not nearest-rank (9.0)
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 9.0
    assert percentile([], 99) is None and percentiles([], (50, 99)) is None
    with pytest.raises(ValueError, match=r"\[0, 100\]"):
        percentiles(xs, (101.0,))


@pytest.mark.parametrize("seed", range(6))
def test_every_consumer_uses_the_one_definition(seed: int) -> None:
    xs = random_series(100 + seed)
    np99 = float(np.percentile(xs, 99))
    np50 = float(np.percentile(xs, 50))
    # the gateway's recent window (what autoscaling policies read)
    window = RecentWindow(window_s=60.0)
    for i, x in enumerate(xs):
        window.add(i * 0.01, x)
    got = window.percentiles(len(xs) * 0.01, (0.5, 0.99))
    assert got["p50"] == pytest.approx(np50) and got["p99"] == pytest.approx(np99)
    # the routing replay
    report = ReplayReport({}, 0, 0, ttft_s=list(xs))
    assert report.ttft_quantile_s(0.99) == pytest.approx(np99)
    # bench (and sim's report, which calls the same summarize_ms)
    ms = summarize_ms(xs, (50.0, 99.0))
    assert ms["p99"] == pytest.approx(np99 * 1000) and ms["median"] == pytest.approx(np50 * 1000)


def test_an_empty_window_has_no_percentiles() -> None:
    window = RecentWindow(window_s=1.0)
    window.add(0.0, 5.0)
    assert window.percentiles(10.0, (0.5, 0.99)) == {"p50": None, "p99": None}


def _record(start_s: float, ttft_s: float, itl_s: float, tokens: int) -> RequestRecord:
    times = [start_s + ttft_s + i * itl_s for i in range(tokens)]
    return RequestRecord(
        start_s=start_s, token_times_s=times, usage_completion_tokens=tokens, ok=True, status=200
    )


def test_up_summary_and_bench_print_the_same_p99_for_the_same_requests() -> None:
    rng = random.Random(7)
    records = [
        _record(i * 0.1, rng.uniform(0.05, 2.0), rng.uniform(0.01, 0.05), rng.randint(2, 40))
        for i in range(137)
    ]
    bench = bench_summarize(records, duration_s=30.0)
    up = up_summarize(
        [result_from_record(r, r.start_s) for r in records], ReplicaTimeline([(0, 1), (30, 1)])
    )
    ttfts = [r.token_times_s[0] - r.start_s for r in records]
    assert up.ttft_p99_s is not None and up.tpot_p99_s is not None
    assert bench.ttft_ms["p99"] == pytest.approx(up.ttft_p99_s * 1000, rel=1e-12)
    assert bench.ttft_ms["p99"] == pytest.approx(float(np.percentile(ttfts, 99)) * 1000)
    assert bench.tpot_ms["p99"] == pytest.approx(up.tpot_p99_s * 1000, rel=1e-12)
    assert bench.tpot_ms["p90"] == pytest.approx(up.tpot_p90_s * 1000, rel=1e-12)  # type: ignore[operator]
    # and the printed figures read the same
    ttft_line = next(line for line in summary_lines(up) if line.startswith("TTFT"))
    assert f"p99 {bench.ttft_ms['p99']:.0f} ms" in ttft_line


@pytest.mark.parametrize("seed", range(4))
def test_histogram_counts_le_buckets_like_prometheus(seed: int) -> None:
    rng = random.Random(seed)
    bounds = (0.01, 0.1, 0.5, 1.0, 5.0)
    values = [rng.choice((0.1, 1.0)) if i % 5 == 0 else rng.expovariate(2.0) for i in range(500)]
    h = Histogram(bounds)
    for v in values:
        h.observe(v)
    cumulative = h.cumulative()
    assert [le for le, _ in cumulative] == ["0.01", "0.1", "0.5", "1.0", "5.0", "+Inf"]
    for (le, count), bound in zip(cumulative, (*bounds, float("inf")), strict=True):
        assert count == sum(1 for v in values if v <= bound), le  # le is inclusive
    assert h.count == len(values) and h.sum == pytest.approx(sum(values))
    buckets = [(float(le), n) for le, n in cumulative]
    assert h.quantile(0.9) == histogram_quantile(0.9, buckets)


def test_histogram_quantile_interpolates_inside_the_bucket() -> None:
    h = Histogram((1.0, 2.0, 4.0))
    for v in (0.5, 1.5, 1.5, 3.0):
        h.observe(v)
    # rank 0.5 * 4 = 2 falls in (1, 2] holding counts 1..3: 1 + (2 - 1) / (3 - 1) * 1
    assert h.quantile(0.5) == pytest.approx(1.5)
    assert Histogram((1.0,)).quantile(0.5) is None
    h.observe(100.0)
    assert h.quantile(1.0) == 4.0  # in +Inf: the highest finite bound, as Prometheus
    with pytest.raises(ValueError, match="increasing"):
        Histogram((2.0, 1.0))


def test_histogram_exposition_parses_as_prometheus_text() -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import HistogramMetricFamily

    h = Histogram((0.5, 1.0))
    for v in (0.2, 0.7, 3.0):
        h.observe(v)

    class One:
        def collect(self):  # type: ignore[no-untyped-def]
            fam = HistogramMetricFamily("x_seconds", "x", labels=[])
            fam.add_metric([], h.cumulative(), h.sum)
            yield fam

    registry = CollectorRegistry()
    registry.register(One())  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    samples = {
        (s.name, s.labels.get("le")): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    assert samples[("x_seconds_bucket", "0.5")] == 1
    assert samples[("x_seconds_bucket", "+Inf")] == 3
    assert samples[("x_seconds_count", None)] == 3
    assert samples[("x_seconds_sum", None)] == pytest.approx(3.9)
