#!/usr/bin/env python3
"""Where each hit token lost against one pooled cache goes, request by request.

    .venv/bin/python benchmarks/routing_attribution.py [SOURCE ...] [--seeds 3]
        [--policies prefix_aware,cache_aware_peer,oracle_prefix_aware] [replay flags]

For every request it compares the blocks the pooled LRU of prompts (`routing_replay.py`'s
"vs pooled" reference, fed in arrival order) hits with what the replica it was routed to
hit, and files each lost block under one cause, in this order:

- last token: the pooled LRU counts a whole-prompt block the engine never hits (it
  computes the prompt's last token to sample from); the pooled engine pays it too;
- held elsewhere, moved: another replica held it when the prefill started and the
  router's own index knew a replica holding more of the prompt than the one it chose (a
  move for balance or queueing);
- held elsewhere, unknown: another replica held it, the router's index did not know;
- evicted here, outputs: the chosen replica had cached it and evicted it, while a
  prompt-only LRU of the replica's size fed the same prompts in the same order still
  holds it (room taken by generated blocks and running requests);
- evicted here, split: a prompt-only LRU of the replica's size lost it too (a quarter of
  the pool, fed a quarter of the prompts, keeps a different set);
- evicted elsewhere: nobody holds it any more and the chosen replica never had it (its
  earlier uses were placed on a replica that has since evicted it).

Hits past the pooled LRU's (the replica kept what the pooled LRU evicted) are counted
apart. Beside them: what one pooled engine (`pooled_engine_hit_rate`: the fleet's KV in one
engine under the replicas' rules, generated blocks and running requests taking room) loses
against the pooled LRU, and how much of the fleet's loss is blocks the pooled engine lost
on the same request too ("also pooled engine"). All in units of the pooled LRU's hit
tokens. Writes
benchmarks/results/routing_attribution.{json,md}.
"""

from __future__ import annotations

import argparse
import sys
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from dataclasses import replace  # noqa: E402

from gpufleet.routing.replay import (  # noqa: E402
    EngineCacheModel,
    ReplayRequest,
    ReplicaTiming,
    replay,
)
from gpufleet.routing.simple import RoundRobin  # noqa: E402
from gpufleet.routing.types import ReplicaView, RequestInfo  # noqa: E402
from record import RESULTS, write_result  # noqa: E402
from routing_replay import (  # noqa: E402
    BLOCK_TOKENS,
    add_setup_args,
    jittered,
    make_router,
    replay_requests,
)
from routing_workloads import hash_requests, load_requests, source_label  # noqa: E402

CAUSES = (
    "last_token",
    "held_elsewhere_moved",
    "held_elsewhere_unknown",
    "evicted_here_outputs",
    "evicted_here_split",
    "evicted_elsewhere",
)


class _Lru:
    """A prompt-only LRU of block hashes, as `pooled_cache_hit_rate` keeps it."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def leading(self, hashes: Sequence[int]) -> int:
        n = 0
        while n < len(hashes) and hashes[n] in self.blocks:
            n += 1
        return n

    def add(self, hashes: Sequence[int]) -> None:
        for h in reversed(hashes):
            self.blocks[h] = None
            self.blocks.move_to_end(h)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)


class _Spy:
    """Wraps a router: notes, per request, the deepest match its index believed any
    replica held and the one it believed the chosen replica held."""

    def __init__(self, router: Any) -> None:
        self.router = router
        self.believed: dict[str, tuple[int, int]] = {}

    def choose(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> Any:
        index = getattr(self.router, "index", None)
        matches = (
            index.match(request.prefix_hashes, [r.replica_id for r in replicas])
            if index is not None and request.prefix_hashes
            else {}
        )
        chosen = self.router.choose(request, replicas)
        if matches and chosen is not None:
            self.believed[request.request_id] = (
                max(matches.values()),
                matches[chosen.replica_id],
            )
        return chosen

    def __getattr__(self, name: str) -> Any:
        return getattr(self.router, name)


def attribute(
    requests: list[ReplayRequest], spec: str, args: argparse.Namespace, by_routing: Any, seed: int
) -> dict[str, Any]:
    timing = ReplicaTiming(
        cache_blocks=args.kv_blocks,
        block_tokens=BLOCK_TOKENS,
        prefill_base_s=args.prefill_base_s,
        prefill_s_per_token=1.0 / args.prefill_tokens_per_s,
        tpot_s=args.tpot_s,
    )
    reqs = jittered(requests, seed, args.jitter_s)
    caches: dict[str, EngineCacheModel] = {}
    router = make_router(
        spec, caches, by_routing, args.kv_blocks * BLOCK_TOKENS, seed, args.routing_block_bytes
    )
    spy = _Spy(router)
    report = replay(spy, reqs, replicas=args.replicas, timing=timing, caches=caches)  # type: ignore[arg-type]
    # The pooled LRU's hits per request, in arrival order.
    pooled = _Lru(args.kv_blocks * args.replicas)
    pool_hit: dict[int, int] = {}
    for i, r in enumerate(reqs):
        hashes = r.cache_hashes or r.prefix_hashes
        pool_hit[i] = pooled.leading(hashes)
        pooled.add(hashes)
    # One engine with the fleet's KV and prefill speed, replayed as the fleet is.
    one = replace(
        timing,
        cache_blocks=timing.cache_blocks * args.replicas,
        prefill_s_per_token=timing.prefill_s_per_token / args.replicas,
    )
    engine_hit = {
        i: p[1] for i, p in replay(RoundRobin(), reqs, replicas=1, timing=one).placements.items()
    }
    engine_total = also_engine = 0
    shadows = {f"r{i}": _Lru(args.kv_blocks) for i in range(args.replicas)}
    lost = dict.fromkeys(CAUSES, 0)
    gained = pool_total = 0
    moved_requests = 0
    for idx, (rid, hit, best, seen, limit) in report.placements.items():
        hashes = reqs[idx].cache_hashes or reqs[idx].prefix_hashes
        shadow = shadows[rid]
        shadow_hit = shadow.leading(hashes)
        shadow.add(hashes)
        p = pool_hit[idx]
        pool_total += p
        engine_total += engine_hit[idx]
        also_engine += max(0, min(p - hit, p - engine_hit[idx]))
        if hit >= p:
            gained += hit - p
            continue
        lost["last_token"] += p - min(p, limit)
        p = min(p, limit)
        if p <= hit:
            continue
        held = min(best, p) - hit
        if held > 0:
            believed_best, believed_chosen = spy.believed.get(f"q{idx}", (0, 0))
            key = "moved" if believed_best > believed_chosen else "unknown"
            lost[f"held_elsewhere_{key}"] += held
            moved_requests += key == "moved"
        top = max(hit, best)
        here = max(0, min(seen, p) - top)
        outputs = max(0, min(shadow_hit, top + here) - top)
        lost["evicted_here_outputs"] += outputs
        lost["evicted_here_split"] += here - outputs
        lost["evicted_elsewhere"] += max(0, p - max(top, min(seen, p)))
    scale = 1.0 / pool_total if pool_total else 0.0
    return {
        "router": spec,
        "vs_pooled": report.hit_tokens / (pool_total * BLOCK_TOKENS) if pool_total else 0.0,
        "lost": {k: v * scale for k, v in lost.items()},
        "lost_total": sum(lost.values()) * scale,
        "gained": gained * scale,
        "pooled_engine_lost": (pool_total - engine_total) * scale,
        "also_pooled_engine": also_engine * scale,
        "moved_requests": moved_requests,
        "max_mean_requests": report.max_mean_requests,
    }


def _mean(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs' numbers averaged (nested dicts too), the rest from the first."""
    out: dict[str, Any] = {}
    for key, value in runs[0].items():
        if isinstance(value, dict):
            out[key] = _mean([r[key] for r in runs])
        elif isinstance(value, int | float):
            out[key] = sum(r[key] for r in runs) / len(runs)
        else:
            out[key] = value
    return out


def run_source(source: str, args: argparse.Namespace) -> dict[str, Any]:
    raw = load_requests(source, args.offset, args.requests, args.load, args.max_output_tokens)
    hashed = hash_requests(raw, BLOCK_TOKENS, args.routing_block_bytes)
    requests = replay_requests(hashed)
    by_routing = {h.routing_hashes: h for h in hashed}
    rows = []
    for spec in args.policies.split(","):
        runs = [attribute(requests, spec, args, by_routing, seed) for seed in range(args.seeds)]
        rows.append(_mean(runs))
    return {"source": source, "label": source_label(source), "rows": rows}


def markdown(results: Sequence[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"# routing_attribution: hit tokens lost against the pooled LRU of prompts, by cause "
        f"(x the pooled LRU's hit tokens; means over {args.seeds} seed(s), seed > 0 jitters "
        f"arrivals; {args.replicas} replicas x {args.kv_blocks} blocks, {args.load}x pace, first {args.requests} requests)",
        "",
        "| workload | router | vs pooled | lost | "
        + " | ".join(CAUSES)
        + " | gained | also pooled engine "
        "| pooled engine lost | moved requests | max/mean |",
        "| --- | --- | ---: | ---: | "
        + " | ".join("---:" for _ in CAUSES)
        + " | ---: | ---: | ---: | ---: | ---: |",
    ]
    for res in results:
        for r in res["rows"]:
            cells = " | ".join(f"{r['lost'][c]:.4f}" for c in CAUSES)
            lines.append(
                f"| {res['label']} | {r['router']} | {r['vs_pooled']:.4f} | {r['lost_total']:.4f} "
                f"| {cells} "
                f"| {r['gained']:.4f} | {r['also_pooled_engine']:.4f} "
                f"| {r['pooled_engine_lost']:.4f} | {r['moved_requests']:.1f} | {r['max_mean_requests']:.3f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sources", nargs="*")
    p.add_argument("--policies", default="prefix_aware,cache_aware_peer,oracle_prefix_aware")
    add_setup_args(p)
    p.add_argument("--out", default=str(RESULTS / "routing_attribution"))
    args = p.parse_args(argv)
    sources = args.sources or [
        f"synthetic:{n}" for n in ("system_prompts", "multi_turn", "tool_agent", "mixed")
    ]
    results = []
    for source in sources:
        res = run_source(source, args)
        results.append(res)
        print(markdown([res], args).split("\n", 4)[4], flush=True)
    write_result(Path(args.out), {"args": vars(args), "results": results}, markdown(results, args))


if __name__ == "__main__":
    main()
