"""What a simulated run returns: per request, per replica, per scaling decision."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.autoscale.decision import ScalingDecision


@dataclass(slots=True, init=False)  # (`__init__` below: one per request, compiled)
class RequestResult:
    """What a client saw of one request (times in seconds of virtual time)."""

    index: int
    arrival_s: float
    input_tokens: int
    output_tokens: int  # generated
    replica_id: str | None = None
    dispatched_s: float | None = None  # left the gateway queue for a replica
    first_token_s: float | None = None
    finished_s: float | None = None
    prefix_hit_tokens: int = 0
    preemptions: int = 0
    tenant: str | None = None
    attempts: int = 0  # replicas it was sent to (more than 1: retried after a failure)
    # None: completed. Else why not: queue_full and queue_timeout (the gateway's 503),
    # rate_limited (the tenant's 429), context_length_exceeded (the replica's 400),
    # drain_deadline, replica_failed (failed before its first token on every try: 502),
    # stream_cut (its replica failed after the first token), previous_turn_failed.
    error: str | None = None

    def __init__(
        self,
        index: int,
        arrival_s: float,
        input_tokens: int,
        output_tokens: int,
        replica_id: str | None = None,
        dispatched_s: float | None = None,
        first_token_s: float | None = None,
        finished_s: float | None = None,
        prefix_hit_tokens: int = 0,
        preemptions: int = 0,
        tenant: str | None = None,
        attempts: int = 0,
        error: str | None = None,
    ) -> None:
        # The dataclass's own `__init__`, written out: mypyc leaves a generated one
        # interpreted (mypyc/mypyc#817), ~5,000 instructions a request.
        self.index = index
        self.arrival_s = arrival_s
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.replica_id = replica_id
        self.dispatched_s = dispatched_s
        self.first_token_s = first_token_s
        self.finished_s = finished_s
        self.prefix_hit_tokens = prefix_hit_tokens
        self.preemptions = preemptions
        self.tenant = tenant
        self.attempts = attempts
        self.error = error

    @property
    def ok(self) -> bool:
        return self.error is None and self.finished_s is not None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished_s is None else self.finished_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """vLLM's definition: (E2E - TTFT) / (output tokens - 1), for > 1 token."""
        if not self.ok or self.output_tokens <= 1 or self.first_token_s is None:
            return None
        assert self.finished_s is not None
        return (self.finished_s - self.first_token_s) / (self.output_tokens - 1)


@dataclass(slots=True)
class ReplicaRecord:
    """One replica process's life (a restart after a crash is another record, same id)."""

    replica_id: str
    group: str  # its replica group (layout)
    gpus: int  # GPUs it holds
    price_per_gpu_hour_usd: float
    restarts: int  # crashes before this process
    started_s: float
    ready_s: float | None
    stopped_s: float | None
    lifetime_s: float  # held its GPUs: from start (cold start included) to stop
    requests: int
    mean_in_flight: float
    peak_in_flight: int
    prefix_queries_tokens: int
    prefix_hits_tokens: int
    preemptions: int
    steps: int
    # LoRA: adapters the gateway loaded there; the engine's admissions with an adapter,
    # those whose adapter was already in a GPU slot, loads from disk, slot activations
    adapter_loads: int = 0
    lora_admissions: int = 0
    lora_gpu_hits: int = 0
    lora_disk_loads: int = 0
    lora_activations: int = 0

    @property
    def gpu_hours(self) -> float:
        return self.lifetime_s * self.gpus / 3600.0

    @property
    def cost_usd(self) -> float:
        return self.gpu_hours * self.price_per_gpu_hour_usd


@dataclass(slots=True)
class SimResult:
    requests: list[RequestResult]
    replicas: list[ReplicaRecord]
    decisions: list[ScalingDecision]  # every tick
    end_s: float
    events: int
    wall_s: float
    cpu_s: float = 0.0  # this process's CPU time (the machine may be shared)
    fleet_size: list[tuple[float, int, int]] = field(default_factory=list)  # (t, ready, total)
    retries: int = 0  # tries on another replica after one failed a request
    crashes: int = 0  # replica processes that failed
    # Replicas a scale-out took back while they drained (ready at once, no cold start).
    undrained: int = 0

    @property
    def scaling_changes(self) -> list[ScalingDecision]:
        return [d for d in self.decisions if d.delta != 0]
