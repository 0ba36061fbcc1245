"""A small deterministic fleet replay for routing policies (virtual clock, no I/O).

Each replica is a FIFO prefill server with a true LRU prefix cache (`PrefixIndex` with one
replica) and unbounded decode concurrency: enough to see the three things a router
changes — cache hits, prefill queueing (TTFT) and how load splits — without the engine.
The simulator can reuse it for quick sweeps; `gpufleet.sim` replays with real engines.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpufleet.routing.prefix_index import PrefixIndex
from gpufleet.routing.types import ReplicaView, RequestInfo, RoutingPolicy
from gpufleet.stats import percentile


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    arrival_s: float
    prefix_hashes: tuple[int, ...]
    output_tokens: int = 64
    session_key: str | None = None
    model: str = "m"
    tenant: str | None = None


@dataclass(frozen=True, slots=True)
class ReplicaTiming:
    cache_blocks: int = 4096  # prefix-cache capacity, in routing blocks
    prefill_base_s: float = 0.01
    prefill_s_per_block: float = 0.002  # uncached blocks only
    tpot_s: float = 0.02


@dataclass(slots=True)
class ReplayReport:
    requests_per_replica: dict[str, int]
    hit_blocks: int
    prompt_blocks: int
    ttft_s: list[float]
    busy_in_flight_s: dict[str, float] = field(default_factory=dict)  # integral of in-flight

    @property
    def hit_rate(self) -> float:
        return self.hit_blocks / self.prompt_blocks if self.prompt_blocks else 0.0

    @property
    def max_mean_requests(self) -> float:
        counts = list(self.requests_per_replica.values())
        mean = sum(counts) / len(counts)
        return max(counts) / mean if mean else 0.0

    @property
    def max_mean_in_flight(self) -> float:
        values = list(self.busy_in_flight_s.values())
        mean = sum(values) / len(values) if values else 0.0
        return max(values) / mean if mean else 0.0

    @property
    def mean_ttft_s(self) -> float:
        return sum(self.ttft_s) / len(self.ttft_s) if self.ttft_s else 0.0

    def ttft_quantile_s(self, q: float) -> float:
        """Quantile `q` (0..1) of the TTFTs, `gpufleet.stats`' definition; 0 when none."""
        return percentile(self.ttft_s, q * 100.0) or 0.0


_FIRST_TOKEN, _FINISH, _ARRIVAL = 0, 1, 2  # at equal times, completions before arrivals


def replay(
    policy: RoutingPolicy,
    requests: Sequence[ReplayRequest],
    *,
    replicas: int = 4,
    timing: ReplicaTiming | None = None,
) -> ReplayReport:
    """Route `requests` (sorted by arrival) with `policy` over `replicas` identical replicas."""
    timing = timing or ReplicaTiming()
    views = [ReplicaView(replica_id=f"r{i}", url=f"sim://r{i}") for i in range(replicas)]
    by_id = {v.replica_id: v for v in views}
    caches = {v.replica_id: PrefixIndex(timing.cache_blocks) for v in views}
    prefill_free_at = dict.fromkeys(by_id, 0.0)
    report = ReplayReport(
        requests_per_replica=dict.fromkeys(by_id, 0),
        hit_blocks=0,
        prompt_blocks=0,
        ttft_s=[],
        busy_in_flight_s=dict.fromkeys(by_id, 0.0),
    )
    events: list[tuple[float, int, int, int]] = [
        (r.arrival_s, _ARRIVAL, i, i) for i, r in enumerate(requests)
    ]
    heapq.heapify(events)
    infos: dict[int, tuple[RequestInfo, ReplicaView]] = {}
    last_t = 0.0
    seq = len(requests)
    while events:
        t, kind, _, idx = heapq.heappop(events)
        for v in views:  # integrate in-flight over time for the time-averaged load
            report.busy_in_flight_s[v.replica_id] += v.in_flight * (t - last_t)
        last_t = t
        if kind == _ARRIVAL:
            req = requests[idx]
            info = RequestInfo(
                request_id=f"q{idx}",
                model=req.model,
                tenant=req.tenant,
                session_key=req.session_key,
                prefix_hashes=req.prefix_hashes,
                prompt_tokens=len(req.prefix_hashes),
            )
            chosen = policy.choose(info, views)
            if chosen is None:
                raise RuntimeError("policy chose nothing with replicas available")
            rid = chosen.replica_id
            chosen.in_flight += 1
            policy.on_started(info, chosen)
            report.requests_per_replica[rid] += 1
            hit = caches[rid].match(req.prefix_hashes, (rid,))[rid]
            caches[rid].insert(rid, req.prefix_hashes)
            report.hit_blocks += hit
            report.prompt_blocks += len(req.prefix_hashes)
            miss = len(req.prefix_hashes) - hit
            start = max(t, prefill_free_at[rid])
            done = start + timing.prefill_base_s + miss * timing.prefill_s_per_block
            prefill_free_at[rid] = done
            report.ttft_s.append(done - t)
            infos[idx] = (info, chosen)
            seq += 1
            heapq.heappush(events, (done, _FIRST_TOKEN, seq, idx))
            seq += 1
            finish = done + req.output_tokens * timing.tpot_s
            heapq.heappush(events, (finish, _FINISH, seq, idx))
        elif kind == _FIRST_TOKEN:
            info, view = infos[idx]
            policy.on_first_token(info, by_id[view.replica_id])
        else:
            info, view = infos.pop(idx)
            view.in_flight -= 1
            policy.on_finished(info, view, True)
    return report


def single_cache_hit_rate(requests: Sequence[ReplayRequest], cache_blocks: int) -> float:
    """Hit rate of one LRU prefix cache of `cache_blocks` seeing every request in order:
    the ceiling for a fleet whose caches add up to the same size."""
    cache = PrefixIndex(cache_blocks)
    hits = total = 0
    for req in requests:
        hits += cache.match(req.prefix_hashes, ("all",))["all"]
        cache.insert("all", req.prefix_hashes)
        total += len(req.prefix_hashes)
    return hits / total if total else 0.0
