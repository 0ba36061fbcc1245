"""The discrete-event fleet simulator: engines, router and autoscaler on a virtual clock.

A small event loop (`events`: one heap of (time, kind, sequence, payload)) and the parts
that handle the events, each the live system's own objects driven on virtual time:

- `clients`: requests arrive (open loop at their times, closed loop, multi-turn sessions)
  and end in a `RequestResult`;
- `gateway`: the fleet core (`gpufleet.fleet_state`) as the live gateway drives it:
  admission with the bounded queue and its 503s, and the `RoutingPolicy`'s choice;
- `fleet`: each replica an `Engine` driven by the engine-driver contract of the live
  runner (step at start, deliver at end), reporting to the fleet core what the live
  proxy reports (start / first token / finish, so in-flight counts and the policy's
  notifications) and engine metrics every `scrape_interval_s`; cold starts, drains,
  and the `ScalingPolicy`
  deciding on `FleetSignals` merged from the gateway's snapshot exactly as the live
  controller merges them (`fleet_signals`, `scale_in_order`).

Pure: no wall clock, no sleep, no I/O; a seed fixes the run.
"""

from __future__ import annotations

import gc
import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from gpufleet.fleet_state import GatewaySignals, needs_prefix_hashes
from gpufleet.routing.types import RoutingPolicy
from gpufleet.sim.clients import Clients
from gpufleet.sim.config import AutoscaleSpec, SimConfig
from gpufleet.sim.events import (
    ARRIVAL,
    CRASH,
    DELIVER,
    DRAIN_DEADLINE,
    QUEUE_TIMEOUT,
    REPLICA_READY,
    RETRY,
    SCRAPE,
    STEP_DONE,
    TICK,
    WAKE,
    EventQueue,
    SimClock,
)
from gpufleet.sim.faults import SimFaults
from gpufleet.sim.fleet import SimFleet
from gpufleet.sim.gateway import SimGateway, build_fleet
from gpufleet.sim.replica import SimReplica
from gpufleet.sim.results import ReplicaRecord, RequestResult, SimResult
from gpufleet.sim.tenants import SimTenants
from gpufleet.workload import SimRequest

__all__ = [
    "AutoscaleSpec",
    "FleetSimulator",
    "Progress",
    "ReplicaRecord",
    "RequestResult",
    "SimConfig",
    "SimResult",
]


@dataclass(frozen=True, slots=True)
class Progress:
    """How far a run is: the virtual clock, and requests ended (completed or failed)."""

    virtual_s: float
    requests_done: int
    requests_total: int


# Report progress about this often (in events; the report costs nothing in between).
PROGRESS_EVERY_EVENTS = 50_000


class FleetSimulator:
    """Replays `requests` over a fleet. Pass the policy objects to use (the same classes
    the gateway and controller use); `run()` returns a `SimResult`."""

    def __init__(
        self,
        config: SimConfig,
        requests: Sequence[SimRequest],
        routing: RoutingPolicy,
        *,
        needs_prefix: bool | None = None,
    ) -> None:
        config.check()
        self.config = config
        self.routing = routing
        if needs_prefix is None:  # hash prompts only for policies that read them, as live
            needs_prefix = needs_prefix_hashes(routing)
        self.needs_prefix = needs_prefix
        self.clock = SimClock()
        self.events = EventQueue()
        tenants = None
        if config.tenants:
            tenants = SimTenants(config.tenants, requests, routing, config.seed)
        self.fleet_state = build_fleet(config, routing, tenants.policies() if tenants else None)
        self.clients = Clients(config, requests, self.events, self.clock, needs_prefix, routing,
                               tenants)  # fmt: skip
        self.fleet = SimFleet(config, self.fleet_state, self.clients, self.events, self.clock)
        self.gateway = SimGateway(self.fleet_state, self.events, self.clock, self.fleet.dispatch,
                                  self.clients.refused, self.clients.end,
                                  config.max_attempts)  # fmt: skip
        self.clients.gateway = self.gateway
        self.faults: SimFaults | None = None
        if config.faults is not None:
            self.faults = SimFaults(config.faults, self.fleet, self.gateway, self.clients,
                                    self.events, self.clock, config.seed)  # fmt: skip

    @property
    def now_s(self) -> float:
        return self.clock.now_s

    @property
    def replicas(self) -> dict[str, SimReplica]:
        return self.fleet.replicas

    def gateway_signals(self) -> GatewaySignals:
        """What the live gateway's `signals()` returns, from the same fleet core."""
        return self.fleet_state.signals(self.clock.now_s)

    def run(self, progress: Callable[[Progress], None] | None = None) -> SimResult:
        """Play the whole run. `progress`, if given, is called every
        `PROGRESS_EVERY_EVENTS` events or so, and once at the end (a progress bar).

        The cyclic garbage collector is paused meanwhile: a run makes no reference cycles
        that outlive it, yet its millions of small allocations would set off collections
        that walk every live block list (a fifth of the run's time)."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._run(progress)
        finally:
            if enabled:
                gc.enable()

    def _run(self, progress: Callable[[Progress], None] | None) -> SimResult:
        wall0 = time.perf_counter()
        cpu0 = time.process_time()
        cfg = self.config
        clock = self.clock
        fleet = self.fleet
        for group in fleet.groups:  # the initial fleet is already warm at t = 0
            for _ in range(group.replicas):
                fleet.start(group, startup_s=0.0)
                if group.autoscaled and group.startup_s > 0:
                    # It did load once: the actuator observed that cold start, as live.
                    fleet.note_cold_start(group.startup_s)
        fleet.record_size()
        self.clients.start()
        self.events.push(cfg.scrape_phase_s or cfg.scrape_interval_s, SCRAPE)
        if cfg.autoscale is not None:
            self.events.push(cfg.tick_phase_s, TICK)
        handlers: dict[int, Callable[[Any], None]] = {
            STEP_DONE: fleet.on_step_done,
            REPLICA_READY: fleet.on_ready,
            SCRAPE: self._on_scrape,
            ARRIVAL: self.clients.on_arrival,
            TICK: self._on_tick,
            QUEUE_TIMEOUT: self.gateway.on_queue_timeout,
            DRAIN_DEADLINE: fleet.on_drain_deadline,
            RETRY: fleet.on_retry,
            WAKE: fleet.on_wake,
            DELIVER: fleet.deliver,
        }
        if self.faults is not None:
            handlers[CRASH] = self.faults.on_crash
        heap = self.events.heap
        pop = heapq.heappop
        on_step_done = fleet.on_step_done
        queue = self.fleet_state.queue
        max_events = cfg.max_events
        count = 0
        last_work_s = 0.0
        report_at = PROGRESS_EVERY_EVENTS if progress is not None else max_events
        while heap:
            t, kind, _, payload = pop(heap)
            count += 1
            if count >= max_events:
                raise RuntimeError(f"simulation exceeded {max_events} events")
            if kind == STEP_DONE:  # the bulk of all events: the shortest path
                clock.now_s = last_work_s = t
                on_step_done(payload)
                continue
            if kind == DRAIN_DEADLINE and fleet.drain_timer_stale(payload, t):
                # The replica drained before its deadline (or was taken back): a stale timer. Run, it set the
                # clock (and so `end_s`, to which every replica still alive is charged)
                # up to a drain deadline past the last request: 600 s of the whole fleet
                # after the autoscale study's last scale-in.
                count -= 1
                continue
            if kind == QUEUE_TIMEOUT and payload not in queue:
                count -= 1  # routed (or refused) before its deadline: as stale, likewise
                continue
            if kind in (SCRAPE, TICK, CRASH):
                if self._finished() and t > last_work_s + cfg.tail_s:
                    count -= 1
                    continue  # nothing left to serve: let the periodic events lapse
            else:
                last_work_s = t
            clock.now_s = t
            handlers[kind](payload)
            if count >= report_at and progress is not None:  # off the STEP_DONE fast path
                report_at = count + PROGRESS_EVERY_EVENTS
                progress(self.progress_now())
        end_s = clock.now_s
        if progress is not None:
            progress(self.progress_now())
        return SimResult(
            requests=sorted(self.clients.results, key=attrgetter("index")),
            replicas=[fleet.record(r, end_s) for r in (*fleet.retired, *fleet.replicas.values())],
            decisions=fleet.decisions,
            end_s=end_s,
            events=count,
            wall_s=time.perf_counter() - wall0,
            cpu_s=time.process_time() - cpu0,
            fleet_size=fleet.fleet_size,
            retries=self.gateway.retries,
            crashes=self.faults.crashes if self.faults is not None else 0,
            undrained=fleet.undrained,
        )

    def progress_now(self) -> Progress:
        clients = self.clients
        return Progress(self.clock.now_s, len(clients.results), len(clients.requests))

    def _finished(self) -> bool:
        return self.clients.done and not len(self.fleet_state.queue)

    def _on_scrape(self, _: Any) -> None:
        self.fleet.on_scrape()
        self.events.push(self.clock.now_s + self.config.scrape_interval_s, SCRAPE)

    def _on_tick(self, _: Any) -> None:
        self.fleet.on_tick()
        assert self.config.autoscale is not None
        self.events.push(self.clock.now_s + self.config.autoscale.interval_s, TICK)
