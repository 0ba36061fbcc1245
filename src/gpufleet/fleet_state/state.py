"""`FleetState`: the one bookkeeping between routing policies and the drivers.

It owns the replica table, the admission queue, the recent latency windows, and the
routing policies (the fleet's and each tenant's), and it applies what drivers observe:
requests starting, streaming and finishing on a replica, scraped engine metrics. The live
gateway drives it with sockets and the real clock, the simulator with a virtual clock; the
same calls in the same order give the same decisions. Pure: times come in as arguments.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Generic, TypeVar

from gpufleet.fleet_state.adapters import AdapterCatalog, AdapterSpec, can_serve_adapter
from gpufleet.fleet_state.arrivals import Arrivals
from gpufleet.fleet_state.engine_metrics import ScrapedMetrics
from gpufleet.fleet_state.latency import LatencyWindows
from gpufleet.fleet_state.outlier import OutlierConfig
from gpufleet.fleet_state.peers import PeerEvents
from gpufleet.fleet_state.policy_kinds import LearnsFromPeers, SizedByCapacity
from gpufleet.fleet_state.queue import AdmissionQueue, QueueTicket, Refusal
from gpufleet.fleet_state.replica import FleetReplica
from gpufleet.fleet_state.signals import GatewaySignals, build_signals
from gpufleet.fleet_state.table import ReplicaTable
from gpufleet.routing.slow_start import slow_start_weight
from gpufleet.routing.types import EngineStats, RequestInfo, RoutingPolicy

R = TypeVar("R", bound=FleetReplica)
LOAD_FROM_ENGINE = "engine"  # FleetReplica.load_signals: its /metrics
LOAD_FROM_IN_FLIGHT = "in_flight"  # the gateway's own in-flight counts


def needs_prefix_hashes(policy: RoutingPolicy) -> bool:
    """Whether `choose` reads `RequestInfo.prefix_hashes` (hashing a prompt costs time on
    the gateway's hot path and in the simulator, so drivers skip it when no policy reads it)."""
    return bool(getattr(policy, "uses_prefix_hashes", False))


class FleetState(Generic[R]):
    def __init__(
        self,
        policy: RoutingPolicy,
        *,
        tenant_policies: Mapping[str, RoutingPolicy] | None = None,
        served_models: Iterable[str] = (),
        queue: AdmissionQueue | None = None,
        eject_after_failures: int = 3,
        readmit_after_successes: int = 1,
        signals_window_s: float = 60.0,
        outlier: OutlierConfig | None = None,
        adapters: Iterable[AdapterSpec] = (),
        slow_start_s: float = 0.0,
    ) -> None:
        self.policy = policy
        # Slow start (routing.slow_start): a replica that becomes ready ramps its weight
        # over this window; 0: off. `ramping`: replica id -> when it became ready.
        self.slow_start_s = slow_start_s
        self.ramping: dict[str, float] = {}
        self.tenant_policies: dict[str, RoutingPolicy] = dict(tenant_policies or {})
        self.policies: tuple[RoutingPolicy, ...] = (policy, *self.tenant_policies.values())
        self.needs_prefix = any(needs_prefix_hashes(p) for p in self.policies)
        # Models the fleet serves even while no replica is up (scale from zero); when set,
        # this list is the truth and other models are refused at once.
        self.served_models: frozenset[str] = frozenset(served_models)
        self.table: ReplicaTable[R] = ReplicaTable(
            eject_after_failures, readmit_after_successes, outlier
        )
        self.table.on_removed.append(self._forget_replica)
        self.queue = queue if queue is not None else AdmissionQueue()
        self.latency = LatencyWindows(signals_window_s)
        self.peer_decisions_applied = 0  # peers' routing decisions this worker learned from
        self.arrivals = Arrivals(signals_window_s)
        self.adapters = AdapterCatalog(adapters)  # LoRA adapters: declared and learned
        # What this worker routed since its driver last shipped it to its peer workers
        # (`share_with_peers`); None: no peers, nothing recorded.
        self.outbox: PeerEvents | None = None

    def share_with_peers(self) -> PeerEvents:
        """Record routing events for peer workers from now on; the driver `take`s them."""
        if self.outbox is None:
            self.outbox = PeerEvents()
        return self.outbox

    def apply_peer_events(self, events: PeerEvents) -> None:
        """What peer workers routed: their in-flight changes add to each replica's
        `peer_in_flight`, their decisions go to the policy of the request's tenant as if
        routed here. Replicas this worker does not know (yet, or any more) are skipped."""
        by_id = self.table.by_id
        for replica_id, delta in events.in_flight.items():
            replica = by_id.get(replica_id)
            if replica is not None:
                replica.peer_in_flight = max(0, replica.peer_in_flight + delta)
        for replica_id, tenant, hashes in events.routed:
            policy = self.policy_for(tenant)
            if replica_id in by_id and isinstance(policy, LearnsFromPeers):
                policy.on_peer_routed(replica_id, hashes)
                self.peer_decisions_applied += 1

    def policy_for(self, tenant: str | None) -> RoutingPolicy:
        if self.tenant_policies and tenant is not None:
            return self.tenant_policies.get(tenant, self.policy)
        return self.policy

    # -- slow start -----------------------------------------------------------------------
    def became_ready(self, replica: R, now_s: float) -> None:
        """`replica` became ready at `now_s` (drivers call this; a no-op without slow
        start): it starts its ramp at the lowest weight."""
        if self.slow_start_s > 0:
            self.ramping[replica.replica_id] = now_s
            replica.slow_start_weight = slow_start_weight(0.0, self.slow_start_s)

    def ramp(self, now_s: float) -> None:
        """Time passes: the weights of replicas in slow start follow their age; those past
        the window (or gone) leave it. Drivers call this on admission and now and then."""
        if not self.ramping:
            return
        by_id = self.table.by_id
        for replica_id, since_s in list(self.ramping.items()):
            replica = by_id.get(replica_id)
            weight = slow_start_weight(now_s - since_s, self.slow_start_s)
            if replica is not None:
                replica.slow_start_weight = weight
            if replica is None or weight >= 1.0:
                del self.ramping[replica_id]

    # -- admission ------------------------------------------------------------------------
    def model_known(self, model: str) -> bool:
        """Whether a request for `model` may be served (now or after waiting)."""
        if model in self.table.known or model in self.served_models or model in self.adapters:
            return True
        return not self.served_models and self.table.discovering()

    def admit(
        self,
        model: str,
        pool: str | None,
        now_s: float,
        deadline_s: float,
        ticket: QueueTicket | None = None,
        adapter: str | None = None,
        first_try: bool = True,
    ) -> Sequence[R] | QueueTicket | Refusal:
        """The replicas a request may go to now; else a ticket to wait with (the same one
        when `ticket` is passed and still waits); else why it is refused (404, 503).
        Admitted on its `first_try`, the request counts as an arrival (`arrived`); a retry
        or a resumed stream admitted again does not.
        For a LoRA `adapter` (of base model `model`): the replicas that hold it or may
        load it; 503 when every replica of the model refuses to load it."""
        if ticket is not None:
            adapter = ticket.adapter
        if self.ramping:
            self.ramp(now_s)
        candidates = self.table.eligible(model, pool)
        if candidates and adapter is not None:
            able = [r for r in candidates if can_serve_adapter(r, adapter)]
            if not able:
                why = "; ".join(f"{r.replica_id}: {r.lora_note or 'refused'}" for r in candidates)
                if ticket is not None:
                    self.queue.leave(ticket)
                return Refusal(503, f"no replica of model '{model}' can load the LoRA adapter "
                               f"'{adapter}': {why}", "adapter_not_loadable",
                               param="model")  # fmt: skip
            candidates = able
        if candidates:
            if ticket is not None:
                self.queue.leave(ticket)
            elif first_try:
                self.arrived(now_s, model)
            return candidates
        refusal: Refusal | None = None
        if not self.model_known(model):
            refusal = Refusal(404, f"the model '{model}' does not exist", "model_not_found",
                              param="model", code="model_not_found")  # fmt: skip
        elif model not in self.served_models and (down := self.table.all_down(model, pool)):
            # Fail fast: nothing will become ready to wait for (no scale from zero promised).
            why = "; ".join(f"{r.replica_id} ({r.url}): {r.down_reason or 'failing'}" for r in down)
            refusal = Refusal(503, f"no replica of model '{model}' can become ready: {why}",
                              "no_replica_can_become_ready",
                              retry_after_s=self.queue.limits(model).retry_after_s)  # fmt: skip
        elif now_s >= deadline_s:
            refusal = self._unavailable(model, "timed out in the queue", "queue_timeout")
        elif ticket is None and self.queue.is_full(model):
            refusal = self._unavailable(model, "the queue is full", "queue_full")
        if refusal is not None:
            if ticket is not None:
                self.queue.leave(ticket)
            return refusal
        if ticket is None:
            ticket = QueueTicket(model, pool, deadline_s, adapter)
            self.queue.join(ticket)
            if first_try:
                self.arrived(now_s, model)
        return ticket

    def arrived(self, now_s: float, model: str) -> None:
        """A request admitted on its first try: the arrival rate the autoscaler sizes by
        counts it once, whether it was routed at once (the gateway's hot path, which does
        not call `admit`) or waited in the queue."""
        self.arrivals.add(now_s, model)

    def candidates(
        self, info: RequestInfo, pool: str | None, exclude: Sequence[R] = ()
    ) -> Sequence[R]:
        """The ready replicas a request may go to now (the hot path: no queue)."""
        candidates = self.table.eligible(info.model, pool, exclude)
        adapter = info.adapter
        if adapter is None or not candidates:
            return candidates
        return [r for r in candidates if can_serve_adapter(r, adapter)]

    # -- LoRA adapters ---------------------------------------------------------------------
    def resolve(self, model: str) -> tuple[str, str | None]:
        """(the model whose replicas serve a request for `model`, the adapter or None)."""
        spec = self.adapters.get(model)
        if spec is None or model in self.served_models:
            return model, None
        return spec.base_model, spec.name

    def adapter_missing(self, info: RequestInfo, replica: R) -> AdapterSpec | None:
        """The adapter the driver must load on `replica` before sending it `info`."""
        adapter = info.adapter
        if adapter is None or adapter in replica.models:
            return None
        return self.adapters.get(adapter) or AdapterSpec(adapter, adapter, info.model)

    def adapter_registered(self, replica: R, name: str, loaded: bool = True) -> None:
        """`replica` serves adapter `name` now (`loaded`: this fleet loaded it there)."""
        if loaded:
            replica.adapter_loads += 1
            replica.lora_loadable = True
        if name not in replica.models:
            replica.models = replica.models | {name}
            self.table.changed()

    def adapter_forgotten(self, replica: R, name: str) -> None:
        """`replica` no longer has `name` (it said so, e.g. after a restart)."""
        if name in replica.models:
            replica.models = replica.models - {name}
            self.table.changed()

    def adapter_refused(self, replica: R, why: str) -> None:
        """`replica` does not load adapters at runtime: offer it only those it holds."""
        replica.lora_loadable = False
        replica.lora_note = why
        self.table.changed()

    def leave_queue(self, ticket: QueueTicket) -> None:
        """A waiting request gave up (its client left)."""
        self.queue.leave(ticket)

    def _unavailable(self, model: str, why: str, reason: str) -> Refusal:
        return Refusal(503, f"no replica ready for model '{model}' ({why})", reason,
                       retry_after_s=self.queue.limits(model).retry_after_s)  # fmt: skip

    # -- requests on replicas (policy notifications) --------------------------------------
    def started(self, info: RequestInfo, replica: R, policy: RoutingPolicy) -> None:
        replica.in_flight += 1
        policy.on_started(info, replica)
        if self.outbox is not None:
            routed = isinstance(policy, LearnsFromPeers)
            self.outbox.started(replica.replica_id, info.tenant, tuple(info.prefix_hashes), routed)

    def first_token(self, info: RequestInfo, replica: R, policy: RoutingPolicy) -> None:
        replica.streaming += 1
        policy.on_first_token(info, replica)

    def finished(
        self,
        info: RequestInfo,
        replica: R,
        policy: RoutingPolicy,
        ok: bool,
        streamed: bool = False,
    ) -> None:
        """The request left the replica (`streamed`: after `first_token`)."""
        replica.in_flight -= 1
        if self.outbox is not None:
            self.outbox.finished(replica.replica_id)
        if streamed:
            replica.streaming -= 1
        policy.on_finished(info, replica, ok)

    def observe_latency(
        self,
        now_s: float,
        ttft_s: float | None,
        tpot_s: float | None,
        model: str | None = None,
        tokens: int | None = None,
        prompt_tokens: int | None = None,
    ) -> None:
        self.latency.observe(now_s, ttft_s, tpot_s, model, tokens, prompt_tokens)

    # -- scraped engine metrics -----------------------------------------------------------
    def apply_scrape(self, replica: R, scraped: ScrapedMetrics, now_s: float) -> bool:
        """What a replica's /metrics said at `now_s`. The in-flight count at that moment
        goes with it, so a policy can correct the stale numbers by what was sent since; a
        newly reported KV capacity resizes the policies' per-replica state. A scrape
        without load gauges leaves no stats: policies then see the gateway's in-flight
        count alone, never a replica that looks idle. True when the replica's load source
        changed (engine metrics <-> in-flight counts): drivers say so once."""
        if scraped.engine and replica.engine_source != "config":
            replica.engine, replica.engine_source = scraped.engine, "/metrics names"
        lora = scraped.lora
        if lora is not None:  # adapters it runs are registered there (by any gateway)
            seen = {*lora.running, *lora.waiting}
            if replica.models and not seen <= replica.models:
                replica.models = replica.models | seen
                self.table.changed()
        capacity = scraped.kv_capacity_tokens
        if capacity and capacity != replica.kv_capacity_tokens:
            replica.kv_capacity_tokens = capacity
            for policy in self.policies:
                if isinstance(policy, SizedByCapacity):
                    policy.set_capacity_tokens(replica.replica_id, capacity)
        if not scraped.load_reported:
            return self.route_by_in_flight(replica, replica.load_note or "no load metrics")
        replica.stats = EngineStats(
            num_running=scraped.num_running,
            num_waiting=scraped.num_waiting,
            kv_cache_usage=scraped.kv_cache_usage or 0.0,
            scraped_at_s=now_s,
            in_flight_at_scrape=replica.in_flight + replica.peer_in_flight,
            kv_reported=scraped.kv_cache_usage is not None,
            running_adapters=lora.running if lora else (),
            waiting_adapters=lora.waiting if lora else (),
            max_lora=lora.max_lora if lora else None,
        )
        changed = replica.load_signals != LOAD_FROM_ENGINE
        replica.load_signals, replica.load_note = LOAD_FROM_ENGINE, ""
        return changed

    def route_by_in_flight(self, replica: R, note: str) -> bool:
        """Route `replica` by the gateway's in-flight counts alone (its engine exposes no
        load metrics; `note` says why). True when this is news."""
        replica.stats = None
        changed = replica.load_signals != LOAD_FROM_IN_FLIGHT
        replica.load_signals, replica.load_note = LOAD_FROM_IN_FLIGHT, note
        return changed

    # -- signals --------------------------------------------------------------------------
    def signals(self, now_s: float) -> GatewaySignals:
        return build_signals(
            now_s, self.table, self.queue.depth_by_model, self.latency, self.arrivals
        )

    def _forget_replica(self, replica_id: str) -> None:
        for policy in self.policies:
            policy.on_replica_removed(replica_id)
