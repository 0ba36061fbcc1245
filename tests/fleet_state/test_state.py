"""What drivers report to the fleet core: requests on replicas (and the policy hears of
them), scraped engine metrics, and the typed signal snapshot built from all of it."""

from __future__ import annotations

from gpufleet.autoscale.gateway_link import fleet_signals
from gpufleet.fleet_state import GatewaySignals, ScrapedMetrics
from gpufleet.routing import make_policy
from gpufleet.routing.types import ReplicaState

from .helpers import fleet, info, ready


class Recorder:
    """A routing policy that records its notifications (it routes like round robin)."""

    name = "recorder"
    uses_prefix_hashes = False

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.capacity: dict[str, int] = {}

    def choose(self, request, replicas):  # type: ignore[no-untyped-def]
        return replicas[0] if replicas else None

    def on_started(self, request, replica):  # type: ignore[no-untyped-def]
        self.calls.append(("started", request.request_id, replica.replica_id))

    def on_first_token(self, request, replica):  # type: ignore[no-untyped-def]
        self.calls.append(("first_token", request.request_id, replica.replica_id))

    def on_finished(self, request, replica, ok):  # type: ignore[no-untyped-def]
        self.calls.append(("finished", request.request_id, replica.replica_id, str(ok)))

    def on_replica_removed(self, replica_id: str) -> None:
        self.calls.append(("removed", replica_id))

    def set_capacity_tokens(self, replica_id: str, tokens: int) -> None:
        self.capacity[replica_id] = tokens


def test_notifications_keep_counts_and_tell_the_policy() -> None:
    f = fleet()
    p = Recorder()
    a = ready(f, "a")
    q1, q2 = info(1), info(2)
    f.started(q1, a, p)
    f.started(q2, a, p)
    f.first_token(q1, a, p)
    assert (a.in_flight, a.streaming) == (2, 1)
    f.finished(q1, a, p, ok=True, streamed=True)
    f.finished(q2, a, p, ok=False)
    assert (a.in_flight, a.streaming) == (0, 0)
    assert p.calls == [
        ("started", "q1", "a"), ("started", "q2", "a"), ("first_token", "q1", "a"),
        ("finished", "q1", "a", "True"), ("finished", "q2", "a", "False"),
    ]  # fmt: skip


def test_tenant_policies_and_who_hears_of_a_removed_replica() -> None:
    default, gold = Recorder(), Recorder()
    f = fleet(tenant_policies={"gold": gold})
    f.policy = default
    f.policies = (default, gold)
    assert f.policy_for("gold") is gold and f.policy_for("other") is default
    assert f.policy_for(None) is default
    ready(f, "a")
    f.table.remove("a")
    assert default.calls == [("removed", "a")] and gold.calls == [("removed", "a")]


def test_a_scrape_records_the_in_flight_count_and_resizes_policies_once() -> None:
    p = Recorder()
    f = fleet()
    f.policy, f.policies = p, (p,)
    a = ready(f, "a")
    f.started(info(1), a, p)
    f.apply_scrape(a, ScrapedMetrics(3, 2, 0.5, kv_capacity_tokens=16000), now_s=12.0)
    assert a.stats is not None
    assert (a.stats.num_running, a.stats.num_waiting, a.stats.kv_cache_usage) == (3, 2, 0.5)
    assert (a.stats.scraped_at_s, a.stats.in_flight_at_scrape) == (12.0, 1)
    assert p.capacity == {"a": 16000} and a.kv_capacity_tokens == 16000
    p.capacity.clear()
    f.apply_scrape(a, ScrapedMetrics(0, 0, 0.0, kv_capacity_tokens=16000), now_s=13.0)
    assert p.capacity == {}  # unchanged capacity: no resize
    f.apply_scrape(a, ScrapedMetrics(0, 0, 0.0, kv_capacity_tokens=32000), now_s=14.0)
    assert p.capacity == {"a": 32000}


def test_signals_snapshot_round_trips_through_the_admin_apis_json() -> None:
    f = fleet(policy="round_robin", signals_window_s=30.0)
    a = ready(f, "a")
    ready(f, "b")
    f.table.drain("b")
    policy = make_policy("round_robin", seed=0)
    f.started(info(1), a, policy)
    f.apply_scrape(a, ScrapedMetrics(4, 1, 0.25), now_s=9.0)
    for i in range(10):
        f.observe_latency(5.0 + i * 0.1, ttft_s=0.1 * (i + 1), tpot_s=0.01 if i else None)
    f.admit("x2", None, 9.5, 20.0)  # refused: unknown model, nothing queued
    snap = f.signals(10.0)
    assert snap.queue_depth == 0 and snap.in_flight_total == 1
    assert snap.replicas_by_state == {"starting": 0, "ready": 1, "draining": 1, "dead": 0}
    assert snap.window_s == 30.0 and snap.streamed_requests_in_window == 10
    assert snap.ttft_s.p50_s is not None and snap.tpot_s.p90_s == 0.01
    ra = snap.replica("a")
    assert ra is not None and (ra.num_running, ra.num_waiting, ra.in_flight) == (4, 1, 1)
    assert ra.stats_age_s == 1.0
    rb = snap.replica("b")
    assert rb is not None and rb.state is ReplicaState.DRAINING and rb.num_running is None
    # The admin API's JSON (keys as before the snapshot was typed) and back.
    raw = snap.to_json()
    assert set(raw) == {
        "time_s", "queue_depth", "queue_depth_by_model", "in_flight_total",
        "replicas_by_state", "window_s", "ttft_s", "tpot_s", "streamed_requests_in_window",
        "replicas", "latency_by_model", "admitted_total", "admitted_in_window",
        "admitted_total_by_model", "admitted_in_window_by_model", "tokens_per_request",
        "prompt_tokens_per_request",
    }  # fmt: skip
    assert set(raw["ttft_s"]) == {"p50", "p90", "p99"}
    assert GatewaySignals.from_json(raw) == snap
    # The controller reads the same figures from either.
    assert fleet_signals(snap, []) == fleet_signals(GatewaySignals.from_json(raw), [])
    merged = fleet_signals(snap, [])
    assert [r.replica_id for r in merged.ready] == ["a"] and merged.in_flight == 1
