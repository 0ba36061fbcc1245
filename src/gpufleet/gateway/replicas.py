"""The gateway's table of replicas: the `ReplicaView`s policies see, plus health bookkeeping.

Only this module changes a replica's state, so the rules live in one place:
starting --probe passes--> ready --N consecutive failures--> dead (ejected)
dead --M passing probes--> ready; drain: ready/starting --> draining (no new requests).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from gpufleet.routing.types import EngineStats, ReplicaState, ReplicaView


@dataclass(slots=True, eq=False)
class Replica(ReplicaView):
    """A ReplicaView with what only the gateway needs (policies may ignore it)."""

    source: str = "admin"  # "config" replicas are reconciled on reload; "admin" ones are not
    fixed_models: bool = False  # models came from config, not /v1/models
    model_cards: list[dict[str, Any]] = field(default_factory=list)
    consecutive_failures: int = 0
    consecutive_successes: int = 0
    streaming: int = 0  # of in_flight, those whose first byte reached the client
    kv_capacity_tokens: int | None = None  # from vllm:cache_config_info, when reported
    addr: tuple[str, int] = ("", 0)  # host, port for the proxy's connection pool
    host_header: bytes = b""
    # Prometheus children, bound once so the hot path does no label lookup.
    m_requests: Any = None
    m_errors: Any = None
    m_retries: Any = None
    m_ejections: Any = None

    def serves(self, model: str) -> bool:
        # A replica whose models are not known yet (no /v1/models) is not offered any.
        return model in self.models

    def to_json(self) -> dict[str, Any]:
        s = self.stats
        return {
            "id": self.replica_id,
            "url": self.url,
            "models": sorted(self.models),
            "state": str(self.state),
            "in_flight": self.in_flight,
            "streaming": self.streaming,
            "pool": self.pool,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "source": self.source,
            "consecutive_failures": self.consecutive_failures,
            "stats": None
            if s is None
            else {
                "num_running": s.num_running,
                "num_waiting": s.num_waiting,
                "kv_cache_usage": s.kv_cache_usage,
                "scraped_at_s": s.scraped_at_s,
                "in_flight_at_scrape": s.in_flight_at_scrape,
            },
        }


class ReplicaSet:
    """Replicas by id, with a change signal that wakes requests waiting for a ready replica."""

    def __init__(
        self,
        eject_after_failures: int,
        readmit_after_successes: int,
        on_removed: Callable[[str], None],
        on_ejected: Callable[[Replica], None],
    ) -> None:
        self.by_id: dict[str, Replica] = {}
        self.eject_after_failures = eject_after_failures
        self.readmit_after_successes = readmit_after_successes
        self._on_removed = on_removed
        self._on_ejected = on_ejected
        self._ids = itertools.count(1)
        self._changed = asyncio.Event()
        # A cached list of ready replicas; rebuilt only when a state changes.
        self._ready: list[Replica] = []
        self.known: frozenset[str] = frozenset()  # every model some replica serves

    # -- membership -------------------------------------------------------------------
    def new_id(self) -> str:
        while True:
            rid = f"r{next(self._ids)}"
            if rid not in self.by_id:
                return rid

    def add(
        self,
        url: str,
        replica_id: str | None = None,
        pool: str | None = None,
        models: Iterable[str] = (),
        source: str = "admin",
    ) -> Replica:
        rid = replica_id or self.new_id()
        if rid in self.by_id:
            raise KeyError(rid)
        model_set = frozenset(models)
        replica = Replica(
            replica_id=rid,
            url=url.rstrip("/"),
            models=model_set,
            state=ReplicaState.STARTING,
            pool=pool,
            source=source,
            fixed_models=bool(model_set),
        )
        parts = urlsplit(replica.url)
        replica.addr = (parts.hostname or "127.0.0.1", parts.port or 80)
        replica.host_header = parts.netloc.encode()
        self.by_id[rid] = replica
        return replica

    def remove(self, replica_id: str) -> Replica:
        replica = self.by_id.pop(replica_id)
        replica.state = ReplicaState.DEAD
        self._on_removed(replica_id)
        self.changed()
        return replica

    def drain(self, replica_id: str) -> Replica:
        replica = self.by_id[replica_id]
        replica.state = ReplicaState.DRAINING
        self.changed()
        return replica

    def find_by_url(self, url: str) -> Replica | None:
        url = url.rstrip("/")
        for r in self.by_id.values():
            if r.url == url:
                return r
        return None

    # -- health -------------------------------------------------------------------------
    def record_success(self, replica: Replica) -> None:
        replica.consecutive_failures = 0

    def record_failure(self, replica: Replica) -> None:
        """A failed request or probe; eject after too many in a row."""
        replica.consecutive_successes = 0
        replica.consecutive_failures += 1
        if (
            replica.state is ReplicaState.READY
            and replica.consecutive_failures >= self.eject_after_failures
        ):
            replica.state = ReplicaState.DEAD
            self._on_ejected(replica)
            self._on_removed(replica.replica_id)
            self.changed()

    def probe_passed(self, replica: Replica) -> bool:
        """A passing /health probe. True when the replica became ready (caller loads models)."""
        replica.consecutive_failures = 0
        replica.consecutive_successes += 1
        if replica.state is ReplicaState.STARTING:
            return True
        return (
            replica.state is ReplicaState.DEAD
            and replica.consecutive_successes >= self.readmit_after_successes
        )

    def mark_ready(self, replica: Replica) -> None:
        if replica.replica_id in self.by_id and replica.state in (
            ReplicaState.STARTING,
            ReplicaState.DEAD,
        ):
            replica.state = ReplicaState.READY
            replica.consecutive_failures = 0
            self.changed()

    def set_stats(self, replica: Replica, stats: EngineStats) -> None:
        replica.stats = stats

    # -- queries (hot path) -------------------------------------------------------------
    def changed(self) -> None:
        self._ready = [r for r in self.by_id.values() if r.state is ReplicaState.READY]
        self.known = frozenset(m for r in self.by_id.values() for m in r.models)
        self._changed.set()
        self._changed = asyncio.Event()

    def wait_changed(self) -> asyncio.Event:
        return self._changed

    def eligible(
        self, model: str, pool: str | None, exclude: tuple[Replica, ...] = ()
    ) -> list[Replica]:
        return [
            r
            for r in self._ready
            if r.pool == pool and model in r.models and (not exclude or r not in exclude)
        ]

    def known_models(self) -> set[str]:
        out: set[str] = set()
        for r in self.by_id.values():
            out.update(r.models)
        return out

    def __iter__(self) -> Any:
        return iter(list(self.by_id.values()))

    def __len__(self) -> int:
        return len(self.by_id)
