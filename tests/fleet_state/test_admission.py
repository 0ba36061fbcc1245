"""Admission in the fleet core: route now, wait in the bounded queue, or refuse (404, and
the gateway's 503 with Retry-After for a full queue or a wait past its deadline)."""

from __future__ import annotations

from gpufleet.fleet_state import QueueTicket, Refusal

from .helpers import fleet, ready, replica


def test_route_at_once_when_a_replica_is_ready() -> None:
    f = fleet()
    a = ready(f, "a")
    assert f.admit("m", None, 0.0, 4.0) == [a]
    assert len(f.queue) == 0


def test_unknown_model_is_404() -> None:
    f = fleet()
    ready(f, "a")
    refusal = f.admit("x", None, 0.0, 4.0)
    assert isinstance(refusal, Refusal)
    assert (refusal.status, refusal.code, refusal.param) == (404, "model_not_found", "model")
    assert refusal.headers is None and refusal.reason == "model_not_found"


def test_queue_bounded_in_size_and_in_time() -> None:
    f = fleet(max_size=2)
    t1 = f.admit("m", None, 0.0, 4.0)
    t2 = f.admit("m", None, 1.0, 5.0)
    assert isinstance(t1, QueueTicket) and isinstance(t2, QueueTicket)
    assert f.queue.depth_by_model == {"m": 2}
    full = f.admit("m", None, 1.5, 5.5)
    assert isinstance(full, Refusal) and full.status == 503 and full.reason == "queue_full"
    assert full.message == "no replica ready for model 'm' (the queue is full)"
    assert full.headers == {"Retry-After": "7"}
    # A waiting request asks again: still waiting before its deadline, refused at it.
    assert f.admit("m", None, 3.0, 4.0, t1) is t1
    late = f.admit("m", None, 4.0, 4.0, t1)
    assert isinstance(late, Refusal) and late.reason == "queue_timeout"
    assert late.message == "no replica ready for model 'm' (timed out in the queue)"
    assert late.headers == {"Retry-After": "7"}
    assert list(f.queue) == [t2] and f.queue.depth_by_model == {"m": 1}


def test_queued_requests_go_in_arrival_order_once_a_replica_is_ready() -> None:
    f = fleet(max_size=3)
    tickets = [f.admit("m", None, float(i), 10.0 + i) for i in range(3)]
    assert all(isinstance(t, QueueTicket) for t in tickets)
    a = ready(f, "a")
    assert list(f.queue) == tickets
    for t in f.queue:
        assert isinstance(t, QueueTicket)
        assert f.admit(t.model, t.pool, 5.0, t.deadline_s, t) == [a]
    assert len(f.queue) == 0 and f.queue.depth_by_model == {}


def test_a_client_that_leaves_frees_its_place() -> None:
    f = fleet(max_size=1)
    t = f.admit("m", None, 0.0, 4.0)
    assert isinstance(t, QueueTicket)
    assert isinstance(f.admit("m", None, 0.0, 4.0), Refusal)
    f.leave_queue(t)
    f.leave_queue(t)  # twice is harmless
    assert isinstance(f.admit("m", None, 0.0, 4.0), QueueTicket)


def test_pools_wait_for_their_own_replicas() -> None:
    f = fleet(max_size=4)
    ready(f, "shared")
    t = f.admit("m", "gold", 0.0, 4.0)
    assert isinstance(t, QueueTicket)  # the shared replica is not gold's
    gold = ready(f, "g", pool="gold")
    assert f.admit("m", "gold", 1.0, 4.0, t) == [gold]


def test_fail_fast_when_no_replica_of_the_model_can_become_ready() -> None:
    """No waiting for the queue's timeout when every replica keeps failing its probes;
    with scale from zero promised (served_models), the request waits instead."""
    f = fleet(served=(), eject_after_failures=2)
    r = f.table.add(replica("a"))
    r.down_reason = "unreachable: nothing accepts connections at http://a"
    assert isinstance(f.admit("m", None, 0.0, 4.0), QueueTicket)  # not known down yet
    f.table.probe_failed(r)
    f.table.probe_failed(r)
    refusal = f.admit("m", None, 1.0, 4.0)
    assert isinstance(refusal, Refusal) and refusal.status == 503
    assert "can become ready" in refusal.message and "unreachable" in refusal.message
    assert refusal.retry_after_s == 7
    waiting = fleet(served=("m",), eject_after_failures=2)
    w = waiting.table.add(replica("a"))
    waiting.table.probe_failed(w)
    waiting.table.probe_failed(w)
    assert isinstance(waiting.admit("m", None, 1.0, 4.0), QueueTicket)
