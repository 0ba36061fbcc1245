"""Small builders for routing tests (plain data, no network)."""

from __future__ import annotations

from gpufleet.routing.types import EngineStats, ReplicaView, RequestInfo


def views(n: int, in_flight: list[int] | None = None) -> list[ReplicaView]:
    loads = in_flight or [0] * n
    return [
        ReplicaView(replica_id=f"r{i}", url=f"http://127.0.0.1:{9000 + i}", in_flight=loads[i])
        for i in range(n)
    ]


def request(i: int = 0, **kw: object) -> RequestInfo:
    return RequestInfo(request_id=f"q{i}", model="m", **kw)  # type: ignore[arg-type]


def stats(running: int = 0, waiting: int = 0, kv: float = 0.0, at_scrape: int = 0) -> EngineStats:
    return EngineStats(
        num_running=running, num_waiting=waiting, kv_cache_usage=kv, in_flight_at_scrape=at_scrape
    )
