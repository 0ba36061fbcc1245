"""Replica failures: processes crash at a given MTBF, and the fleet answers as live.

Each replica process draws its time to failure from an exponential distribution with mean
`FaultSpec.mtbf_s`, from the moment it is spawned (seeded per replica and restart, so a
seed fixes every crash). When it crashes, what `gpufleet up` does happens at that instant:

- its connections break: each broken request counts as a failure of the replica (the
  table ejects it after `eject_after_failures` in a row); a request that had streamed its
  first token gets the gateway's error event (`stream_cut`); one that had not is tried on
  another replica, as the proxy retries before the first byte (`SimGateway.retry`:
  `max_attempts` tries in all, replicas that failed it avoided, the queue when none is
  ready);
- the actuator sees the process exit and removes the replica from the gateway at once;
- with `restart`, it starts the replica again under the same id after its backoff
  (`restart_backoff_s`) and a cold start; it holds its GPUs all the while, and counts as
  starting for the autoscaler. A draining replica that crashes is not restarted.
"""

from __future__ import annotations

import random

from gpufleet.autoscale.actuator import restart_backoff_s
from gpufleet.routing.types import ReplicaState
from gpufleet.sim.clients import Clients
from gpufleet.sim.config import FaultSpec
from gpufleet.sim.events import CRASH, EventQueue, SimClock
from gpufleet.sim.fleet import SimFleet
from gpufleet.sim.gateway import SimGateway
from gpufleet.sim.replica import SimReplica


class SimFaults:
    def __init__(
        self,
        spec: FaultSpec,
        fleet: SimFleet,
        gateway: SimGateway,
        clients: Clients,
        events: EventQueue,
        clock: SimClock,
        seed: int,
    ) -> None:
        self.spec = spec
        self.fleet = fleet
        self.gateway = gateway
        self.clients = clients
        self.events = events
        self.clock = clock
        self.seed = seed
        self.crashes = 0
        fleet.on_start.append(self.arm)

    def arm(self, replica: SimReplica) -> None:
        """Draw when this replica's process fails (from its spawn)."""
        rng = random.Random(f"crash:{self.seed}:{replica.replica_id}:{replica.restarts}")
        at_s = replica.spawned_s + rng.expovariate(1.0 / self.spec.mtbf_s)
        self.events.push(at_s, CRASH, replica)

    def on_crash(self, replica: SimReplica) -> None:
        if replica.stopped_at_s is not None:
            return  # stopped before its time came (drained, or replaced)
        self.crashes += 1
        fleet, clients = self.fleet, self.clients
        table = fleet.fleet.table
        now = self.clock.now_s
        was_draining = replica.state is ReplicaState.DRAINING
        replica.account(now)
        # Its connections break first (the proxy sees the reset before the actuator sees
        # the exit): each failure counts against it (3 in a row eject it), then the client
        # gets an error event after its first token, or another try before it.
        view = replica.view
        for rid in sorted(replica.live_ids):
            live = clients.live[rid]
            table.record_failure(view, now)
            streamed = live.result.first_token_s is not None
            fleet.fleet.finished(live.info, view, live.policy, False, streamed)
            if streamed:
                clients.end(live, "stream_cut")
            else:
                live.tried = (*live.tried, view)
                live.replica = live.engine_req = None
                self.gateway.retry(live)
        replica.live_ids.clear()
        fleet.stop(replica)  # the actuator saw it exit: out of the gateway's table
        group = replica.group
        assert group is not None
        if self.spec.restart and not was_draining:
            backoff_s = restart_backoff_s(replica.restarts)
            fleet.start(group, group.startup_s, restart_of=replica, backoff_s=backoff_s)
            fleet.record_size()
