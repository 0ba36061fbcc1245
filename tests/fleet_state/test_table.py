"""The replica table: the state machine, eligibility per model and pool, and who hears of
changes (no sockets: the gateway's probes and the simulator call the same methods)."""

from __future__ import annotations

import pytest

from gpufleet.fleet_state import ReplicaTable
from gpufleet.native import is_compiled
from gpufleet.routing import simple
from gpufleet.routing.types import ReplicaState

from .helpers import fleet, ready, replica


def test_probes_move_a_replica_through_its_states() -> None:
    table: ReplicaTable = ReplicaTable(eject_after_failures=2, readmit_after_successes=2)
    ejected: list[str] = []
    removed: list[str] = []
    table.on_ejected.append(lambda r: ejected.append(r.replica_id))
    table.on_removed.append(removed.append)
    r = table.add(replica("a"))
    assert r.state is ReplicaState.STARTING and table.eligible("m", None) == []
    table.probe_failed(r, 0.0)  # a starting replica is not ejected; its failures are counted
    assert r.state is ReplicaState.STARTING and r.failed_probes == 1
    assert table.can_become_ready(r)
    assert table.probe_passed(r, 0.0) and table.mark_ready(r)
    assert table.eligible("m", None) == [r]
    table.probe_failed(r, 1.0)
    assert r.state is ReplicaState.READY
    table.probe_failed(r, 2.0, definite=False)  # a timeout is no proof of death
    assert r.state is ReplicaState.READY and r.failed_probes == 1
    table.probe_failed(r, 3.0)  # the second definite failure in a row takes it out
    assert r.state is ReplicaState.DEAD and not r.healthy
    assert ejected == ["a"] and removed == ["a"] and r.ejected_until_s is None
    assert table.eligible("m", None) == []
    assert not table.probe_passed(r, 4.0)  # one pass is not enough to come back
    assert table.probe_passed(r, 5.0) and table.mark_ready(r)
    assert r.state is ReplicaState.READY and r.healthy
    table.probe_failed(r, 6.0)
    table.probe_passed(r, 7.0)
    table.probe_failed(r, 8.0)  # not two in a row
    assert r.state is ReplicaState.READY


@pytest.mark.skipif(is_compiled(simple), reason="spies on a compiled policy's method")
def test_drain_and_remove() -> None:
    f = fleet()
    a, b = ready(f, "a"), ready(f, "b")
    forgotten: list[str] = []
    f.policy.on_replica_removed = forgotten.append  # type: ignore[method-assign]
    f.table.drain("a")
    assert a.state is ReplicaState.DRAINING and f.table.eligible("m", None) == [b]
    assert not f.table.mark_ready(a)  # a probe does not bring a draining replica back
    f.table.remove("a")
    assert a.state is ReplicaState.DEAD and "a" not in f.table.by_id and forgotten == ["a"]
    assert not f.table.mark_ready(a)  # nor a removed one
    with pytest.raises(KeyError):
        f.table.remove("a")
    with pytest.raises(KeyError):
        f.table.add(replica("b"))


def test_undrain_returns_a_draining_replica_to_routing() -> None:
    f = fleet()
    a, b = ready(f, "a"), ready(f, "b")
    f.table.drain("a")
    assert f.table.undrain("a") is a
    assert a.state is ReplicaState.READY and f.table.eligible("m", None) == [a, b]
    with pytest.raises(ValueError):
        f.table.undrain("a")  # ready: not draining
    with pytest.raises(KeyError):
        f.table.undrain("nope")
    # One whose probes are failing comes back dead, until they pass again.
    f.table.drain("b")
    b.healthy = False
    f.table.undrain("b")
    assert b.state is ReplicaState.DEAD and f.table.eligible("m", None) == [a]


def test_eligibility_by_model_and_pool_follows_changes() -> None:
    f = fleet()
    shared = ready(f, "s", models=("m", "n"))
    gold = ready(f, "g", pool="gold")
    other = ready(f, "o", models=("n",))
    table = f.table
    assert table.eligible("m", None) == [shared]
    assert table.eligible("m", "gold") == [gold]
    assert table.eligible("n", None) == [shared, other]
    assert table.eligible("n", None, (shared,)) == [other]
    assert table.known == frozenset({"m", "n"})
    changes: list[int] = []
    table.listeners.append(lambda: changes.append(1))
    table.drain("s")
    assert changes == [1]
    assert table.eligible("n", None) == [other]  # the cached list was rebuilt
    assert table.count(ReplicaState.READY) == 2 and len(table) == 3


def test_a_replica_whose_models_are_unknown_is_discovering() -> None:
    f = fleet(served=())
    r = f.table.add(replica("a", models=()))
    assert f.table.discovering() and f.model_known("anything")
    r.models = frozenset({"m"})
    f.table.changed()
    assert not f.table.discovering()
    assert f.model_known("m") and not f.model_known("anything")
    # With configured models, they are the truth even while one is discovering.
    g = fleet(served=("m",))
    g.table.add(replica("a", models=()))
    assert g.model_known("m") and not g.model_known("anything")


def test_a_replica_that_keeps_failing_its_probes_is_down() -> None:
    table: ReplicaTable = ReplicaTable(eject_after_failures=3)
    changes: list[int] = []
    table.listeners.append(lambda: changes.append(1))
    a = table.add(replica("a"))
    b = table.add(replica("b", models=("other",)))
    for _ in range(2):
        table.probe_failed(a)
    assert table.can_become_ready(a) and table.all_down("m", None) == []
    before = len(changes)
    table.probe_failed(a)  # the third failure in a row: it will not become ready soon
    assert not table.can_become_ready(a) and len(changes) == before + 1  # waiters re-check
    assert table.all_down("m", None) == [a]
    assert table.all_down("other", None) == []  # b may still come up
    assert table.probe_passed(a) and table.all_down("m", None) == []
    assert b.state is ReplicaState.STARTING
