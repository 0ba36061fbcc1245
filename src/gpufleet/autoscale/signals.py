"""What a scaling policy sees of the fleet at one instant (DESIGN.md: `FleetSignals`).

The controller (live) and the simulator (virtual clock) build these from the gateway's
window and the replicas' scraped /metrics; policies only read them.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.routing.types import ReplicaState


@dataclass(frozen=True, slots=True)
class Percentiles:
    """Latency percentiles over the gateway's recent window, in seconds."""

    p50_s: float
    p90_s: float
    p99_s: float


@dataclass(frozen=True, slots=True)
class ReplicaSignals:
    """One replica as the controller last saw it."""

    replica_id: str
    state: ReplicaState = ReplicaState.READY
    running: int = 0  # vllm:num_requests_running
    waiting: int = 0  # vllm:num_requests_waiting
    kv_usage: float = 0.0  # vllm:kv_cache_usage_perc, fraction 0..1
    in_flight: int = 0  # the gateway's count of requests sent and not finished
    # For a STARTING replica: when it is expected to pass /health (same clock as now_s).
    expected_ready_s: float | None = None

    @property
    def load(self) -> int:
        """Requests this replica holds: the larger of what it reports and what was sent."""
        return max(self.running + self.waiting, self.in_flight)


@dataclass(frozen=True, slots=True)
class FleetSignals:
    replicas: tuple[ReplicaSignals, ...] = ()
    queue_depth: int = 0  # requests held at the gateway because no replica could take them
    in_flight: int = 0  # requests the gateway has sent and not seen finish
    ttft_s: Percentiles | None = None  # None when the window saw no request
    tpot_s: Percentiles | None = None
    window_s: float = 0.0
    # Seconds from start to ready the actuator has recently observed (None: unknown yet).
    cold_start_s: float | None = None
    # Requests the gateway has admitted since it started (a counter: a policy takes the
    # arrival rate from its change between ticks; None: the gateway does not count them).
    admitted_total: int | None = None
    # Requests whose latency the window holds (None: not reported): a tail over a few
    # requests says little.
    latency_requests: int | None = None
    # Mean prompt + output tokens of the requests finished over the window (None: not
    # counted): the work a request brings, which changes with the mix.
    tokens_per_request: float | None = None
    # Their mean prompt tokens alone (None: not counted): the rest is output.
    prompt_tokens_per_request: float | None = None

    def in_state(self, state: ReplicaState) -> tuple[ReplicaSignals, ...]:
        return tuple(r for r in self.replicas if r.state == state)

    @property
    def ready(self) -> tuple[ReplicaSignals, ...]:
        return self.in_state(ReplicaState.READY)

    @property
    def starting(self) -> tuple[ReplicaSignals, ...]:
        return self.in_state(ReplicaState.STARTING)

    @property
    def current_replicas(self) -> int:
        """The count the actuator is keeping: ready plus starting (draining ones are leaving)."""
        return len(self.ready) + len(self.starting)

    @property
    def demand(self) -> int:
        """Requests in the system: held by ready or draining replicas, or queued at the gateway.

        The gateway's in-flight total and the replicas' own counts describe the same
        requests; take the larger so that a stale scrape does not hide load.
        """
        on_replicas = sum(r.load for r in self.replicas if r.state != ReplicaState.DEAD)
        return max(on_replicas, self.in_flight) + self.queue_depth

    @property
    def waiting(self) -> int:
        """Requests not yet in a batch: waiting inside ready replicas plus queued at the gateway."""
        return sum(r.waiting for r in self.ready) + self.queue_depth
