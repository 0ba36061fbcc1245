"""The replica table: membership, the state machine, and who is eligible for a request.

Only this module changes a replica's state, so the rules live in one place:

    starting --probe passes--> ready
    ready --outlier detection (failed requests; `fleet_state.outlier`, within its
            floor)--> dead, ejected until a time; back to ready when it has passed
    ready --N failed probes in a row (active health checking)--> dead, unhealthy;
            back to ready after M passing probes (and not before an ejection ends)
    drain: starting/ready --> draining (no new requests)
    undrain: draining --> ready (a scale-out took it back before it stopped)
    remove: any --> dead, and out of the table

Every change calls the listeners (the gateway wakes requests waiting for a replica; the
simulator re-admits its queue) and a replica that leaves routing is reported to
`on_removed` (policies drop their soft state about it).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

from gpufleet.fleet_state.outlier import OutlierConfig, may_eject, success_rate_outliers
from gpufleet.fleet_state.replica import FleetReplica
from gpufleet.routing.types import ReplicaState

R = TypeVar("R", bound=FleetReplica)
_CAN_BECOME_READY = (ReplicaState.STARTING, ReplicaState.DEAD)


class ReplicaTable(Generic[R]):
    """Replicas by id. `eligible()` is the hot path: cached per (model, pool) until the
    next change, so the lists it returns must not be modified."""

    def __init__(
        self,
        eject_after_failures: int = 3,
        readmit_after_successes: int = 1,
        outlier: OutlierConfig | None = None,
    ) -> None:
        self.by_id: dict[str, R] = {}
        self.eject_after_failures = eject_after_failures  # failed probes in a row
        self.readmit_after_successes = readmit_after_successes
        self.outlier = outlier if outlier is not None else OutlierConfig()
        self._next_interval_s: float | None = None
        self.known: frozenset[str] = frozenset()  # every model some replica serves
        self.listeners: list[Callable[[], None]] = []  # called after every change
        self.on_removed: list[Callable[[str], None]] = []  # a replica left routing
        self.on_ejected: list[Callable[[R], None]] = []
        self._ids = itertools.count(1)
        self._ready: list[R] = []
        self._eligible: dict[tuple[str, str | None], list[R]] = {}

    # -- membership -------------------------------------------------------------------
    def new_id(self) -> str:
        while True:
            rid = f"r{next(self._ids)}"
            if rid not in self.by_id:
                return rid

    def add(self, replica: R) -> R:
        """Put a replica in the table (as the caller built it: `starting` or `ready`).
        Raises KeyError if its id is taken."""
        if replica.replica_id in self.by_id:
            raise KeyError(replica.replica_id)
        self.by_id[replica.replica_id] = replica
        self.changed()
        return replica

    def remove(self, replica_id: str) -> R:
        """Forget it (requests in flight on it still finish). KeyError if unknown."""
        replica = self.by_id.pop(replica_id)
        replica.state = ReplicaState.DEAD
        self._removed(replica_id)
        self.changed()
        return replica

    def drain(self, replica_id: str) -> R:
        """No new requests go to it; requests in flight finish. KeyError if unknown."""
        replica = self.by_id[replica_id]
        replica.state = ReplicaState.DRAINING
        self.changed()
        return replica

    def undrain(self, replica_id: str) -> R:
        """A draining replica takes new requests again (ready; dead when its probes are
        failing, until they pass). KeyError if unknown, ValueError if not draining."""
        replica = self.by_id[replica_id]
        if replica.state is not ReplicaState.DRAINING:
            raise ValueError(f"replica {replica_id!r} is {replica.state}, not draining")
        replica.state = ReplicaState.READY if _may_serve(replica) else ReplicaState.DEAD
        self.changed()
        return replica

    def find_by_url(self, url: str) -> R | None:
        url = url.rstrip("/")
        for r in self.by_id.values():
            if r.url == url:
                return r
        return None

    # -- health -------------------------------------------------------------------------
    def record_success(self, replica: R, now_s: float = 0.0) -> None:
        """A request the replica served (outlier detection's view)."""
        replica.consecutive_failures = 0
        replica.window_requests += 1

    def record_failure(self, replica: R, now_s: float) -> bool:
        """A request the replica failed (a gateway failure: 5xx, reset, a stream cut or
        stalled). True when it got the replica ejected."""
        replica.consecutive_failures += 1
        replica.window_requests += 1
        replica.window_failures += 1
        if (
            replica.state is ReplicaState.READY
            and replica.consecutive_failures >= self.outlier.consecutive_failures
        ):
            return self.eject(replica, now_s)
        return False

    def eject(self, replica: R, now_s: float) -> bool:
        """Outlier ejection of a ready replica, if the floor allows (see `outlier`)."""
        if replica.state is not ReplicaState.READY:
            return False
        if not may_eject(self.outlier, replica, self.by_id.values()):
            return False
        replica.ejections += 1
        replica.ejected_until_s = now_s + self.outlier.ejection_time_s(replica.ejections)
        self._take_out(replica)
        return True

    def probe_failed(self, replica: R, now_s: float = 0.0, definite: bool = True) -> None:
        """A failed /health probe. `definite` (refused, an error status) counts towards
        active health checking; an ambiguous one (a timeout: dead or only overloaded?)
        counts as a failed request, under outlier detection's floor. A starting or ejected
        replica that keeps failing is `down` (see `can_become_ready`)."""
        if not definite and replica.state is ReplicaState.READY:
            self.record_failure(replica, now_s)
            return
        replica.consecutive_successes = 0
        replica.failed_probes += 1
        if replica.failed_probes == self.eject_after_failures:
            self.changed()  # waiting requests re-check: this one will not become ready soon
        if replica.state is ReplicaState.STARTING or not definite:
            return
        if replica.healthy and replica.failed_probes >= self.eject_after_failures:
            replica.healthy = False
            if replica.state is ReplicaState.READY:
                self._take_out(replica)

    def can_become_ready(self, replica: R) -> bool:
        """Ready, or starting / ejected without failing its probes persistently."""
        if replica.state is ReplicaState.READY:
            return True
        if replica.state is ReplicaState.DRAINING:
            return False
        return replica.failed_probes < self.eject_after_failures

    def all_down(self, model: str, pool: str | None) -> list[R]:
        """The replicas that could serve `model` in `pool` when none of them can become
        ready (they keep failing their probes); [] when one can, or when there is none."""
        serving = [
            r for r in self.by_id.values()
            if r.pool == pool and (model in r.models or not r.models)
            and r.state is not ReplicaState.DRAINING
        ]  # fmt: skip
        if not serving or any(self.can_become_ready(r) for r in serving):
            return []
        return serving

    def probe_passed(self, replica: R, now_s: float = 0.0) -> bool:
        """A passing /health probe. True when the replica may become ready now (the
        caller learns its models first if need be, then calls `mark_ready`)."""
        replica.failed_probes = 0
        replica.consecutive_successes += 1
        if replica.state is ReplicaState.STARTING:
            return True
        if not replica.healthy and replica.consecutive_successes >= self.readmit_after_successes:
            replica.healthy = True
        return replica.state is ReplicaState.DEAD and _may_serve(replica)

    def tick(self, now_s: float) -> None:
        """Time passes: ejections that ran out end; every `outlier.interval_s`, the
        success-rate detector runs and the ejection multipliers of replicas that stayed
        in the pool drop by one. Drivers call this now and then (the gateway with its
        probes; a second's lateness only lengthens an ejection by as much)."""
        back = False
        for r in self.by_id.values():
            if r.ejected_until_s is not None and now_s >= r.ejected_until_s:
                r.ejected_until_s = None
                r.consecutive_failures = 0
                if r.state is ReplicaState.DEAD and _may_serve(r):
                    r.state = ReplicaState.READY
                    back = True
        if back:
            self.changed()
        if self._next_interval_s is None:
            self._next_interval_s = now_s + self.outlier.interval_s
        if now_s < self._next_interval_s:
            return
        self._next_interval_s = now_s + self.outlier.interval_s
        for r in success_rate_outliers(self.outlier, self.by_id.values()):
            self.eject(r, now_s)
        for r in self.by_id.values():
            if r.ejected_until_s is None and r.ejections and r.state is ReplicaState.READY:
                r.ejections -= 1
            r.window_requests = r.window_failures = 0

    def _take_out(self, replica: R) -> None:
        replica.state = ReplicaState.DEAD
        for listener in self.on_ejected:
            listener(replica)
        self._removed(replica.replica_id)
        self.changed()

    def mark_ready(self, replica: R) -> bool:
        """starting or dead (ejected) -> ready, if still in the table. True if it changed."""
        if self.by_id.get(replica.replica_id) is not replica:
            return False
        if replica.state not in _CAN_BECOME_READY or replica.ejected_until_s is not None:
            return False
        replica.state = ReplicaState.READY
        replica.healthy = True
        replica.consecutive_failures = 0
        self.changed()
        return True

    # -- queries ------------------------------------------------------------------------
    def changed(self) -> None:
        """Rebuild the caches and tell the listeners (after any state or model change)."""
        self._ready = [r for r in self.by_id.values() if r.state is ReplicaState.READY]
        self._eligible = {}
        self.known = frozenset(m for r in self.by_id.values() for m in r.models)
        for listener in self.listeners:
            listener()

    def eligible(self, model: str, pool: str | None, exclude: Sequence[R] = ()) -> list[R]:
        """Ready replicas that serve `model` in tenant pool `pool` (None: the shared one)."""
        key = (model, pool)
        out = self._eligible.get(key)
        if out is None:
            out = [r for r in self._ready if r.pool == pool and model in r.models]
            self._eligible[key] = out
        if exclude:
            return [r for r in out if r not in exclude]
        return out

    def discovering(self) -> bool:
        """Whether some replica's models are not known yet (it may serve any model)."""
        return any(not r.models and r.state is not ReplicaState.DRAINING for r in self)

    def count(self, state: ReplicaState) -> int:
        return sum(1 for r in self.by_id.values() if r.state is state)

    def _removed(self, replica_id: str) -> None:
        for listener in self.on_removed:
            listener(replica_id)

    def __iter__(self) -> Iterator[R]:
        return iter(list(self.by_id.values()))

    def __len__(self) -> int:
        return len(self.by_id)


def _may_serve(replica: FleetReplica) -> bool:
    """Passing its probes and not ejected: what a replica needs to be ready."""
    return replica.healthy and replica.ejected_until_s is None
