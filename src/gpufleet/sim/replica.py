"""One simulated replica: an `Engine` plus what the gateway and the actuator know of it.

The gateway's view (`FleetReplica`: state, in-flight count, scraped stats) and the
actuator's `ManagedReplica` (start time, expected ready time) are the live system's own
classes, so the routing and scaling policies read exactly what they read live.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.autoscale.actuator import ManagedReplica
from gpufleet.engine import Advance, Engine, EngineDriver
from gpufleet.engine.lora import AdapterSlots
from gpufleet.fleet_state import FleetReplica, ScrapedMetrics
from gpufleet.fleet_state.lora_metrics import LoraRequestsInfo
from gpufleet.routing.types import ReplicaState
from gpufleet.sim.config import ReplicaGroup, SimLora


@dataclass(slots=True)
class SimReplica:
    replica_id: str
    engine: Engine
    driver: EngineDriver
    view: FleetReplica
    managed: ManagedReplica
    stepping: bool = False  # a step is in flight (its completion event is queued)
    advance: Advance | None = None  # the iterations whose delivery is queued
    stopped_at_s: float | None = None
    requests_routed: int = 0
    in_flight_seconds: float = 0.0  # integral of in-flight over time (time-averaged load)
    last_change_s: float = 0.0
    peak_in_flight: int = 0
    live_ids: set[str] = field(default_factory=set)
    group: ReplicaGroup | None = None  # its layout (set by `create`)
    spawned_s: float = 0.0  # its process started (after a restart's backoff)
    restarts: int = 0  # crashes it was restarted after
    drain_due_s: float | None = None  # its drain's deadline (None: not draining)

    @classmethod
    def create(
        cls,
        replica_id: str,
        model: str,
        group: ReplicaGroup,
        *,
        now_s: float,
        startup_s: float,
        seed: int,
        backoff_s: float = 0.0,
        restarts: int = 0,
        lora: SimLora | None = None,
    ) -> SimReplica:
        """A replica holding its GPUs from `now_s`, its process spawned `backoff_s` later
        and ready `startup_s` after that (at once when both are 0)."""
        ready_in_s = backoff_s + startup_s
        state = ReplicaState.READY if ready_in_s <= 0 else ReplicaState.STARTING
        slots = AdapterSlots(lora.config, lora.cost) if lora is not None else None
        engine = Engine(group.engine, group.step_time_model, seed=seed, lora=slots)
        engine.advance_to(now_s)
        return cls(
            replica_id=replica_id,
            engine=engine,
            driver=EngineDriver(engine),
            view=FleetReplica(
                replica_id=replica_id,
                url=f"sim://{replica_id}",
                models=frozenset({model}),
                state=state,
                fixed_models=True,
                pool=group.pool,
            ),
            managed=ManagedReplica(
                replica_id=replica_id,
                url=f"sim://{replica_id}",
                state=state,
                started_at_s=now_s,
                expected_ready_s=now_s + ready_in_s,
                ready_at_s=now_s if ready_in_s <= 0 else None,
                restarts=restarts,
            ),
            last_change_s=now_s,
            group=group,
            spawned_s=now_s + backoff_s,
            restarts=restarts,
        )

    @property
    def state(self) -> ReplicaState:
        return self.view.state

    def set_state(self, state: ReplicaState) -> None:
        self.view.state = state
        self.managed.state = state

    def scraped(self, now_s: float) -> ScrapedMetrics:
        """What its /metrics would say at `now_s` (`vllm:cache_config_info` included)."""
        running, waiting, kv_usage = self.driver.metrics(now_s)
        cfg = self.engine.config
        return ScrapedMetrics(
            num_running=running,
            num_waiting=waiting,
            kv_cache_usage=kv_usage,
            kv_capacity_tokens=cfg.num_gpu_blocks * cfg.block_size,
            engine="vllm",
            lora=self._lora_info() if self.engine.lora is not None else None,
        )

    def _lora_info(self) -> LoraRequestsInfo | None:
        """vllm:lora_requests_info as the replica exports it (a run changes no adapters)."""
        slots = self.engine.lora
        if slots is None:
            return None
        waiting = slots.waiting_adapters(self.engine.scheduler.waiting)
        return LoraRequestsInfo(tuple(slots.running), tuple(waiting), slots.config.max_loras)

    def account(self, now_s: float) -> None:
        """Integrate the in-flight count up to now; call before it changes."""
        self.in_flight_seconds += self.view.in_flight * (now_s - self.last_change_s)
        self.last_change_s = now_s

    def note_peak(self) -> None:
        if self.view.in_flight > self.peak_in_flight:
            self.peak_in_flight = self.view.in_flight

    def lifetime_s(self, end_s: float) -> float:
        """Seconds the replica held its GPUs: from start (cold start included) to stop."""
        stop = self.stopped_at_s if self.stopped_at_s is not None else end_s
        return max(0.0, stop - self.managed.started_at_s)
