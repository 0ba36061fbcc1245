"""Fleet config validation, the demo schedule, the summary and the view (pure, no processes)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from rich.console import Console

from gpufleet.autoscale.decision import ScalingDecision
from gpufleet.autoscale.signals import FleetSignals, ReplicaSignals
from gpufleet.errors import UserError
from gpufleet.fleet.config import load_fleet, validate_fleet
from gpufleet.fleet.demo import demo_fleet
from gpufleet.fleet.summary import ReplicaTimeline, summarize, summary_lines
from gpufleet.fleet.traffic import DEMO_PHASES, RequestResult
from gpufleet.fleet.view import Snapshot, render
from gpufleet.routing.types import ReplicaState
from gpufleet.workload import RatePhase, phase_at, schedule_offsets, total_duration_s


def test_default_fleet_is_what_the_issue_says() -> None:
    cfg = load_fleet(None)
    assert cfg.replicas.model == "meta-llama/Llama-3.1-8B" and cfg.replicas.gpu == "h100-sxm"
    assert (cfg.autoscale.min_replicas, cfg.autoscale.max_replicas) == (1, 8)
    assert cfg.autoscale.enabled and cfg.autoscale.policy == "default"
    gw = cfg.gateway_settings()
    assert (gw["host"], gw["port"], gw["policy"]) == ("127.0.0.1", 8000, "prefix_aware")
    assert "--port {port}" in cfg.replicas.full_command()
    demo_cap = demo_fleet().capacity()
    assert demo_cap is not None and demo_cap.sequences == 8
    assert demo_cap.source.startswith("plan: min(max_num_seqs 8,")


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"autoscale": {"polcy": "hpa"}}, "autoscale.polcy"),
        ({"autoscale": {"policy": "hpaa"}}, "autoscale.policy"),
        ({"autoscale": {"params": {"bogus": 1}}}, "autoscale.params.bogus"),
        ({"autoscale": {"min_replicas": 3, "max_replicas": 2}}, "autoscale"),
        ({"replicas": {"command": "serve --port 1"}}, "replicas.command"),
        ({"replicas": {"command": "serve {modle} --port {port}"}}, "replicas.command"),
        ({"replicas": {"startup_s": -1}}, "replicas.startup_s"),
    ],
)
def test_bad_fleet_configs_name_the_field(data: dict, field: str) -> None:
    with pytest.raises(UserError) as e:
        validate_fleet(data)
    assert e.value.field is not None and e.value.field.startswith(field), str(e.value)


def test_fleet_yaml_file_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="FLEET_YAML"):
        load_fleet(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("autoscale: [1, 2\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_fleet(bad)
    good = tmp_path / "good.yaml"
    good.write_text("autoscale:\n  policy: kpa\n  max_replicas: 3\n")
    assert load_fleet(good).autoscale.policy == "kpa"


def test_demo_schedule_follows_its_phases() -> None:
    assert 100 <= total_duration_s(DEMO_PHASES) <= 150  # about two minutes
    assert [p.name for p in DEMO_PHASES] == ["quiet", "ramp", "burst", "quiet"]
    phases = (RatePhase("a", 10, 1, 1), RatePhase("b", 10, 1, 21))
    assert phase_at(phases, 5)[1] == 1
    p, rate = phase_at(phases, 15)
    assert p is not None and p.name == "b" and rate == pytest.approx(11)
    assert phase_at(phases, 25) == (None, 0.0)
    steps = (RatePhase("low", 100, 1, 1), RatePhase("high", 100, 10, 10))
    times = schedule_offsets(steps, rng=random.Random(3))
    low = sum(1 for t in times if t < 100)
    high = len(times) - low
    assert 60 < low < 140 and 850 < high < 1150  # Poisson counts around 100 and 1000
    assert times == sorted(times)
    assert times == schedule_offsets(steps, rng=random.Random(3))


def test_summary_counts_errors_and_replica_seconds() -> None:
    results = [
        RequestResult(0.0, True, 200, 0.1, 0.02, 1.0, 50),
        RequestResult(1.0, True, 200, 0.3, 0.04, 2.0, 50),
        RequestResult(2.0, False, 503, error="queue timeout"),
    ]
    tl = ReplicaTimeline()
    for t, n in [(0, 1), (10, 3), (20, 1), (40, 1)]:
        tl.add(float(t), n)
    s = summarize(results, tl, scale_outs=1, scale_ins=2)
    assert (s.requests, s.ok, s.errors) == (3, 2, 1)
    assert s.error_kinds == {"HTTP 503": 1}
    # numpy's linear percentiles, as `gpufleet bench` reports them
    assert s.ttft_p50_s == pytest.approx(0.2) and s.ttft_p99_s == pytest.approx(0.298)
    assert s.replica_seconds == pytest.approx(10 + 30 + 20)
    assert s.static_peak_replica_seconds == pytest.approx(3 * 40)
    assert s.saved_fraction == pytest.approx(0.5)
    text = "\n".join(summary_lines(s))
    assert "1 errors (HTTP 503: 1)" in text and "50% saved" in text


def test_view_renders_replicas_and_reasons() -> None:
    sig = FleetSignals(
        replicas=(
            ReplicaSignals("replica-1", ReplicaState.READY, 8, 3, 0.42, 11),
            ReplicaSignals("replica-2", ReplicaState.STARTING),
        ),
        queue_depth=2,
        in_flight=11,
    )
    change = ScalingDecision(2, "demand 13, 3 waiting → 2", "default", 12.0, 1)
    snap = Snapshot(30.0, "http://127.0.0.1:8000", "default", sig, [change], change, "ramp", 4.5)
    snap.replica_ttft_p90_s = {"replica-1": 0.25}
    console = Console(width=160, record=True)
    console.print(render(snap))
    out = console.export_text()
    for needle in ("replica-1", "starting", "42%", "250 ms", "1→2", "3 waiting", "ramp at 4.5"):
        assert needle in out, needle


def test_histogram_quantile_and_windowed_ttft() -> None:
    from gpufleet.autoscale.scrape import parse_histogram
    from gpufleet.fleet.replica_latency import ReplicaTtft
    from gpufleet.stats import bucket_delta, histogram_quantile

    text = (
        "# TYPE vllm:time_to_first_token_seconds histogram\n"
        'vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 5\n'
        'vllm:time_to_first_token_seconds_bucket{le="0.5",model_name="m"} 15\n'
        'vllm:time_to_first_token_seconds_bucket{le="1.0",model_name="m"} 20\n'
        'vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 20\n'
        'vllm:time_to_first_token_seconds_count{model_name="m"} 20\n'
        'vllm:time_to_first_token_seconds_sum{model_name="m"} 6.0\n'
    )
    buckets = parse_histogram(text, "vllm:time_to_first_token_seconds")
    assert buckets == [(0.1, 5.0), (0.5, 15.0), (1.0, 20.0), (float("inf"), 20.0)]
    # rank 18 of 20 lies in (0.5, 1.0]: 0.5 + 0.5 × (18 − 15) / 5 = 0.8
    assert histogram_quantile(0.9, buckets) == pytest.approx(0.8)
    assert histogram_quantile(0.9, []) is None
    older = [(0.1, 5.0), (0.5, 5.0), (1.0, 5.0), (float("inf"), 5.0)]
    assert bucket_delta(buckets, older)[1] == (0.5, 10.0)
    assert bucket_delta(older, buckets) == older  # counters went down: a restart
    w = ReplicaTtft(window_s=10.0)
    w.add("r1", 0.0, older)
    w.add("r1", 5.0, buckets)  # 15 new: 10 in (0.1, 0.5], 5 in (0.5, 1.0]
    assert w.p90_s()["r1"] == pytest.approx(0.5 + 0.5 * (13.5 - 10) / 5)
    w.forget_except(set())
    assert w.p90_s() == {}


def test_demo_fleet_gives_every_policy_targets_alike() -> None:
    from gpufleet.autoscale.policies import POLICIES
    from gpufleet.fleet.demo import DEMO_BATCH

    for name in POLICIES:
        cfg = demo_fleet(name)
        assert cfg.autoscale.policy == name
    assert demo_fleet("hpa").autoscale.params == {"target_per_replica": 0.7 * DEMO_BATCH}
    with pytest.raises(UserError, match=r"autoscale\.policy"):
        demo_fleet("nope")


def test_parse_histogram_hands_only_its_buckets_to_the_parser(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replica exposes ~400 lines; `gpufleet up` reads one histogram of every replica
    in the gateway's event loop, so only that histogram's bucket lines may reach the
    (slow) Prometheus parser, and they must still add up per bucket."""
    from gpufleet.autoscale import scrape
    from gpufleet.engine import SchedulerStats
    from gpufleet.replica.metrics import TTFT_BUCKETS_S, ReplicaMetrics

    stats = SchedulerStats(3, 1, 0.4, 1000, 16, 100, 50, 0, 1000, 2000, {"stop": 3}, 100, 5.0)
    metrics = ReplicaMetrics("m", lambda: stats, {"block_size": "16"})
    for value in (0.003, 0.03, 0.3, 3.0):
        metrics.ttft.observe(value)
        metrics.e2e.observe(value * 10)
    text = metrics.render().decode()
    seen: list[str] = []
    parse = scrape.text_string_to_metric_families

    def spy(t: str):  # type: ignore[no-untyped-def]
        seen.append(t)
        return parse(t)

    monkeypatch.setattr(scrape, "text_string_to_metric_families", spy)
    buckets = scrape.parse_histogram(text, "vllm:time_to_first_token_seconds")
    assert [le for le, _ in buckets] == [*TTFT_BUCKETS_S, float("inf")]
    counts = dict(buckets)
    assert (counts[0.001], counts[0.005], counts[0.04], counts[0.5], counts[5.0]) == (0, 1, 2, 3, 4)
    assert counts[float("inf")] == 4
    lines = "".join(seen).splitlines()
    assert lines and all(ln.startswith("vllm:time_to_first_token_seconds_bucket") for ln in lines)
