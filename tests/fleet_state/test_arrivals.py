"""Requests the gateway admitted: counted once each (not refused ones, not a queued one
polled again), over the window and in total, and added up across a gateway's workers."""

from __future__ import annotations

from gpufleet.autoscale.gateway_link import fleet_signals
from gpufleet.fleet_state import GatewaySignals, LatencyWindows, merge_signals
from gpufleet.fleet_state.signals import build_signals
from gpufleet.routing.types import ReplicaState

from .helpers import fleet, ready


def test_admissions_count_once_and_skip_refusals() -> None:
    f = fleet(signals_window_s=10.0, max_size=1)
    ticket = f.admit("m", None, 0.0, 30.0)  # no replica yet: queued, counted
    assert not isinstance(ticket, list) and not hasattr(ticket, "status")
    f.admit("m", None, 1.0, 30.0, ticket)  # the same request polled again: not counted
    refused = f.admit("m", None, 1.0, 30.0)  # the queue (of 1) is full: refused
    assert getattr(refused, "status", None) == 503
    f.admit("nope", None, 1.0, 30.0)  # unknown model: refused
    ready(f, "a")
    for t in (2.0, 12.0, 13.0):  # routed at once: counted
        assert isinstance(f.admit("m", None, t, 30.0), list)
    snap = f.signals(13.0)
    assert snap.admitted_total == 4 and snap.admitted_total_by_model == {"m": 4}
    assert snap.admitted_in_window == 2  # 12 and 13 are within 10 s of 13
    assert snap.arrival_rate_rps == 0.2
    assert GatewaySignals.from_json(snap.to_json()) == snap
    assert fleet_signals(snap, []).admitted_total == 4
    m = snap.for_model("m")
    assert (m.admitted_total, m.admitted_in_window) == (4, 2)
    assert snap.for_model("other").admitted_total == 0


def test_workers_admissions_add_up() -> None:
    parts = []
    for n in (3, 5):
        f = fleet(signals_window_s=60.0)
        ready(f, "a")
        for i in range(n):
            f.admit("m", None, float(i), 30.0)
        parts.append(GatewaySignals.from_json(f.signals(10.0).to_json()))
    merged = merge_signals(10.0, parts, LatencyWindows(60.0))
    assert merged.admitted_total == 8 and merged.admitted_in_window == 8
    assert merged.admitted_total_by_model == {"m": 8}
    assert merged.for_model("m").admitted_in_window == 8
    assert merged.replica("a") is not None
    assert merged.replica("a").state is ReplicaState.READY  # type: ignore[union-attr]
    empty = build_signals(10.0, [], {}, LatencyWindows(60.0))
    assert empty.admitted_total == 0 and empty.arrival_rate_rps == 0.0


def test_a_retry_admitted_again_is_not_a_new_arrival() -> None:
    # The live gateway's retries and resumed streams, and the simulator's retries, go
    # through `admit` again: one request, one arrival (the autoscaler's rate).
    f = fleet(signals_window_s=60.0)
    queued = f.admit("m", None, 0.0, 30.0)  # first try, no replica yet: counted
    f.leave_queue(queued)  # type: ignore[arg-type]
    assert not isinstance(f.admit("m", None, 1.0, 30.0, first_try=False), list)  # queued retry
    ready(f, "a")
    assert isinstance(f.admit("m", None, 2.0, 30.0, first_try=False), list)  # routed retry
    f.arrived(3.0, "m")  # the gateway's hot path: routed on its first try without `admit`
    assert f.signals(3.0).admitted_total == 2
