"""Routing state shared between the workers of one gateway (`--workers N`, issue 13): a
worker records what it routes as `PeerEvents`, the others apply them to their fleet core."""

from __future__ import annotations

import json

from gpufleet.fleet_state import PeerEvents
from gpufleet.routing.prefix import text_prefix_hashes

from .helpers import fleet, info, ready

PROMPT = "a long shared system prompt " * 40


def _hashes(text: str) -> tuple[int, ...]:
    return text_prefix_hashes(text)


def test_a_prefix_routed_by_a_peer_is_routed_to_the_same_replica_here() -> None:
    one, two = fleet("prefix_aware"), fleet("prefix_aware")
    for f in (one, two):
        for rid in ("a", "b", "c", "d"):
            ready(f, rid)
    outbox = one.share_with_peers()
    q = info(1, prefix_hashes=_hashes(PROMPT + "question 1"))
    chosen = one.policy.choose(q, one.candidates(q, None))
    assert chosen is not None
    one.started(q, chosen, one.policy)
    batch = outbox.take()
    assert batch.in_flight == {chosen.replica_id: 1}
    assert [rid for rid, _, _ in batch.routed] == [chosen.replica_id]
    assert not outbox  # taken: the next batch starts empty

    two.apply_peer_events(PeerEvents.from_json(batch.to_json()))  # as over the channel
    q2 = info(2, prefix_hashes=_hashes(PROMPT + "question 2"))
    assert two.policy.choose(q2, two.candidates(q2, None)).replica_id == chosen.replica_id  # type: ignore[union-attr]
    assert two.table.by_id[chosen.replica_id].peer_in_flight == 1

    one.finished(q, chosen, one.policy, ok=True)
    two.apply_peer_events(outbox.take())
    assert two.table.by_id[chosen.replica_id].peer_in_flight == 0


def test_peer_in_flight_counts_in_load_balancing() -> None:
    f = fleet("least_outstanding")
    a, b = ready(f, "a"), ready(f, "b")
    f.apply_peer_events(PeerEvents(in_flight={"a": 3, "gone": 2}))
    assert (a.peer_in_flight, a.in_flight) == (3, 0)
    assert f.policy.choose(info(1), [a, b]) is b
    f.apply_peer_events(PeerEvents(in_flight={"a": -5}))  # (a restarted peer's stale -1s)
    assert a.peer_in_flight == 0


def test_without_peers_nothing_is_recorded() -> None:
    f = fleet("prefix_aware")
    a = ready(f, "a")
    q = info(1, prefix_hashes=_hashes(PROMPT))
    f.started(q, a, f.policy)
    assert f.outbox is None


def test_the_first_event_of_a_batch_wakes_the_driver_once() -> None:
    f = fleet("least_outstanding")
    a = ready(f, "a")
    wakes: list[int] = []
    f.share_with_peers().on_first = lambda: wakes.append(1)
    f.started(info(1), a, f.policy)
    f.started(info(2), a, f.policy)
    assert wakes == [1]
    assert f.outbox is not None
    batch = f.outbox.take()
    assert batch.routed == []  # least_outstanding learns nothing from peers' prompts
    assert batch.in_flight == {"a": 2}
    f.finished(info(1), a, f.policy, ok=True)
    assert wakes == [1, 1]


def test_events_survive_the_json_round_trip() -> None:
    hashes = (0, 1, 2**64 - 1, 12345678901234567890)
    events = PeerEvents([("a", "t1", hashes), ("b", None, ())], {"a": 1, "b": -1})
    back = PeerEvents.from_json(json.loads(json.dumps(events.to_json())))
    assert back.routed == events.routed
    assert back.in_flight == events.in_flight
