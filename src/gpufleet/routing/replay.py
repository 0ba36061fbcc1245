"""A small deterministic fleet replay for routing policies (virtual clock, no I/O).

Each replica is a FIFO prefill server with unbounded decode concurrency and a prefix cache
kept as vLLM keeps it (`EngineCacheModel`): blocks of running requests are pinned, a
finished request's blocks become evictable tail first, the least recently freed go first,
and generated tokens take cache space too. That is enough to see the three things a router
changes — cache hits, prefill queueing (TTFT) and how load splits — without the engine;
`gpufleet.sim` replays with real engines.

A request carries two hash chains, as live: the router's (`prefix_hashes`, e.g. 256-byte
text blocks) and the engine's (`cache_hashes`, e.g. 16-token blocks). Without the
latter the router's blocks are the cache's blocks.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from gpufleet.routing.simple import RoundRobin
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
    cache_hashes: tuple[int, ...] | None = None  # engine blocks; None: prefix_hashes
    prompt_tokens: int | None = None  # None: one cache block's tokens per hash


@dataclass(frozen=True, slots=True)
class ReplicaTiming:
    cache_blocks: int = 4096  # KV capacity, in cache blocks (running requests included)
    block_tokens: int = 16  # tokens per cache block
    prefill_base_s: float = 0.01
    prefill_s_per_token: float = 0.002 / 16  # uncached tokens only
    tpot_s: float = 0.02


@dataclass(slots=True)
class CacheLease:
    """What one running request holds in an `EngineCacheModel`."""

    pinned: list[int]  # prompt block hashes it holds a reference on, in prompt order
    private_blocks: int  # blocks only it uses (copies, the partial block, its output)
    cached_output_blocks: int  # full blocks of generated text (cached, never shared)


class EngineCacheModel:
    """One replica's paged KV with prefix caching, counted in blocks (as vLLM's block pool).

    A cached prompt block is findable by hash while a running request holds it (`_ref`)
    or while it waits, evictable, in `free` (head evicted first). Blocks only one request
    can use (a copy computed past a miss, the partial last block, generated text) are
    `private` while it runs; its full generated blocks stay cached afterwards under hashes
    no prompt shares, so they only take room, as in the engine.
    """

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 1:
            raise ValueError("capacity_blocks must be >= 1")
        self.capacity_blocks = capacity_blocks
        self.private = 0
        self.peak_overflow_blocks = 0  # most blocks held past capacity (the engine queues)
        self._ref: dict[int, int] = {}
        self.free: OrderedDict[int, None] = OrderedDict()
        self._anon = 1 << 64  # ids for generated blocks, past any 64-bit prompt hash

    @property
    def occupied_blocks(self) -> int:
        return len(self._ref) + self.private + len(self.free)

    def cached_prefix(self, hashes: Sequence[int], max_blocks: int | None = None) -> int:
        """Leading blocks of `hashes` found in the cache (held or free)."""
        limit = len(hashes) if max_blocks is None else min(max_blocks, len(hashes))
        ref, free = self._ref, self.free
        n = 0
        while n < limit and (hashes[n] in ref or hashes[n] in free):
            n += 1
        return n

    def admit(
        self, hashes: Sequence[int], hit_blocks: int, total_blocks: int, full_blocks: int
    ) -> CacheLease:
        """A request starts with `total_blocks` of KV (prompt and output), `full_blocks` of
        them full; it reuses its first `hit_blocks` prompt blocks and caches the rest."""
        ref, free = self._ref, self.free
        pinned: list[int] = []
        copies = 0
        for k, h in enumerate(hashes):
            if k < hit_blocks:
                if h in free:
                    del free[h]
                    ref[h] = 1
                else:
                    ref[h] += 1
                pinned.append(h)
            elif h in ref or h in free:  # cached, but past a miss: computed again, a copy
                copies += 1
            else:
                ref[h] = 1
                pinned.append(h)
        lease = CacheLease(
            pinned=pinned,
            private_blocks=copies + total_blocks - len(hashes),
            cached_output_blocks=max(0, full_blocks - len(hashes)),
        )
        self.private += lease.private_blocks
        self._evict()
        return lease

    def release(self, lease: CacheLease) -> None:
        """The request finished: its generated blocks become evictable first, then its
        prompt blocks tail to head (so heads outlive tails, as in vLLM)."""
        ref, free = self._ref, self.free
        self.private -= lease.private_blocks
        for _ in range(lease.cached_output_blocks):
            self._anon += 1
            free[self._anon] = None
        for h in reversed(lease.pinned):
            n = ref[h]
            if n > 1:
                ref[h] = n - 1
            else:
                del ref[h]
                free[h] = None
        self._evict()

    def _evict(self) -> None:
        free = self.free
        held = len(self._ref) + self.private
        while free and held + len(free) > self.capacity_blocks:
            free.popitem(last=False)
        self.peak_overflow_blocks = max(self.peak_overflow_blocks, held - self.capacity_blocks)


@dataclass(slots=True)
class ReplayReport:
    requests_per_replica: dict[str, int]
    hit_tokens: int = 0
    prompt_tokens: int = 0
    # Prompt tokens a replica computed again while another replica held them cached when
    # its prefill started: the hits lost to placement (a spill for load, a copy of a shared
    # prefix), as opposed to ones no replica held any more (evicted, or never seen).
    held_elsewhere_tokens: int = 0
    # Prompt tokens past those that a replica computed again though it had cached them
    # itself earlier (no replica held them when its prefill started): hits its own LRU
    # evicted. What is neither is compulsory in the fleet (never cached, or evicted from
    # another replica only).
    evicted_here_tokens: int = 0
    ttft_s: list[float] = field(default_factory=list)
    ttft_s_by_request: dict[int, float] = field(default_factory=dict)  # by input index
    busy_in_flight_s: dict[str, float] = field(default_factory=dict)  # integral of in-flight
    prefill_tokens_per_replica: dict[str, int] = field(default_factory=dict)  # uncached
    peak_overflow_blocks: int = 0  # KV held past capacity on the worst replica
    # Per request, in the order their prefills started (input index -> replica, cache
    # blocks hit, the most any replica held, the deepest it had ever cached itself, the
    # blocks it may hit at most): for studies that attribute each lost hit to a cause.
    placements: dict[int, tuple[str, int, int, int, int]] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float:
        """Prompt tokens served from cache over prompt tokens (vLLM's prefix-cache hit rate)."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def held_elsewhere_rate(self) -> float:
        """`held_elsewhere_tokens` over prompt tokens: the part of the hit rate that the same
        caches would have given with every request sent to its best holder."""
        return self.held_elsewhere_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def evicted_here_rate(self) -> float:
        """`evicted_here_tokens` over prompt tokens."""
        return self.evicted_here_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def max_mean_requests(self) -> float:
        return _max_over_mean(list(self.requests_per_replica.values()))

    @property
    def max_mean_prefill(self) -> float:
        return _max_over_mean(list(self.prefill_tokens_per_replica.values()))

    @property
    def max_mean_in_flight(self) -> float:
        return _max_over_mean(list(self.busy_in_flight_s.values()))

    @property
    def mean_ttft_s(self) -> float:
        return sum(self.ttft_s) / len(self.ttft_s) if self.ttft_s else 0.0

    def ttft_quantile_s(self, q: float) -> float:
        """Quantile `q` (0..1) of the TTFTs, `gpufleet.stats`' definition; 0 when none."""
        return percentile(self.ttft_s, q * 100.0) or 0.0


def _max_over_mean(values: Sequence[float]) -> float:
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean else 0.0


def _prompt_tokens(req: ReplayRequest, block_tokens: int) -> int:
    if req.prompt_tokens is not None:
        return req.prompt_tokens
    return len(req.cache_hashes or req.prefix_hashes) * block_tokens


_FIRST_TOKEN, _FINISH, _ARRIVAL = 0, 1, 2  # at equal times, completions before arrivals


def replay(
    policy: RoutingPolicy,
    requests: Sequence[ReplayRequest],
    *,
    replicas: int = 4,
    timing: ReplicaTiming | None = None,
    caches: dict[str, EngineCacheModel] | None = None,
) -> ReplayReport:
    """Route `requests` (sorted by arrival) with `policy` over `replicas` identical replicas
    named r0, r1, ... `caches`, when given, is filled with their caches (for a study that
    compares what a router believes with what the replicas hold)."""
    timing = timing or ReplicaTiming()
    bs = timing.block_tokens
    views = [ReplicaView(replica_id=f"r{i}", url=f"sim://r{i}") for i in range(replicas)]
    by_id = {v.replica_id: v for v in views}
    if caches is None:
        caches = {}
    caches.clear()
    caches.update({rid: EngineCacheModel(timing.cache_blocks) for rid in by_id})
    prefill_free_at = dict.fromkeys(by_id, 0.0)
    report = ReplayReport(
        requests_per_replica=dict.fromkeys(by_id, 0),
        busy_in_flight_s=dict.fromkeys(by_id, 0.0),
        prefill_tokens_per_replica=dict.fromkeys(by_id, 0),
    )
    events: list[tuple[float, int, int, int]] = [
        (r.arrival_s, _ARRIVAL, i, i) for i, r in enumerate(requests)
    ]
    heapq.heapify(events)
    infos: dict[int, tuple[RequestInfo, ReplicaView]] = {}
    waiting: dict[int, tuple[str, int]] = {}  # request -> (replica, prompt tokens), queued
    leases: dict[int, CacheLease] = {}
    # Every prompt block each replica has cached (for `evicted_here_tokens`; a replay is
    # one benchmark run, so this grows with its distinct blocks).
    seen: dict[str, set[int]] = {rid: set() for rid in by_id}
    last_t = 0.0
    seq = len(requests)
    while events:
        t, kind, _, idx = heapq.heappop(events)
        for v in views:  # integrate in-flight over time for the time-averaged load
            report.busy_in_flight_s[v.replica_id] += v.in_flight * (t - last_t)
        last_t = t
        req = requests[idx]
        if kind == _ARRIVAL:
            tokens = _prompt_tokens(req, bs)
            info = RequestInfo(
                request_id=f"q{idx}",
                model=req.model,
                tenant=req.tenant,
                session_key=req.session_key,
                prefix_hashes=req.prefix_hashes,
                prompt_tokens=tokens,
            )
            chosen = policy.choose(info, views)
            if chosen is None:
                raise RuntimeError("policy chose nothing with replicas available")
            rid = chosen.replica_id
            chosen.in_flight += 1
            policy.on_started(info, chosen)
            infos[idx] = (info, chosen)
            report.requests_per_replica[rid] += 1
            # FIFO prefill: it starts once the prefills ahead of it are done; its cache
            # lookup then sees everything they cached.
            start = max(t, prefill_free_at[rid])
            prefill_free_at[rid] = start  # reserved below, once its miss is known
            waiting[idx] = (rid, tokens)
            seq += 1
            heapq.heappush(events, (start, _ARRIVAL + 1, seq, idx))
        elif kind == _ARRIVAL + 1:  # its prefill starts: look up, allocate, time it
            rid, tokens = waiting.pop(idx)
            cache = caches[rid]
            hashes = req.cache_hashes if req.cache_hashes is not None else req.prefix_hashes
            # Never the prompt's last token: the engine computes it to sample from.
            limit = max(0, tokens - 1) // bs
            hit = cache.cached_prefix(hashes, limit)
            best = k = hit
            if hit < min(limit, len(hashes)):
                best = k = max(c.cached_prefix(hashes, limit) for c in caches.values())
                report.held_elsewhere_tokens += (best - hit) * bs
                once = seen[rid]  # the blocks past every holder's that it had cached
                while k < limit and k < len(hashes) and hashes[k] in once:
                    k += 1
                report.evicted_here_tokens += (k - best) * bs
            report.placements[idx] = (rid, hit, best, k, min(limit, len(hashes)))
            seen[rid].update(hashes)
            total = tokens + req.output_tokens
            leases[idx] = cache.admit(hashes, hit, -(-total // bs), total // bs)
            report.peak_overflow_blocks = max(
                report.peak_overflow_blocks, cache.peak_overflow_blocks
            )
            miss_tokens = tokens - hit * bs
            report.hit_tokens += hit * bs
            report.prompt_tokens += tokens
            report.prefill_tokens_per_replica[rid] += miss_tokens
            start = max(t, prefill_free_at[rid])
            done = start + timing.prefill_base_s + miss_tokens * timing.prefill_s_per_token
            prefill_free_at[rid] = done
            report.ttft_s.append(done - req.arrival_s)
            report.ttft_s_by_request[idx] = done - req.arrival_s
            seq += 1
            heapq.heappush(events, (done, _FIRST_TOKEN, seq, idx))
            seq += 1
            heapq.heappush(events, (done + req.output_tokens * timing.tpot_s, _FINISH, seq, idx))
        elif kind == _FIRST_TOKEN:
            info, view = infos[idx]
            view.streaming += 1  # (as the fleet core counts it: `FleetState.first_token`)
            policy.on_first_token(info, by_id[view.replica_id])
        else:
            info, view = infos.pop(idx)
            caches[view.replica_id].release(leases.pop(idx))
            view.in_flight -= 1
            view.streaming -= 1  # (every request here gets its first token before it ends)
            policy.on_finished(info, view, True)
    return report


def pooled_cache_hit_rate(
    requests: Sequence[ReplayRequest], cache_blocks: int, block_tokens: int = 16
) -> float:
    """Hit rate of one LRU prefix cache of `cache_blocks` seeing every prompt in arrival
    order, prompts only (what one pooled cache of the fleet's size would reach)."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = total = 0
    for req in requests:
        hashes = req.cache_hashes if req.cache_hashes is not None else req.prefix_hashes
        tokens = _prompt_tokens(req, block_tokens)
        n = 0
        while n < len(hashes) and hashes[n] in cache:
            n += 1
        hits += n * block_tokens
        total += tokens
        for h in reversed(hashes):  # the head most recent, so tails go first
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > cache_blocks:
            cache.popitem(last=False)
    return hits / total if total else 0.0


def pooled_engine_hit_rate(
    requests: Sequence[ReplayRequest], timing: ReplicaTiming, replicas: int
) -> float:
    """Hit rate of one engine holding the whole fleet's KV (`replicas` x its cache blocks)
    and prefilling `replicas` times as fast, replayed like the fleet. Unlike
    `pooled_cache_hit_rate` (prompts only) its cache also holds what running requests pin
    and their generated blocks, as vLLM's does: the pooled reference under the same rules
    as the replicas it is compared with."""
    pooled = replace(
        timing,
        cache_blocks=timing.cache_blocks * replicas,
        prefill_s_per_token=timing.prefill_s_per_token / replicas,
    )
    return replay(RoundRobin(), requests, replicas=1, timing=pooled).hit_rate
