#!/usr/bin/env python3
"""Routing quality in seconds of CPU: the engine-free replay on every workload.

    .venv/bin/python benchmarks/routing_replay.py [SOURCE ...] [--requests 1000]
        [--load 2] [--kv-blocks 24263] [--policies prefix_aware,least_outstanding,...]

SOURCE is a trace (Mooncake JSONL, Azure CSV) or synthetic:NAME[@SEED] (system_prompts,
multi_turn, tool_agent, mixed); default: the shared Mooncake conversation slice and the
four synthetic workloads. Each request is hashed exactly as live: 256-byte blocks of the
chat-templated text for the router, 16-token blocks of its tokens for the replica. Each
replica of `gpufleet.routing.replay` is a FIFO prefill server with vLLM's prefix cache
(running blocks pinned, LRU by release, generated tokens taking room); prefill and decode
speeds are Qwen3-8B on an H100 by the project's step-time model.

`cache_aware_peer` models sglang-router's / vllm-router's cache_aware rule (their defaults).
Besides the policies by name it runs two study routers that see the replicas' real
caches ("oracle"): `oracle_prefix_aware` (prefix_aware's rules, true matches) and
`oracle_longest` (true longest match, least loaded on ties, no bounds). The gap from a
policy to its oracle is what its index gets wrong; the gap from the oracles to the pooled
cache is the cost of splitting one cache into replicas (and of the bounds). Two pooled
references: one LRU of prompt blocks only (what routing_quality.py reports), and one
engine with the fleet's KV under the replicas' own rules (generated blocks and running
requests take room); the first overstates what one pooled engine reaches.

Writes benchmarks/results/routing_replay.json and .md (one table per workload).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import random
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from gpufleet.routing import make_policy  # noqa: E402
from gpufleet.routing.base import PolicyBase  # noqa: E402
from gpufleet.routing.prefix_aware import PrefixAware  # noqa: E402
from gpufleet.routing.prefix_index import PrefixIndex  # noqa: E402
from gpufleet.routing.replay import (  # noqa: E402
    EngineCacheModel,
    ReplayRequest,
    ReplicaTiming,
    pooled_cache_hit_rate,
    pooled_engine_hit_rate,
    replay,
)
from gpufleet.routing.types import ReplicaView, RequestInfo  # noqa: E402
from record import RESULTS, write_result  # noqa: E402
from routing_workloads import (  # noqa: E402
    SYNTHETIC,
    HashedRequest,
    hash_requests,
    load_requests,
    source_label,
)

BLOCK_TOKENS = 16
ORACLES = ("oracle_prefix_aware", "oracle_longest")
PEER_MODELS = ("cache_aware_peer",)


class CacheAwarePeer(PolicyBase):
    """sglang-router's (and its fork vllm-router's) cache_aware rule, as documented, on
    this replay's routing blocks: when loads are imbalanced (max - min > `balance_abs` and
    max > `balance_rel` x min, in-flight counts) the least loaded replica; else the
    longest match if it covers more than `cache_threshold` of the prompt, else the replica
    whose tree is smallest. Its defaults are sglang-router 0.3's. A model for the replay
    (the real routers run live in routing_quality.py), not a gpufleet policy."""

    name = "cache_aware_peer"
    uses_prefix_hashes = True

    def __init__(
        self,
        *,
        seed: int | None = None,
        cache_threshold: float = 0.3,
        balance_abs: int = 64,
        balance_rel: float = 1.5,
    ) -> None:
        super().__init__(seed=seed)
        self.cache_threshold = cache_threshold
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel
        self.index = PrefixIndex(1 << 30)  # max_tree_size 2^26 chars: never reached here

    def choose(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> ReplicaView | None:
        if not replicas:
            return None
        loads = [r.in_flight for r in replicas]
        hashes = request.prefix_hashes
        if max(loads) - min(loads) > self.balance_abs and max(loads) > self.balance_rel * min(
            loads
        ):
            chosen = min(replicas, key=lambda r: r.in_flight)
        else:
            matches = self.index.match(hashes, (r.replica_id for r in replicas))
            best = max(replicas, key=lambda r: matches[r.replica_id])
            if hashes and matches[best.replica_id] > self.cache_threshold * len(hashes):
                chosen = best
            else:
                chosen = min(replicas, key=lambda r: self.index.blocks_held(r.replica_id))
        if hashes:
            self.index.insert(chosen.replica_id, hashes)
        return chosen


def default_sources() -> list[str]:
    from gpufleet.workload.prefix_sharing import WORKLOAD_NAMES
    from routing_quality import default_trace

    return [default_trace(), *(f"{SYNTHETIC}{n}" for n in WORKLOAD_NAMES)]


class _TrueIndex:
    """A stand-in for PrefixAware's index that answers from the replicas' real caches."""

    def __init__(
        self, caches: dict[str, EngineCacheModel], by_routing: dict[tuple[int, ...], HashedRequest]
    ) -> None:
        self.caches = caches
        self.by_routing = by_routing
        # where prompts branch is the router's own knowledge, not the caches': learnt as
        # prefix_aware learns it
        self.branches = PrefixIndex(1 << 30)

    def match(self, hashes: Sequence[int], replica_ids: Iterable[str]) -> dict[str, int]:
        req = self.by_routing[tuple(hashes)]
        out = {}
        for rid in replica_ids:
            hit = self.caches[rid].cached_prefix(req.engine_hashes)
            # In routing blocks, as the policy counts: the matched share of the prompt.
            out[rid] = int(len(hashes) * hit * BLOCK_TOKENS / max(1, req.prompt_tokens))
        return out

    def insert(self, replica_id: str, hashes: Sequence[int]) -> None:
        self.branches.insert(replica_id, hashes)

    def shared_depth(self, hashes: Sequence[int], limit: int) -> int:
        return self.branches.shared_depth(hashes, limit)

    def set_capacity(self, replica_id: str, capacity_blocks: int) -> None:
        return None

    def remove_replica(self, replica_id: str) -> None:
        return None


def interpreted_prefix_aware() -> type[PrefixAware]:
    """PrefixAware from its source file, never the compiled module: the oracles swap its index
    for _TrueIndex, which a compiled PrefixAware refuses (its `index` attribute is typed
    PrefixIndex and checked at run time). The same rules either way: mypyc compiles the same
    source, and the interpreted one imports the compiled PrefixIndex it calls."""
    import gpufleet.routing.prefix_aware as module

    source = module.__file__ or ""
    if source.endswith(".py"):
        return PrefixAware
    spec = importlib.util.spec_from_file_location(
        "gpufleet.routing._prefix_aware_interpreted", Path(source).with_name("prefix_aware.py")
    )
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    cls: type[PrefixAware] = loaded.PrefixAware
    return cls


def make_router(
    spec: str,
    caches: dict[str, EngineCacheModel],
    by_routing: dict[tuple[int, ...], HashedRequest],
    capacity_tokens: int,
    seed: int,
    block_bytes: int = 256,
) -> Any:
    """A router from `NAME` or `NAME:{json options}`; the oracles take prefix_aware's options."""
    name, _, raw = spec.partition(":")
    options: dict[str, Any] = json.loads(raw) if raw else {}
    if name == "oracle_longest":
        options = {
            "balance_factor": 1e9,
            "inflight_factor": 1e9,
            "inflight_slack": 1e9,
            "share_weight": 0.0,
            "miss_weight": 1e9,
            **options,
        }
    if name in PEER_MODELS:
        return CacheAwarePeer(seed=seed, **options)
    if name in ORACLES:
        policy = interpreted_prefix_aware()(seed=seed, **options)
        policy.index = _TrueIndex(caches, by_routing)  # type: ignore[assignment]
        return policy
    if name == "prefix_aware":
        options.setdefault("capacity_tokens", capacity_tokens)
        options.setdefault("block_bytes", block_bytes)
    return make_policy(name, seed=seed, **options)


def jittered(requests: list[ReplayRequest], seed: int, jitter_s: float) -> list[ReplayRequest]:
    """Seed 0: the arrivals as given; others: each delayed by up to `jitter_s`, as a live
    client's sends are, so a run's chance placements can be averaged out."""
    if seed == 0 or jitter_s <= 0:
        return requests
    rng = random.Random(seed)
    moved = [
        dataclasses.replace(r, arrival_s=r.arrival_s + rng.uniform(0, jitter_s)) for r in requests
    ]
    return sorted(moved, key=lambda r: r.arrival_s)


def router_specs(args: argparse.Namespace) -> list[str]:
    specs = [p for p in args.policies.split(",") if p] + list(args.policy)
    return specs + (list(ORACLES) if args.oracles else [])


def replay_requests(hashed: Sequence[HashedRequest]) -> list[ReplayRequest]:
    """The hashed workload as the replay's requests (router and engine views of each prompt)."""
    return [
        ReplayRequest(
            arrival_s=h.arrival_s,
            prefix_hashes=h.routing_hashes,
            output_tokens=h.output_tokens,
            session_key=h.session,
            cache_hashes=h.engine_hashes,
            prompt_tokens=h.prompt_tokens,
        )
        for h in hashed
    ]


def run_source(source: str, args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    raw = load_requests(source, args.offset, args.requests, args.load, args.max_output_tokens)
    hashed = hash_requests(raw, BLOCK_TOKENS, args.routing_block_bytes)
    load_s = time.perf_counter() - t0
    requests = replay_requests(hashed)
    by_routing = {h.routing_hashes: h for h in hashed}
    timing = ReplicaTiming(
        cache_blocks=args.kv_blocks,
        block_tokens=BLOCK_TOKENS,
        prefill_base_s=args.prefill_base_s,
        prefill_s_per_token=1.0 / args.prefill_tokens_per_s,
        tpot_s=args.tpot_s,
    )
    pooled = pooled_cache_hit_rate(requests, args.kv_blocks * args.replicas, BLOCK_TOKENS)
    pooled_engine = pooled_engine_hit_rate(requests, timing, args.replicas)
    rows = []
    for name in router_specs(args):
        runs = []
        t = time.perf_counter()
        for seed in range(args.seeds):
            caches: dict[str, EngineCacheModel] = {}
            router = make_router(
                name,
                caches,
                by_routing,
                args.kv_blocks * BLOCK_TOKENS,
                seed,
                args.routing_block_bytes,
            )
            report = replay(
                router,
                jittered(requests, seed, args.jitter_s),
                replicas=args.replicas,
                timing=timing,
                caches=caches,
            )
            runs.append(
                {
                    "hit_rate": report.hit_rate,
                    "vs_pooled": report.hit_rate / pooled if pooled else float("nan"),
                    "vs_pooled_engine": (
                        report.hit_rate / pooled_engine if pooled_engine else float("nan")
                    ),
                    # Hits lost because a replica other than the chosen one held the
                    # prefix (spills for load, copies of shared prefixes), in units of the
                    # pooled engine's hit rate; the rest of a gap is eviction.
                    "held_elsewhere_vs_pooled_engine": (
                        report.held_elsewhere_rate / pooled_engine if pooled_engine else 0.0
                    ),
                    # Hits lost because the chosen replica's own LRU evicted what it had
                    # cached (nobody held it any more), in the same units.
                    "evicted_here_vs_pooled_engine": (
                        report.evicted_here_rate / pooled_engine if pooled_engine else 0.0
                    ),
                    "mean_ttft_s": report.mean_ttft_s,
                    "p99_ttft_s": report.ttft_quantile_s(0.99),
                    "max_mean_requests": report.max_mean_requests,
                    "max_mean_prefill": report.max_mean_prefill,
                }
            )
        row: dict[str, Any] = {"router": name, "cpu_s": time.perf_counter() - t, "runs": runs}
        for key in runs[0]:
            values = [r[key] for r in runs]
            row[key] = sum(values) / len(values)
            row[f"{key}_range"] = (min(values), max(values))
        rows.append(row)
    tokens = sum(h.prompt_tokens for h in hashed)
    return {
        "source": source,
        "label": source_label(source),
        "requests": len(hashed),
        "span_s": hashed[-1].arrival_s if hashed else 0.0,
        "mean_prompt_tokens": tokens / max(1, len(hashed)),
        "bytes_per_token": sum(h.prompt_bytes for h in hashed) / max(1, tokens),
        "pooled_hit_rate": pooled,
        "pooled_engine_hit_rate": pooled_engine,
        "load_s": load_s,
        "rows": rows,
    }


def markdown(results: Sequence[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"# routing_replay: {args.replicas} replicas x {args.kv_blocks} KV blocks of "
        f"{BLOCK_TOKENS} tokens, {args.load}x the workload's pace, first {args.requests} "
        f"requests from #{args.offset}; means over {args.seeds} router seed(s), the range of "
        "the ratio in brackets",
        "",
    ]
    for res in results:
        lines += [
            f"## {res['label']}: {res['requests']} requests over {res['span_s']:.0f} s, "
            f"{res['mean_prompt_tokens']:.0f} prompt tokens on average; one pooled LRU of "
            f"prompts would hit {res['pooled_hit_rate']:.3f}, one pooled engine (outputs "
            f"and running requests take room) {res['pooled_engine_hit_rate']:.3f}. Held "
            "elsewhere: prompt tokens computed again that another replica held when the prefill "
            "started, over the pooled engine's hits (what placement lost); evicted here: "
            "past those, ones the chosen replica had cached itself (what its LRU lost)",
            "",
            "| router | hit rate | vs pooled | vs pooled engine | held elsewhere | evicted here "
            "| mean TTFT ms | p99 TTFT ms | max/mean requests | max/mean prefill |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in res["rows"]:
            lo, hi = r["vs_pooled_range"]
            spread = f" ({lo:.3f}–{hi:.3f})" if args.seeds > 1 else ""
            lines.append(
                f"| {r['router']} | {r['hit_rate']:.3f} | {r['vs_pooled']:.3f}{spread} "
                f"| {r['vs_pooled_engine']:.3f} | {r['held_elsewhere_vs_pooled_engine']:.3f} "
                f"| {r['evicted_here_vs_pooled_engine']:.3f} "
                f"| {r['mean_ttft_s'] * 1e3:.0f} | {r['p99_ttft_s'] * 1e3:.0f} "
                f"| {r['max_mean_requests']:.3f} | {r['max_mean_prefill']:.3f} |"
            )
        lines.append("")
    return "\n".join(lines)


def add_setup_args(p: argparse.ArgumentParser) -> None:
    """The workload slice, the replicas and the seeds: shared with routing_attribution, so
    its causes are those of the replay's rows."""
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--load", type=float, default=2.0, help="x the workload's own pace")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument(
        "--kv-blocks",
        type=int,
        default=24_263,
        help="KV blocks per replica (default: Qwen3-8B on an H100, what the replica plans)",
    )
    p.add_argument("--prefill-tokens-per-s", type=float, default=30_000.0)
    p.add_argument("--prefill-base-s", type=float, default=0.01)
    p.add_argument("--tpot-s", type=float, default=0.015)
    p.add_argument("--max-output-tokens", type=int, default=1024)
    p.add_argument(
        "--routing-block-bytes",
        type=int,
        default=256,
        help="the gateway's routing block (prefix_aware is told with block_bytes)",
    )
    p.add_argument("--seeds", type=int, default=3, help="runs to average (seed > 0 jitters)")
    p.add_argument("--jitter-s", type=float, default=0.05, help="arrival jitter of seeds > 0")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sources", nargs="*", help="traces or synthetic:NAME (default: all)")
    add_setup_args(p)
    p.add_argument(
        "--policies",
        default="prefix_aware,cache_aware_peer,session,least_outstanding,round_robin",
        help="gpufleet policies, or cache_aware_peer (sglang-/vllm-router's rule, modelled)",
    )
    p.add_argument(
        "--policy",
        action="append",
        default=[],
        help='one more router, NAME or NAME:{"option": value} (repeatable)',
    )
    p.add_argument("--no-oracles", dest="oracles", action="store_false")
    p.add_argument("--out", default=str(RESULTS / "routing_replay"), help="path without suffix")
    args = p.parse_args(argv)
    args.sources = args.sources or default_sources()
    return args


def main() -> None:
    args = parse_args()
    results = []
    for source in args.sources:
        res = run_source(source, args)
        results.append(res)
        print(markdown([res], args).split("\n", 2)[2], flush=True)
    write_result(Path(args.out), {"args": vars(args), "results": results}, markdown(results, args))


if __name__ == "__main__":
    main()
