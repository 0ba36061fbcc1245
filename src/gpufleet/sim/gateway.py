"""The simulated fleet's gateway: the fleet core driven on virtual time.

The same `FleetState` the live gateway drives: admission (route now, wait in the bounded
queue, or refuse with the gateway's 503) and the routing policy's choice. What the live
gateway does with sockets and asyncio events is done here with events on the virtual
clock: a queued request's deadline is a QUEUE_TIMEOUT event, and a change of the replica
table re-admits the queue in arrival order (as it wakes the live gateway's waiters).
A request whose replica failed before its first token is tried again elsewhere, as the
live proxy's `route` does: replicas that failed it are avoided while others are eligible,
it waits in the queue when none is, and it fails after `max_attempts` tries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from gpufleet.fleet_state import AdmissionQueue, FleetReplica, FleetState, QueueTicket, Refusal
from gpufleet.routing.types import RoutingPolicy
from gpufleet.sim.events import QUEUE_TIMEOUT, EventQueue

if TYPE_CHECKING:
    from gpufleet.sim.clients import LiveRequest
    from gpufleet.sim.config import SimConfig


def build_fleet(
    config: SimConfig,
    routing: RoutingPolicy,
    tenant_policies: Mapping[str, RoutingPolicy] | None = None,
) -> FleetState[FleetReplica]:
    """The fleet core as the simulated gateway runs it: one model, always served."""
    queue = AdmissionQueue(config.queue_max_size, config.queue_timeout_s,
                           config.queue_retry_after_s)  # fmt: skip
    return FleetState[FleetReplica](
        routing,
        tenant_policies=tenant_policies,
        served_models=(config.model,),
        queue=queue,
        signals_window_s=config.signals_window_s,
        slow_start_s=config.slow_start_s,
    )


class SimGateway:
    def __init__(
        self,
        fleet: FleetState[FleetReplica],
        events: EventQueue,
        clock: Callable[[], float],
        dispatch: Callable[[LiveRequest, FleetReplica], None],
        refuse: Callable[[LiveRequest, Refusal], None],
        fail: Callable[[LiveRequest, str], None],
        max_attempts: int = 3,
    ) -> None:
        self.fleet = fleet
        self.events = events
        self.clock = clock
        self._dispatch = dispatch  # the request goes to this replica's engine
        self._refuse = refuse  # the client gets the gateway's error
        self._fail = fail  # the client gets the gateway's 502 (every try failed)
        self.max_attempts = max_attempts
        self.retries = 0  # tries after a replica failed a request before its first token
        self._waiting: dict[QueueTicket, LiveRequest] = {}
        fleet.table.listeners.append(self.wake_queue)

    def arrive(self, live: LiveRequest) -> None:
        """A request reaches the gateway: route it, queue it, or refuse it."""
        now = self.clock()
        self._admit(live, now + self.fleet.queue.limits(live.info.model).timeout_s, now)

    def retry(self, live: LiveRequest) -> None:
        """Its replica failed it before the first token (it is in `live.tried`): try
        another, or report the failure after `max_attempts` tries or when every ready
        replica has failed it. The queue deadline still counts from its arrival."""
        if len(live.tried) >= self.max_attempts:
            self._fail(live, "replica_failed")
            return
        fleet = self.fleet
        eligible = fleet.table.eligible(live.info.model, live.pool)
        if eligible and all(r in live.tried for r in eligible):
            self._fail(live, "replica_failed")
            return
        self.retries += 1
        deadline_s = live.result.arrival_s + fleet.queue.limits(live.info.model).timeout_s
        self._admit(live, deadline_s, self.clock(), first_try=False)

    def _admit(
        self, live: LiveRequest, deadline_s: float, now: float, first_try: bool = True
    ) -> None:
        admitted = self.fleet.admit(
            live.info.model,
            live.pool,
            now,
            deadline_s,
            adapter=live.info.adapter,
            first_try=first_try,
        )
        if isinstance(admitted, QueueTicket):
            self._waiting[admitted] = live
            self.events.push(admitted.deadline_s, QUEUE_TIMEOUT, admitted)
        elif isinstance(admitted, Refusal):
            self._refused(live, admitted)
        else:
            self._route(live, admitted)

    def _refused(self, live: LiveRequest, refusal: Refusal) -> None:
        if live.tried:  # the client gets the failure that sent it back, as live
            self._fail(live, "replica_failed")
        else:
            self._refuse(live, refusal)

    def _route(self, live: LiveRequest, candidates: Sequence[FleetReplica]) -> None:
        if live.tried:  # avoid the replicas that failed it while there are others
            candidates = [r for r in candidates if r not in live.tried] or candidates
        chosen = live.policy.choose(live.info, candidates)
        if chosen is None:
            raise RuntimeError("routing policy chose nothing with replicas ready")
        replica = chosen if isinstance(chosen, FleetReplica) else candidates[0]
        self._dispatch(live, replica)

    def wake_queue(self) -> None:
        """The table changed: every waiting request asks again, oldest first."""
        fleet = self.fleet
        if not len(fleet.queue):
            return
        now = self.clock()
        for ticket in fleet.queue:
            self._settle(ticket, fleet.admit(ticket.model, ticket.pool, now, ticket.deadline_s,
                                             ticket))  # fmt: skip

    def on_queue_timeout(self, ticket: QueueTicket) -> None:
        fleet = self.fleet
        if ticket in fleet.queue:  # else routed (or refused) since
            now = self.clock()
            self._settle(ticket, fleet.admit(ticket.model, ticket.pool, now, ticket.deadline_s,
                                             ticket))  # fmt: skip

    def _settle(
        self, ticket: QueueTicket, admitted: Sequence[FleetReplica] | QueueTicket | Refusal
    ) -> None:
        if isinstance(admitted, QueueTicket):
            return  # still waiting
        live = self._waiting.pop(ticket)
        if isinstance(admitted, Refusal):
            self._refused(live, admitted)
        else:
            self._route(live, admitted)
