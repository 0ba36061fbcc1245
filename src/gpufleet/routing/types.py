"""What a router knows and decides (DESIGN.md: `ReplicaView`, `RequestInfo`, `RoutingPolicy`).

The gateway (live) and the simulator (virtual clock) both keep one `ReplicaView` per
replica up to date and ask a policy to choose. Policies never read a clock, sleep or do
I/O; anything time-dependent comes in through the views (`stats.scraped_at_s`) or the
`now_s` the caller passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from gpufleet.native import mypyc_attr


class ReplicaState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    DEAD = "dead"


_ENGINE_STATS_FIELDS = (  # in the dataclass's order (its repr)
    "num_running", "num_waiting", "kv_cache_usage", "scraped_at_s", "in_flight_at_scrape",
    "kv_reported", "running_adapters", "waiting_adapters", "max_lora",
)  # fmt: skip


class EngineStats:
    """The last scrape of a replica's /metrics (vLLM names in comments).

    A plain class with the dataclass's `__init__`, `__eq__` and `__repr__` written out: the
    simulator builds one per scrape, and mypyc compiles an explicit `__init__` but keeps a
    dataclass's generated one in Python (mypyc/mypyc#817).
    """

    __slots__ = (
        "in_flight_at_scrape", "kv_cache_usage", "kv_reported", "max_lora", "num_running",
        "num_waiting", "running_adapters", "scraped_at_s", "waiting_adapters",
    )  # fmt: skip

    def __init__(
        self,
        num_running: int = 0,  # vllm:num_requests_running
        num_waiting: int = 0,  # vllm:num_requests_waiting
        kv_cache_usage: float = 0.0,  # vllm:kv_cache_usage_perc, a fraction 0..1
        scraped_at_s: float = 0.0,
        # The gateway's own in-flight count for this replica when the scrape was taken, so
        # a policy can correct stale engine numbers by what was sent since.
        in_flight_at_scrape: int = 0,
        kv_reported: bool = True,  # False: the engine exports no KV usage (TGI); 0.0 above
        # vllm:lora_requests_info: adapters with requests running / waiting, and max_lora
        # (the adapters one batch may use); max_lora None: the replica does not report LoRA.
        running_adapters: tuple[str, ...] = (),
        waiting_adapters: tuple[str, ...] = (),
        max_lora: int | None = None,
    ) -> None:
        self.num_running = num_running
        self.num_waiting = num_waiting
        self.kv_cache_usage = kv_cache_usage
        self.scraped_at_s = scraped_at_s
        self.in_flight_at_scrape = in_flight_at_scrape
        self.kv_reported = kv_reported
        self.running_adapters = running_adapters
        self.waiting_adapters = waiting_adapters
        self.max_lora = max_lora

    def _values(self) -> tuple[object, ...]:
        """The fields in the dataclass's order (for `__eq__` and `__repr__`, never hot)."""
        return tuple(getattr(self, name) for name in _ENGINE_STATS_FIELDS)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, EngineStats)
        return self._values() == other._values()

    def __repr__(self) -> str:
        values = zip(_ENGINE_STATS_FIELDS, self._values(), strict=True)
        body = ", ".join(f"{n}={v!r}" for n, v in values)
        return f"{self.__class__.__qualname__}({body})"


@mypyc_attr(allow_interpreted_subclasses=True)  # (compiled: the gateway's `Replica` is not)
@dataclass(slots=True)
class ReplicaView:
    replica_id: str
    url: str
    models: frozenset[str] = frozenset()
    state: ReplicaState = ReplicaState.READY
    in_flight: int = 0  # requests this gateway sent and has not seen finish
    # requests the other workers of this gateway (`--workers N`) sent, as they told it
    peer_in_flight: int = 0
    stats: EngineStats | None = None
    pool: str | None = None  # tenant pool this replica belongs to; None = shared
    labels: dict[str, str] = field(default_factory=dict)
    # Slow start (routing.slow_start): < 1 while it ramps up after becoming ready; the
    # fleet core sets it. Load-comparing policies divide its in-flight count by it.
    slow_start_weight: float = 1.0
    # Of `in_flight`, those whose first token came back (the fleet core counts them); the
    # rest still wait for their prefill (`routing.load.awaiting_first_token`).
    streaming: int = 0


@dataclass(frozen=True, slots=True, init=False)  # (`__init__` below: compiled)
class RequestInfo:
    """What a policy knows of one request. For a LoRA adapter (the client's `model` names
    one), `model` is its base model, whose replicas may serve it, and `adapter` its name."""

    request_id: str
    model: str
    prompt_tokens: int = 0
    tenant: str | None = None
    session_key: str | None = None
    # chained hashes of the prompt's blocks (a tuple; the simulator's: a `HashChain`)
    prefix_hashes: Sequence[int] = ()
    adapter: str | None = None  # the LoRA adapter asked for; None: the base model

    def __init__(
        self,
        request_id: str,
        model: str,
        prompt_tokens: int = 0,
        tenant: str | None = None,
        session_key: str | None = None,
        prefix_hashes: Sequence[int] = (),
        adapter: str | None = None,
    ) -> None:
        # The frozen dataclass's own `__init__`, written out: mypyc leaves a generated one
        # interpreted (mypyc/mypyc#817), ~11,000 instructions a request.
        setattr_ = object.__setattr__
        setattr_(self, "request_id", request_id)
        setattr_(self, "model", model)
        setattr_(self, "prompt_tokens", prompt_tokens)
        setattr_(self, "tenant", tenant)
        setattr_(self, "session_key", session_key)
        setattr_(self, "prefix_hashes", prefix_hashes)
        setattr_(self, "adapter", adapter)


class RoutingPolicy(Protocol):
    """Chooses one replica among the eligible ones (ready, serving the model, in the pool).

    `choose` returns None only when `replicas` is empty. The notifications let a policy
    keep its own soft state (prefix index, session map); they must be cheap.
    """

    @property
    def name(self) -> str: ...  # (read-only: a class attribute of the policy's class)

    def choose(
        self, request: RequestInfo, replicas: Sequence[ReplicaView]
    ) -> ReplicaView | None: ...

    def on_started(self, request: RequestInfo, replica: ReplicaView) -> None: ...

    def on_first_token(self, request: RequestInfo, replica: ReplicaView) -> None: ...

    def on_finished(self, request: RequestInfo, replica: ReplicaView, ok: bool) -> None: ...

    def on_replica_removed(self, replica_id: str) -> None: ...
