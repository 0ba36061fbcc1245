"""What one simulated fleet is: its replica groups, tenants, gateway settings, autoscaler
and the failures it meets."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.autoscale.decision import ScalingPolicy
from gpufleet.engine import EngineConfig
from gpufleet.engine.lora import LoraConfig
from gpufleet.perf.lora import LoraCost
from gpufleet.perf.step_time import StepTimeModel
from gpufleet.routing.prefix import ROUTING_BLOCK_TOKENS
from gpufleet.routing.types import RoutingPolicy


@dataclass(frozen=True, slots=True)
class AutoscaleSpec:
    policy: ScalingPolicy
    interval_s: float = 1.0
    startup_s: float = 30.0
    drain_deadline_s: float = 60.0


@dataclass(frozen=True)
class ReplicaGroup:
    """Replicas of one layout (a GPU type and its split) behind the fleet's one gateway.

    Several groups make a heterogeneous fleet; `pool` pins a group to a tenant pool (the
    gateway's `pool`: None is the shared pool). The autoscaler starts and drains replicas
    of the one `autoscaled` group and counts every group's replicas, as a live controller
    beside statically configured replicas does.
    """

    name: str
    engine: EngineConfig
    step_time_model: StepTimeModel
    replicas: int = 1  # warm at t = 0
    pool: str | None = None
    autoscaled: bool = False
    startup_s: float = 30.0  # a cold start (scale-out or restart after a crash)
    gpus_per_replica: int = 1
    price_per_gpu_hour_usd: float = 0.0


@dataclass(frozen=True)
class TenantSpec:
    """A tenant as the gateway config names one, with its share of the requests."""

    name: str
    share: float  # a weight: requests are drawn for tenants in proportion to it
    pool: str | None = None
    routing: RoutingPolicy | None = None  # its own routing policy (None: the fleet's)
    requests_per_s: float | None = None  # token bucket (429 + Retry-After beyond it)
    burst: int | None = None
    max_concurrency: int | None = None  # requests in flight (429 beyond it)


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """Replica processes crash at exponential times with this mean (per replica, from the
    moment it starts); `restart`: the actuator starts it again (gpufleet up's
    `restart_crashed`), after its backoff and a cold start."""

    mtbf_s: float
    restart: bool = True


@dataclass(frozen=True, slots=True)
class SimLora:
    """Replicas serve LoRA adapters (`gpufleet replica --enable-lora`): their slots, the
    cost model, and the rank of every adapter the workload names. The simulated gateway
    loads an adapter onto a replica the first time it sends it a request for it."""

    config: LoraConfig
    cost: LoraCost
    rank: int = 16


@dataclass(frozen=True)
class SimConfig:
    engine: EngineConfig
    step_time_model: StepTimeModel
    model: str = "model"
    replicas: int = 1  # the fixed fleet, or the initial one when autoscaling
    autoscale: AutoscaleSpec | None = None
    scrape_interval_s: float = 1.0  # gateway: scrape_interval_s
    signals_window_s: float = 60.0  # gateway: signals_window_s
    slow_start_s: float = 0.0  # gateway: slow_start_s (a new replica's ramp; 0: off)
    queue_timeout_s: float = 60.0  # gateway: queue.timeout_s
    queue_max_size: int = 256  # gateway: queue.max_size (beyond it: 503)
    queue_retry_after_s: int = 5  # gateway: queue.retry_after_s
    max_attempts: int = 3  # gateway: limits.max_attempts (tries before the first byte)
    # The live HTTP path a request takes before its engine sees it (client, gateway and
    # replica handling, and the first chunk's way back), as measured on the live fleet.
    request_overhead_s: float = 0.0
    # When the first autoscaler tick and gateway scrape come (0: at once; a scrape then
    # every interval). Live they fall anywhere in their interval of the traffic's start.
    tick_phase_s: float = 0.0
    scrape_phase_s: float = 0.0
    closed_loop_clients: int | None = None  # None: open loop at the requests' arrival times
    tail_s: float = 0.0  # keep the autoscaler ticking this long after the last request
    # The gateway hashes 256 bytes of prompt text per routing block, ≈ 64 tokens.
    routing_block_tokens: int = ROUTING_BLOCK_TOKENS
    seed: int = 0
    # Advance each engine over runs of plain decode iterations in one event (the results
    # are the same as stepping; False steps one iteration per event, for comparison).
    jump_decode_runs: bool = True
    lora: SimLora | None = None  # replicas serve LoRA adapters
    max_events: int = 200_000_000  # a hang guard, far above any real run
    # Several layouts behind one gateway; empty: one group of `engine` × `replicas`.
    groups: tuple[ReplicaGroup, ...] = ()
    tenants: tuple[TenantSpec, ...] = ()
    faults: FaultSpec | None = None
    gpus_per_replica: int = 1  # of the one group when `groups` is empty
    price_per_gpu_hour_usd: float = 0.0

    def replica_groups(self) -> tuple[ReplicaGroup, ...]:
        """The groups of replicas (`groups`, or the one group `engine` × `replicas`)."""
        if self.groups:
            return self.groups
        startup_s = self.autoscale.startup_s if self.autoscale is not None else 30.0
        return (
            ReplicaGroup(
                "default",
                self.engine,
                self.step_time_model,
                self.replicas,
                autoscaled=self.autoscale is not None,
                startup_s=startup_s,
                gpus_per_replica=self.gpus_per_replica,
                price_per_gpu_hour_usd=self.price_per_gpu_hour_usd,
            ),
        )

    def check(self) -> None:
        """ValueError naming what does not fit together."""
        groups = self.replica_groups()
        names = [g.name for g in groups]
        if len(set(names)) != len(names):
            raise ValueError(f"replica group names must differ: {names}")
        scaled = [g.name for g in groups if g.autoscaled]
        if self.autoscale is not None and len(scaled) != 1:
            raise ValueError(f"autoscaling needs exactly one autoscaled group, got {scaled}")
        if self.autoscale is None and scaled:
            raise ValueError(f"group {scaled[0]} is autoscaled but there is no autoscaler")
        if self.autoscale is None and sum(g.replicas for g in groups) < 1:
            raise ValueError("a fixed fleet needs at least one replica")
        if any(g.replicas < 0 for g in groups):
            raise ValueError("replicas must be >= 0")
        e = groups[0].engine
        if any(
            (g.engine.block_size, g.engine.enable_prefix_caching)
            != (e.block_size, e.enable_prefix_caching)
            for g in groups
        ):
            raise ValueError("replica groups must share block_size and prefix caching")
        tenants = [t.name for t in self.tenants]
        if len(set(tenants)) != len(tenants) or any(t.share <= 0 for t in self.tenants):
            raise ValueError("tenant names must differ and their shares be > 0")
        if not self.slow_start_s >= 0:
            raise ValueError(f"slow_start_s must be >= 0 (0: off), got {self.slow_start_s}")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.faults is not None and not self.faults.mtbf_s > 0:
            raise ValueError("faults.mtbf_s must be > 0")

    @property
    def max_model_len(self) -> int:
        """The longest request some replica accepts."""
        return max(g.engine.max_model_len for g in self.replica_groups())
