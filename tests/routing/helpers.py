"""Small builders for routing tests (plain data, no network)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from gpufleet.routing.base import PolicyBase
from gpufleet.routing.replay import ReplayRequest
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


def hot_prefix_workload(
    *,
    n_requests: int,
    rate_per_s: float,
    hot_weights: Sequence[float] = (0.3, 0.2, 0.1),
    tail_prefixes: int = 40,
    prefix_blocks: int = 40,
    suffix_blocks: int = 4,
    output_tokens: int = 100,
    seed: int = 0,
) -> list[ReplayRequest]:
    """Poisson arrivals; each prompt is a shared prefix followed by a suffix of its own.
    A few hot prefixes take `hot_weights` of the traffic; `tail_prefixes` colder ones share
    the rest evenly."""
    rng = random.Random(seed)
    rest = max(0.0, 1.0 - sum(hot_weights))
    weights = (
        list(hot_weights) + [rest / tail_prefixes] * tail_prefixes
        if tail_prefixes
        else list(hot_weights)
    )
    out: list[ReplayRequest] = []
    t = 0.0
    for i in range(n_requests):
        t += rng.expovariate(rate_per_s)
        p = rng.choices(range(len(weights)), weights=weights)[0]
        shared = tuple(1_000_000 * (p + 1) + b for b in range(prefix_blocks))
        own = tuple(-(i * 1000 + b + 1) for b in range(suffix_blocks))
        out.append(ReplayRequest(t, shared + own, output_tokens))
    return out


def arrivals_taken_by(
    policy: PolicyBase, replicas: Sequence[ReplicaView], target: int, arrivals: int
) -> int:
    """How many of `arrivals` requests (none finishes or gets its first token meanwhile)
    `policy` sends to `replicas[target]`."""
    taken = 0
    for i in range(arrivals):
        chosen = policy.choose(request(i), replicas)
        assert chosen is not None
        chosen.in_flight += 1
        taken += chosen is replicas[target]
    return taken
