"""The gateway's replicas: the fleet core's `FleetReplica` plus what only the proxy needs.

The table, the state machine and eligibility live in `gpufleet.fleet_state`; this adds the
connection address, where a replica came from, its model cards and its Prometheus counters
(bound once, so the hot path does no label lookup).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from gpufleet.fleet_state import FleetReplica
from gpufleet.routing.types import ReplicaState


# No slots: `FleetReplica` may be a compiled class (make sim-compiled), and a slotted
# dataclass subclass would redeclare its fields as slots of its own, which compiled code
# does not read.
@dataclass(eq=False)
class Replica(FleetReplica):
    source: str = "admin"  # "config" replicas are reconciled on reload; "admin" ones are not
    model_cards: list[dict[str, Any]] = field(default_factory=list)
    addr: tuple[str, int] = ("", 0)  # host, port for the proxy's connection pool
    host_header: bytes = b""
    rx_chunks: int = 0  # response chunks received from it (a probe's proof of life)
    uses_models_probe: bool = False  # no /health (a plain OpenAI server): probe /v1/models
    lora_api: str | None = None  # whose dynamic-LoRA API it answered: "vllm", "sglang"
    m_requests: Any = None
    m_errors: Any = None
    m_retries: Any = None
    m_ejections: Any = None

    @classmethod
    def create(
        cls,
        replica_id: str,
        url: str,
        pool: str | None = None,
        models: Iterable[str] = (),
        source: str = "admin",
        engine: str = "auto",
    ) -> Replica:
        """A `starting` replica; its models, when given, are fixed (else learned later);
        its engine, unless "auto", is the config's (else named from its metrics)."""
        model_set = frozenset(models)
        url = url.rstrip("/")
        parts = urlsplit(url)
        return cls(
            replica_id=replica_id,
            url=url,
            models=model_set,
            state=ReplicaState.STARTING,
            pool=pool,
            fixed_models=bool(model_set),
            source=source,
            addr=(parts.hostname or "127.0.0.1", parts.port or 80),
            host_header=parts.netloc.encode(),
            engine=None if engine == "auto" else engine,
            engine_source="" if engine == "auto" else "config",
        )

    def to_json(self) -> dict[str, Any]:
        s = self.stats
        return {
            "id": self.replica_id,
            "url": self.url,
            "models": sorted(self.models),
            "state": str(self.state),
            "reason": self.down_reason or None,  # why it is not serving, from its last probe
            "probe": "/v1/models" if self.uses_models_probe else "/health",
            "in_flight": self.in_flight,
            "streaming": self.streaming,
            "pool": self.pool,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "engine": self.engine,
            "engine_source": self.engine_source or None,
            # "engine": its /metrics; "in_flight": the gateway's own counts (why: load_note)
            "load_signals": self.load_signals,
            "load_note": self.load_note or None,
            "source": self.source,
            "lora": {
                "api": self.lora_api,
                "loadable": self.lora_loadable,
                "note": self.lora_note or None,
                "adapter_loads": self.adapter_loads,
            },
            "consecutive_failures": self.consecutive_failures,
            "healthy": self.healthy,
            "ejections": self.ejections,
            # seconds left of an outlier ejection (None: not ejected)
            "ejected_for_s": None
            if self.ejected_until_s is None
            else max(0.0, self.ejected_until_s - time.monotonic()),
            "stats": None
            if s is None
            else {
                "num_running": s.num_running,
                "num_waiting": s.num_waiting,
                "kv_cache_usage": s.kv_cache_usage,
                "scraped_at_s": s.scraped_at_s,
                "in_flight_at_scrape": s.in_flight_at_scrape,
                "running_adapters": list(s.running_adapters),
                "waiting_adapters": list(s.waiting_adapters),
                "max_lora": s.max_lora,
            },
        }
