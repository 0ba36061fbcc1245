"""The simulated fleet's gateway: the fleet core driven on virtual time.

The same `FleetState` the live gateway drives: admission (route now, wait in the bounded
queue, or refuse with the gateway's 503) and the routing policy's choice. What the live
gateway does with sockets and asyncio events is done here with events on the virtual
clock: a queued request's deadline is a QUEUE_TIMEOUT event, and a change of the replica
table re-admits the queue in arrival order (as it wakes the live gateway's waiters).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from gpufleet.fleet_state import AdmissionQueue, FleetReplica, FleetState, QueueTicket, Refusal
from gpufleet.routing.types import RoutingPolicy
from gpufleet.sim.events import QUEUE_TIMEOUT, EventQueue

if TYPE_CHECKING:
    from gpufleet.sim.clients import LiveRequest
    from gpufleet.sim.config import SimConfig


def build_fleet(config: SimConfig, routing: RoutingPolicy) -> FleetState[FleetReplica]:
    """The fleet core as the simulated gateway runs it: one model, always served."""
    queue = AdmissionQueue(config.queue_max_size, config.queue_timeout_s,
                           config.queue_retry_after_s)  # fmt: skip
    return FleetState[FleetReplica](
        routing,
        served_models=(config.model,),
        queue=queue,
        signals_window_s=config.signals_window_s,
    )


class SimGateway:
    def __init__(
        self,
        fleet: FleetState[FleetReplica],
        events: EventQueue,
        clock: Callable[[], float],
        dispatch: Callable[[LiveRequest, FleetReplica], None],
        refuse: Callable[[LiveRequest, Refusal], None],
    ) -> None:
        self.fleet = fleet
        self.policy = fleet.policy
        self.events = events
        self.clock = clock
        self._dispatch = dispatch  # the request goes to this replica's engine
        self._refuse = refuse  # the client gets the gateway's error
        self._waiting: dict[QueueTicket, LiveRequest] = {}
        fleet.table.listeners.append(self.wake_queue)

    def arrive(self, live: LiveRequest) -> None:
        """A request reaches the gateway: route it, queue it, or refuse it."""
        now = self.clock()
        info = live.info
        admitted = self.fleet.admit(
            info.model, None, now, now + self.fleet.queue.timeout_s, adapter=info.adapter
        )
        if isinstance(admitted, QueueTicket):
            self._waiting[admitted] = live
            self.events.push(admitted.deadline_s, QUEUE_TIMEOUT, admitted)
        elif isinstance(admitted, Refusal):
            self._refuse(live, admitted)
        else:
            self._route(live, admitted)

    def _route(self, live: LiveRequest, candidates: Sequence[FleetReplica]) -> None:
        chosen = self.policy.choose(live.info, candidates)
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
            self._refuse(live, admitted)
        else:
            self._route(live, admitted)
