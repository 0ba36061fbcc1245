"""The fleet core for several engines and model groups: a replica without load metrics is
routed by in-flight counts, each model has its own queue and its own signals, and an
engine is named from what the replica answers."""

from __future__ import annotations

import pytest

from gpufleet.fleet_state import (
    LOAD_FROM_ENGINE,
    LOAD_FROM_IN_FLIGHT,
    AdmissionQueue,
    FleetReplica,
    FleetState,
    GatewaySignals,
    QueueLimits,
    QueueTicket,
    Refusal,
    ScrapedMetrics,
    identify,
)
from gpufleet.routing import make_policy

from .helpers import fleet, info, ready


def test_a_replica_without_load_metrics_is_routed_by_in_flight_counts() -> None:
    """Read as zeros, a replica whose engine exports no load would look idle and draw
    every request; routed by the gateway's in-flight count it competes fairly."""
    f = fleet(policy="queue_depth")
    busy_reporting, silent = ready(f, "a"), ready(f, "b")
    silent.in_flight = 8
    busy_reporting.in_flight = 5
    assert f.apply_scrape(busy_reporting, ScrapedMetrics(5, 0, 0.1), now_s=1.0)
    assert f.apply_scrape(silent, ScrapedMetrics.no_load("sglang"), now_s=1.0)
    assert silent.stats is None and silent.load_signals == LOAD_FROM_IN_FLIGHT
    assert busy_reporting.load_signals == LOAD_FROM_ENGINE
    chosen = f.policy.choose(info(1), f.table.eligible("m", None))
    assert chosen is busy_reporting  # 5 < 8
    # Said once: the next scrapes change nothing.
    assert not f.apply_scrape(silent, ScrapedMetrics.no_load("sglang"), now_s=2.0)
    assert not f.apply_scrape(busy_reporting, ScrapedMetrics(5, 0, 0.1), now_s=2.0)
    assert silent.engine == "sglang" and silent.engine_source == "/metrics names"
    # A replica that starts reporting switches back (and that is news again).
    assert f.apply_scrape(silent, ScrapedMetrics(1, 0, 0.0), now_s=3.0)
    assert silent.stats is not None and silent.load_note == ""


def test_a_configured_engine_is_not_overridden_by_the_names_it_exports() -> None:
    f = fleet()
    r = ready(f, "a")
    r.engine, r.engine_source = "sglang", "config"
    f.apply_scrape(r, ScrapedMetrics(1, 0, 0.0, engine="vllm"), now_s=1.0)
    assert (r.engine, r.engine_source) == ("sglang", "config")


def test_kv_usage_an_engine_does_not_export_stays_unknown_in_the_signals() -> None:
    f = fleet()
    tgi = ready(f, "a")
    f.apply_scrape(tgi, ScrapedMetrics(2, 1, None, engine="tgi"), now_s=1.0)
    snap = f.signals(2.0).replica("a")
    assert snap is not None and (snap.num_running, snap.kv_cache_usage) == (2, None)


def _two_model_fleet() -> FleetState[FleetReplica]:
    queue = AdmissionQueue(
        max_size=10, timeout_s=60.0, retry_after_s=5,
        per_model={"chat": QueueLimits(max_size=1, timeout_s=300.0, retry_after_s=30)},
    )  # fmt: skip
    return FleetState[FleetReplica](
        make_policy("least_outstanding", seed=0),
        served_models=("chat", "small", "other"),
        queue=queue,
    )


def test_each_group_has_its_own_queue_and_limits() -> None:
    f = _two_model_fleet()
    first = f.admit("chat", None, 0.0, f.queue.limits("chat").timeout_s)
    assert isinstance(first, QueueTicket) and first.deadline_s == 300.0
    second = f.admit("chat", None, 0.0, 300.0)
    assert isinstance(second, Refusal) and second.reason == "queue_full"
    assert second.headers == {"Retry-After": "30"}
    # The chat queue being full refuses no request of another model.
    small = f.admit("small", None, 0.0, f.queue.limits("small").timeout_s)
    assert isinstance(small, QueueTicket) and small.deadline_s == 60.0
    # Models without limits of their own share the default queue (10 in all).
    for _ in range(9):
        assert isinstance(f.admit("other", None, 0.0, 60.0), QueueTicket)
    refused = f.admit("small", None, 0.0, 60.0)
    assert isinstance(refused, Refusal) and refused.headers == {"Retry-After": "5"}
    assert isinstance(f.admit("chat", None, 1.0, 300.0), Refusal)  # still its own 1
    f.leave_queue(first)
    assert isinstance(f.admit("chat", None, 1.0, 300.0), QueueTicket)
    assert f.queue.depth_by_model == {"chat": 1, "small": 1, "other": 9}


def test_new_limits_keep_the_shared_count_right() -> None:
    f = _two_model_fleet()
    assert isinstance(f.admit("chat", None, 0.0, 9.0), QueueTicket)
    f.queue.set_limits(QueueLimits(max_size=1), {})  # chat now shares the default queue
    assert f.queue.is_full("small")


def test_signals_for_one_model() -> None:
    f = _two_model_fleet()
    a = ready(f, "a", models=("chat",))
    assert isinstance(f.admit("small", None, 2.0, 60.0), QueueTicket)  # none ready yet
    b = ready(f, "b", models=("small",))
    a.in_flight, b.in_flight = 3, 1
    for i in range(4):
        f.observe_latency(1.0 + i, ttft_s=2.0, tpot_s=0.05, model="chat")
    f.observe_latency(2.0, ttft_s=0.1, tpot_s=0.01, model="small")
    snap = f.signals(5.0)
    chat = snap.for_model("chat")
    assert [r.replica_id for r in chat.replicas] == ["a"]
    assert (chat.in_flight_total, chat.queue_depth, chat.streamed_requests_in_window) == (3, 0, 4)
    assert chat.ttft_s.p90_s == 2.0 and chat.replicas_by_state["ready"] == 1
    small = snap.for_model("small", replica_ids={"c"})
    assert (small.queue_depth, small.ttft_s.p50_s, small.in_flight_total) == (1, 0.1, 1)
    # The fleet-wide view still sees both; the JSON round trip keeps the per-model part.
    assert snap.streamed_requests_in_window == 5 and snap.queue_depth == 1
    assert GatewaySignals.from_json(snap.to_json()) == snap


@pytest.mark.parametrize(
    ("answers", "engine", "source"),
    [
        ({"scraped": ScrapedMetrics(engine="vllm")}, "vllm", "/metrics names"),
        ({"cards": [{"id": "m", "owned_by": "sglang"}]}, "sglang", "/v1/models owned_by"),
        ({"cards": [{"id": "m", "owned_by": "tensorrt_llm"}]}, "trtllm", "/v1/models owned_by"),
        ({"info": {"model_id": "m", "router": "text-generation-router", "version": "3.3.6"}},
         "tgi", "/info"),
        ({"server_info": {"tp_size": 1, "schedule_policy": "fcfs", "version": "0.5.10"}},
         "sglang", "/get_server_info"),
        ({"version": {"version": "0.10.2"}}, "vllm", "/version"),
        ({"cards": [{"id": "m", "owned_by": "someone"}], "version": {"v": 1}}, None, ""),
    ],
)  # fmt: skip
def test_engine_identity_from_what_a_replica_answers(
    answers: dict[str, object], engine: str | None, source: str
) -> None:
    found = identify(**answers)  # type: ignore[arg-type]
    assert (found.engine, found.source) == (engine, source)


def test_metric_names_outrank_other_answers() -> None:
    found = identify(
        ScrapedMetrics(engine="vllm"),
        server_info={"tp_size": 1, "version": "0.10.2"},  # gpufleet's vLLM replica has it
    )
    assert found.engine == "vllm" and found.describe() == "vllm, from /metrics names"
