"""The simulated replicas: their engines stepped by the engine-driver contract, their
lifecycle (start, cold start, ready, drain, stop) and the autoscaler that changes it.

Each engine is driven as `gpufleet.replica.runner` drives it (`gpufleet.engine.driver`):
an iteration begins at once, its tokens are handed out at its end (a STEP_DONE event), and
the next iteration begins at that instant, before what the hand-out causes arrives. A run
of plain decode iterations is one event (`EngineDriver.begin_advance`): it is delivered
at its end, or cut short (and its delivery moved earlier) when a request reaches the engine
or is aborted in the middle of it; the results are those of stepping.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from gpufleet.autoscale.controller import scale_in_order, undrain_order
from gpufleet.autoscale.decision import ScalingDecision
from gpufleet.autoscale.gateway_link import fleet_signals
from gpufleet.engine import BLOCKED_RETRY_S, Advance, EngineRequest, StepOutcome
from gpufleet.engine.lora import LoraAdapter
from gpufleet.fleet_state import FleetReplica, FleetState
from gpufleet.routing.types import ReplicaState, RequestInfo
from gpufleet.sim.clients import Clients, LiveRequest
from gpufleet.sim.config import ReplicaGroup, SimConfig
from gpufleet.sim.events import (
    DELIVER,
    DRAIN_DEADLINE,
    REPLICA_READY,
    RETRY,
    STEP_DONE,
    WAKE,
    EventQueue,
    SimClock,
)
from gpufleet.sim.replica import SimReplica
from gpufleet.sim.results import ReplicaRecord


class SimFleet:
    def __init__(
        self,
        config: SimConfig,
        fleet: FleetState[FleetReplica],
        clients: Clients,
        events: EventQueue,
        clock: SimClock,
    ) -> None:
        self.config = config
        self.fleet = fleet
        self.clients = clients
        self.events = events
        self.clock = clock
        self._live = clients.live
        self.replicas: dict[str, SimReplica] = {}
        self.retired: list[SimReplica] = []  # replaced by a restart after a crash
        self.groups = config.replica_groups()
        self.scaled_group = next((g for g in self.groups if g.autoscaled), None)
        self.on_start: list[Callable[[SimReplica], None]] = []  # e.g. arm its failure
        self.decisions: list[ScalingDecision] = []
        self.fleet_size: list[tuple[float, int, int]] = []  # (t, ready, total)
        self._cold_starts_s: deque[float] = deque(maxlen=8)
        self._next_replica = 0
        self.undrained = 0  # scale-outs served by a draining replica, not a cold start
        self._jump = config.jump_decode_runs

    # -- requests on engines ------------------------------------------------------------
    def dispatch(self, live: LiveRequest, view: FleetReplica) -> None:
        """The gateway chose `view` for this request: it starts there now."""
        now = self.clock.now_s
        replica = self.replicas[view.replica_id]
        replica.account(now)
        self.fleet.started(live.info, view, live.policy)
        assert replica.group is not None
        if live.result.input_tokens + live.req.output_tokens > replica.group.engine.max_model_len:
            # Longer than this layout takes (another group's may): the replica's 400.
            live.result.replica_id, live.result.dispatched_s = replica.replica_id, now
            self.fleet.finished(live.info, view, live.policy, False)
            self.clients.end(live, "context_length_exceeded")
            return
        replica.note_peak()
        replica.requests_routed += 1
        live.replica = replica
        live.result.replica_id = replica.replica_id
        live.result.dispatched_s = now
        replica.live_ids.add(live.info.request_id)
        delay_s = self.config.request_overhead_s
        if delay_s > 0:  # on its way over HTTP: the engine sees it this much later
            self.events.push(now + delay_s, DELIVER, (replica, live))
        else:
            self.deliver((replica, live))

    def deliver(self, payload: tuple[SimReplica, LiveRequest]) -> None:
        """A routed request reaches its replica's engine."""
        replica, live = payload
        if replica.stopped_at_s is not None or live.replica is not replica:
            return  # its replica failed or was cut meanwhile (the request was answered)
        now = self.clock.now_s
        ereq = self.clients.engine_request(live, now)
        live.engine_req = ereq
        advance = replica.advance
        due_s = advance.due_s if advance is not None else 0.0
        if live.info.adapter is not None:
            ereq.lora = lora = self._adapter_on(replica, live.info, now)
            if self.fleet.adapter_missing(live.info, replica.view):
                # The fleet core's rule, as the live proxy asks it: load it there first
                # (vLLM /v1/load_lora_adapter), then send the request.
                replica.driver.add_lora(lora, now)
                self.fleet.adapter_registered(replica.view, lora.name)
        replica.driver.submit(ereq, now)
        if advance is not None and advance.due_s != due_s:  # a run cut short: deliver sooner
            self.events.push(advance.due_s, STEP_DONE, (replica, advance))
        if not replica.stepping:
            replica.stepping = True  # woken below, once this instant's arrivals are in
            self.events.push(now, WAKE, replica)

    def _adapter_on(self, replica: SimReplica, info: RequestInfo, now_s: float) -> LoraAdapter:
        """The adapter a request for one (`info.adapter`) runs with: the one its replica
        holds, or a new one."""
        assert info.adapter is not None
        slots = replica.engine.lora
        lora = self.config.lora
        if slots is None or lora is None:
            raise ValueError(f"request for adapter {info.adapter!r} but LoRA is not enabled")
        held = slots.registered.get(info.adapter)
        return held or LoraAdapter(info.adapter, f"sim://adapters/{info.adapter}", lora.rank)

    def step(self, replica: SimReplica) -> None:
        driver = replica.driver
        if self._jump:
            advance = driver.begin_advance()
        else:
            outcome = driver.begin()
            advance = None if outcome is None else Advance(outcome.now_s, outcome, None)
        replica.advance = advance
        if advance is None:
            replica.stepping = replica.engine.has_work
            if replica.stepping:
                self.events.push(self.clock.now_s + BLOCKED_RETRY_S, RETRY, replica)
            return
        replica.stepping = True
        self.events.push(advance.due_s, STEP_DONE, (replica, advance))

    def on_wake(self, replica: SimReplica) -> None:
        if replica.stopped_at_s is None:
            self.step(replica)

    def on_retry(self, replica: SimReplica) -> None:
        if replica.stopped_at_s is None:
            replica.engine.advance_to(self.clock.now_s)
            self.step(replica)

    def on_step_done(self, payload: Any) -> None:
        """Iterations end: their tokens reach their clients, the next ones begin."""
        # (typed: compiled, the attributes below are then read natively, not by name)
        replica: SimReplica
        advance: Advance
        replica, advance = payload
        if replica.stopped_at_s is not None:
            replica.stepping = False
            return  # stopped (or crashed) since: its clients were answered then
        now = self.clock.now_s
        if advance is not replica.advance or now != advance.due_s:
            return  # a run cut short: its delivery was queued again, sooner
        replica.advance = None
        outcome = replica.driver.end(advance)
        view = replica.view
        if type(outcome) is StepOutcome:  # (no request gets its first token in a run)
            live_map = self._live
            for ereq in outcome.emitted:
                # Each produced one token now, and an output count never falls: a first
                # token is a count of 1 (checked before looking the request up).
                if ereq.num_output_tokens != 1:
                    continue
                live = live_map.get(ereq.request_id)
                if live is not None and live.result.first_token_s is None:
                    live.result.first_token_s = now
                    self.fleet.first_token(live.info, view, live.policy)
        if outcome.finished:
            self._finished(replica, outcome.finished, now)
        if replica.engine.has_work:
            self.step(replica)
        else:
            replica.stepping = False
            if replica.state is ReplicaState.DRAINING and view.in_flight == 0:
                self.stop(replica)

    def _finished(self, replica: SimReplica, finished: list[EngineRequest], now: float) -> None:
        """Requests whose last token went out at `now`: their clients get their results."""
        live_map, clients, fleet, view = self._live, self.clients, self.fleet, replica.view
        for ereq in finished:
            live = live_map.pop(ereq.request_id, None)
            if live is None:
                continue
            res = clients.finish(live, ereq, now)
            replica.live_ids.discard(ereq.request_id)
            replica.account(now)
            first_s = res.first_token_s
            fleet.finished(live.info, view, live.policy, True, first_s is not None)
            tokens, prompt = ereq.num_tokens, ereq.num_prompt_tokens
            fleet.observe_latency(now, res.ttft_s, res.tpot_s, live.info.model, tokens, prompt)
            clients.client_done(live.req.index)

    def on_scrape(self) -> None:
        """The gateway reads every ready or draining replica's /metrics."""
        now = self.clock.now_s
        for view in self.fleet.table:
            self.fleet.apply_scrape(view, self.replicas[view.replica_id].scraped(now), now)

    # -- lifecycle ----------------------------------------------------------------------
    def start(
        self,
        group: ReplicaGroup,
        startup_s: float,
        *,
        restart_of: SimReplica | None = None,
        backoff_s: float = 0.0,
    ) -> SimReplica:
        """A new replica of `group` (or `restart_of`'s next process, after `backoff_s`)."""
        now = self.clock.now_s
        seed = self.config.seed * 7919 + self._next_replica
        self._next_replica += 1
        rid = f"r{self._next_replica - 1}"
        restarts = 0
        if restart_of is not None:
            rid, restarts = restart_of.replica_id, restart_of.restarts + 1
            self.retired.append(restart_of)
        replica = SimReplica.create(rid, self.config.model, group, now_s=now, startup_s=startup_s,
                                    seed=seed, backoff_s=backoff_s, restarts=restarts,
                                    lora=self.config.lora)  # fmt: skip
        self.replicas[rid] = replica
        if replica.state is ReplicaState.READY:
            self.fleet.table.add(replica.view)  # the gateway knows it once it is ready
        else:
            self.events.push(now + backoff_s + startup_s, REPLICA_READY, replica)
        for listener in self.on_start:
            listener(replica)
        return replica

    def on_ready(self, replica: SimReplica) -> None:
        if replica.state is not ReplicaState.STARTING:
            return  # stopped while starting
        now = self.clock.now_s
        replica.set_state(ReplicaState.READY)
        replica.managed.ready_at_s = now
        replica.engine.advance_to(now)
        replica.last_change_s = now
        self.note_cold_start(now - replica.spawned_s)
        self.record_size()
        self.fleet.became_ready(replica.view, now)  # slow start, when on
        self.fleet.table.add(replica.view)  # the queue is re-admitted

    def note_cold_start(self, seconds: float) -> None:
        """A cold start the actuator observed (the autoscaler reads their mean)."""
        self._cold_starts_s.append(seconds)

    def drain(self, replica: SimReplica) -> None:
        if replica.state is ReplicaState.STARTING:
            self.stop(replica)  # never served: nothing to drain
            return
        if replica.state is not ReplicaState.READY:
            return
        self.fleet.table.drain(replica.replica_id)
        replica.managed.state = ReplicaState.DRAINING
        if replica.view.in_flight == 0:
            self.stop(replica)
        else:
            assert self.config.autoscale is not None
            replica.drain_due_s = self.clock.now_s + self.config.autoscale.drain_deadline_s
            self.events.push(replica.drain_due_s, DRAIN_DEADLINE, replica)

    def undrain(self, replica: SimReplica) -> bool:
        """A scale-out takes a draining replica back (as the live actuator does): ready
        again at once, warm. False if it is not draining (stopped meanwhile)."""
        if replica.state is not ReplicaState.DRAINING or replica.stopped_at_s is not None:
            return False
        self.fleet.table.undrain(replica.replica_id)
        replica.managed.state = ReplicaState.READY
        replica.drain_due_s = None  # its deadline's event is stale now
        self.undrained += 1
        return True

    def drain_timer_stale(self, replica: SimReplica, t_s: float) -> bool:
        """Whether a DRAIN_DEADLINE event at `t_s` no longer applies: the replica stopped,
        or was taken back (and perhaps drained again, with a later deadline)."""
        return replica.stopped_at_s is not None or replica.drain_due_s != t_s

    def on_drain_deadline(self, replica: SimReplica) -> None:
        if self.drain_timer_stale(replica, self.clock.now_s):
            return
        now = self.clock.now_s
        for rid in sorted(replica.live_ids):
            live = self._live.pop(rid, None)
            replica.driver.abort(rid, now)
            if live is not None:
                replica.account(now)
                streamed = live.result.first_token_s is not None
                self.fleet.finished(live.info, replica.view, live.policy, False, streamed)
                self.clients.fail(live, "drain_deadline")
        replica.live_ids.clear()
        self.stop(replica)

    def stop(self, replica: SimReplica) -> None:
        now = self.clock.now_s
        replica.account(now)
        replica.stopped_at_s = now
        if self.fleet.table.by_id.get(replica.replica_id) is replica.view:
            self.fleet.table.remove(replica.replica_id)  # policies forget it
        replica.set_state(ReplicaState.DEAD)
        self.record_size()

    def record_size(self) -> None:
        live = [r for r in self.replicas.values() if r.stopped_at_s is None]
        ready = sum(1 for r in live if r.state is ReplicaState.READY)
        self.fleet_size.append((self.clock.now_s, ready, len(live)))

    # -- autoscaling ----------------------------------------------------------------------
    def on_tick(self) -> None:
        spec, group = self.config.autoscale, self.scaled_group
        assert spec is not None and group is not None
        now = self.clock.now_s
        # The actuator's own replicas: the autoscaled group's (the gateway knows the rest).
        managed = [
            r.managed
            for r in self.replicas.values()
            if r.state is not ReplicaState.DEAD and r.group is group
        ]
        cold = sum(self._cold_starts_s) / len(self._cold_starts_s) if self._cold_starts_s else None
        signals = fleet_signals(self.fleet.signals(now), managed, cold)
        decision = spec.policy.decide(now, signals)
        self.decisions.append(decision)
        delta = decision.desired_replicas - signals.current_replicas
        mine = {m.replica_id for m in managed}
        if delta > 0:
            # Draining replicas first (warm, at once), then cold starts for the rest.
            for rid in undrain_order(signals, mine)[:delta]:
                if self.undrain(self.replicas[rid]):
                    delta -= 1
            for _ in range(delta):
                self.start(group, group.startup_s)
            self.record_size()
        elif delta < 0:
            for rid in scale_in_order(signals, mine)[:-delta]:
                self.drain(self.replicas[rid])

    # -- results --------------------------------------------------------------------------
    def record(self, r: SimReplica, end_s: float) -> ReplicaRecord:
        if r.stopped_at_s is None:
            r.account(end_s)
        s = r.engine.stats
        ready = r.managed.ready_at_s
        served_s = max(0.0, (r.stopped_at_s or end_s) - (ready if ready is not None else end_s))
        group = r.group
        assert group is not None
        return ReplicaRecord(
            replica_id=r.replica_id,
            group=group.name,
            gpus=group.gpus_per_replica,
            price_per_gpu_hour_usd=group.price_per_gpu_hour_usd,
            restarts=r.restarts,
            started_s=r.managed.started_at_s,
            ready_s=ready,
            stopped_s=r.stopped_at_s,
            lifetime_s=r.lifetime_s(end_s),
            requests=r.requests_routed,
            mean_in_flight=r.in_flight_seconds / served_s if served_s > 0 else 0.0,
            peak_in_flight=r.peak_in_flight,
            prefix_queries_tokens=s.prefix_cache_queries_tokens,
            prefix_hits_tokens=s.prefix_cache_hits_tokens,
            preemptions=s.num_preemptions,
            steps=s.num_steps,
            adapter_loads=r.view.adapter_loads,
            **_lora_counts(r),
        )


def _lora_counts(r: SimReplica) -> dict[str, int]:
    slots = r.engine.lora
    if slots is None:
        return {}
    return {
        "lora_admissions": slots.admissions,
        "lora_gpu_hits": slots.gpu_hits,
        "lora_disk_loads": slots.disk_loads,
        "lora_activations": slots.activations,
    }
