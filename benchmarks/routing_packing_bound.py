#!/usr/bin/env python3
"""How balanced a fleet can be without losing a hit: the offline packing bound.

    .venv/bin/python benchmarks/routing_packing_bound.py [SOURCE ...] [--replicas 4]
        [--max-mean 1.10] [replay flags]

Every prompt of the synthetic workloads starts with a shared prefix (a system prompt, an
agent's tools) and continues a conversation whose history only its own next turns reuse.
Where the replicas' caches never evict (multi_turn, tool_agent: evicted here is 0 in
routing_replay), a fleet hits what one pooled cache hits only if every group of prompts
behind one shared prefix runs on one replica: any second holder computes the prefix once
more (a copy), and moving a conversation recomputes its history. So the least run-long
max/mean requests a fleet reaches at the pooled cache's hit rate is that of the best
split of the groups' request counts over the replicas (a min-max partition, solved here
by branch and bound from the longest-processing-time split). Past it, the cheapest way to
the balance bound is to copy the shared prefixes of a few groups, each copy costing its
prefix's tokens once; reported is the best one-copy plan (any group, its conversations
split in two at any subset sum) and its hit rate against the pooled LRU's, assuming
nothing else is lost. It knows every group's final size in advance: an online router does
not, so this is a bound, not a target.

Between the two, a study router in the replay (`SizeOracle`, not a gpufleet policy) that
sees requests in arrival order but is told each group's final size when its first prompt
comes: it puts the group, for good, on the replica with the fewest requests promised so far
(greedy, in arrival order). Where it reaches both the hit rate and the balance, what an
online router lacks is only the groups' sizes.

Writes benchmarks/results/routing_packing_bound.{json,md}.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from gpufleet.routing.base import PolicyBase  # noqa: E402
from gpufleet.routing.replay import ReplicaTiming, pooled_cache_hit_rate, replay  # noqa: E402
from gpufleet.routing.types import ReplicaView, RequestInfo  # noqa: E402
from routing_workloads import (  # noqa: E402
    SYNTHETIC,
    HashedRequest,
    hash_requests,
    load_requests,
    source_label,
)

NODE_LIMIT = 200_000  # branch-and-bound nodes per packing (the LPT split past it)


@dataclass(frozen=True)
class Group:
    """The prompts behind one shared prefix: its length and its conversations' sizes."""

    shared_blocks: int
    conversations: tuple[int, ...]

    @property
    def requests(self) -> int:
        return sum(self.conversations)


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def groups_of(hashed: Sequence[HashedRequest]) -> list[Group]:
    """Conversations (by session) grouped by their first engine block; a group's shared
    prefix is the blocks all its conversations' first prompts have in common."""
    sessions: dict[str, list[HashedRequest]] = defaultdict(list)
    for h in hashed:
        sessions[h.session].append(h)
    by_first: dict[int, list[list[HashedRequest]]] = defaultdict(list)
    for turns in sessions.values():
        if turns[0].engine_hashes:
            by_first[turns[0].engine_hashes[0]].append(turns)
    groups = []
    for convs in by_first.values():
        firsts = [c[0].engine_hashes for c in convs]
        shared = min((_common(firsts[0], f) for f in firsts[1:]), default=len(firsts[0]))
        groups.append(Group(shared, tuple(len(c) for c in convs)))
    return sorted(groups, key=lambda g: -g.requests)


def min_max_split(sizes: Sequence[int], bins: int, node_limit: int = NODE_LIMIT) -> int:
    """The least largest bin over splits of `sizes` (whole) into `bins` bins: branch and
    bound from the LPT split, exact unless it runs past `node_limit` nodes."""
    items = sorted(sizes, reverse=True)
    loads = [0] * bins
    for s in items:  # LPT: an upper bound to prune with
        loads[loads.index(min(loads))] += s
    best = max(loads)
    lower = max(items[0] if items else 0, -(-sum(items) // bins))
    if best == lower:
        return best
    loads = [0] * bins
    nodes = 0

    def place(k: int) -> None:
        nonlocal best, nodes
        nodes += 1
        if k == len(items) or nodes > node_limit or best == lower:
            if k == len(items):
                best = min(best, max(loads))
            return
        seen = set()
        for b in range(bins):
            if loads[b] in seen or loads[b] + items[k] >= best:
                continue  # symmetric, or no better than the best split found
            seen.add(loads[b])
            loads[b] += items[k]
            place(k + 1)
            loads[b] -= items[k]

    place(0)
    return best


def subset_sums(sizes: Sequence[int]) -> list[int]:
    sums = {0}
    for s in sizes:
        sums |= {x + s for x in sums}
    return sorted(sums)


def one_copy_plan(groups: Sequence[Group], bins: int, cap: int) -> tuple[int, int, int] | None:
    """The cheapest single copy (group index, its shared blocks, the largest bin) that
    brings the largest bin to `cap` or under; None when one copy is not enough."""
    best: tuple[int, int, int] | None = None
    for g in sorted(range(len(groups)), key=lambda i: groups[i].shared_blocks):
        if best is not None and groups[g].shared_blocks >= best[1]:
            break
        rest = [x.requests for i, x in enumerate(groups) if i != g]
        total = groups[g].requests
        for part in subset_sums(groups[g].conversations):
            if not 0 < part <= total // 2:
                continue
            top = min_max_split([*rest, part, total - part], bins, node_limit=20_000)
            if top <= cap:
                best = (g, groups[g].shared_blocks, top)
                break
    return best


class SizeOracle(PolicyBase):
    """Each group on one replica for good, chosen when its first prompt comes: the one
    with the fewest requests promised so far, told the group's final size."""

    name = "size_oracle"
    uses_prefix_hashes = True

    def __init__(self, group_of: dict[tuple[int, ...], int], size: dict[int, int]) -> None:
        super().__init__(seed=0)
        self.group_of = group_of
        self.size = size
        self.home: dict[int, str] = {}
        self.promised: dict[str, int] = {}

    def choose(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> ReplicaView | None:
        if not replicas:
            return None
        g = self.group_of[tuple(request.prefix_hashes)]
        if g not in self.home:
            r = min(replicas, key=lambda v: self.promised.get(v.replica_id, 0))
            self.home[g] = r.replica_id
            self.promised[r.replica_id] = self.promised.get(r.replica_id, 0) + self.size[g]
        return next(v for v in replicas if v.replica_id == self.home[g])


def size_oracle_runs(
    hashed: Sequence[HashedRequest], pooled: float, args: argparse.Namespace
) -> dict[str, float]:
    """SizeOracle in the replay, means over the seeds (seed > 0 jitters arrivals)."""
    from routing_replay import BLOCK_TOKENS, jittered, replay_requests

    requests = replay_requests(hashed)
    group_of = {h.routing_hashes: h.engine_hashes[0] if h.engine_hashes else 0 for h in hashed}
    size: dict[int, int] = defaultdict(int)
    for h in hashed:
        size[group_of[h.routing_hashes]] += 1
    timing = ReplicaTiming(
        cache_blocks=args.kv_blocks,
        block_tokens=BLOCK_TOKENS,
        prefill_base_s=args.prefill_base_s,
        prefill_s_per_token=1.0 / args.prefill_tokens_per_s,
        tpot_s=args.tpot_s,
    )
    runs = [
        replay(
            SizeOracle(group_of, size),
            jittered(requests, seed, args.jitter_s),
            replicas=args.replicas,
            timing=timing,
        )
        for seed in range(args.seeds)
    ]
    n = len(runs)
    return {
        "vs_pooled": sum(r.hit_rate for r in runs) / n / pooled if pooled else float("nan"),
        "max_mean_requests": sum(r.max_mean_requests for r in runs) / n,
        "mean_ttft_s": sum(r.mean_ttft_s for r in runs) / n,
        "p99_ttft_s": sum(r.ttft_quantile_s(0.99) for r in runs) / n,
    }


def run_source(source: str, args: argparse.Namespace) -> dict[str, Any]:
    from routing_replay import BLOCK_TOKENS, replay_requests  # (asks git for the commit)

    raw = load_requests(source, args.offset, args.requests, args.load, args.max_output_tokens)
    hashed = hash_requests(raw, BLOCK_TOKENS, args.routing_block_bytes)
    requests = replay_requests(hashed)
    pooled = pooled_cache_hit_rate(requests, args.kv_blocks * args.replicas, BLOCK_TOKENS)
    pooled_hit_tokens = pooled * sum(h.prompt_tokens for h in hashed)
    groups = groups_of(hashed)
    mean = len(hashed) / args.replicas
    cap = int(args.max_mean * mean)
    top = min_max_split([g.requests for g in groups], args.replicas)
    plan = None if top <= cap else one_copy_plan(groups, args.replicas, cap)
    copy_tokens = plan[1] * BLOCK_TOKENS if plan else 0
    return {
        "source": source,
        "label": source_label(source),
        "requests": len(hashed),
        "groups": len(groups),
        "largest_group_share": groups[0].requests / len(hashed) if groups else 0.0,
        "zero_copy_max_mean": top / mean,
        "one_copy_max_mean": plan[2] / mean if plan else None,
        "one_copy_shared_tokens": copy_tokens if plan else None,
        "one_copy_vs_pooled": (1.0 - copy_tokens / pooled_hit_tokens) if plan else None,
        "pooled_hit_rate": pooled,
        "size_oracle": size_oracle_runs(hashed, pooled, args),
    }


def markdown(results: Sequence[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"# routing_packing_bound: {args.replicas} replicas, first {args.requests} requests; "
        f"the least run-long max/mean requests with every shared-prefix group on one replica "
        f"(no hit lost to a copy), and the cheapest single copy that reaches "
        f"{args.max_mean:.2f} (its hit rate x the pooled LRU's if nothing else is lost)",
        "",
        "| workload | requests | groups | largest group share | zero-copy max/mean "
        "| one copy: max/mean | its prefix tokens | x pooled "
        "| size oracle online: x pooled, max/mean, TTFT mean/p99 ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in results:
        one = r["one_copy_max_mean"]
        so = r["size_oracle"]
        oracle = (
            f" {so['vs_pooled']:.4f}, {so['max_mean_requests']:.3f}, "
            f"{so['mean_ttft_s'] * 1e3:.0f}/{so['p99_ttft_s'] * 1e3:.0f} |"
        )
        lines.append(
            f"| {r['label']} | {r['requests']} | {r['groups']} "
            f"| {r['largest_group_share']:.3f} | {r['zero_copy_max_mean']:.3f} "
            + (
                f"| {one:.3f} | {r['one_copy_shared_tokens']} | {r['one_copy_vs_pooled']:.4f} |"
                if one is not None
                else "| — | — | 1.0000 |"
                if r["zero_copy_max_mean"] <= args.max_mean
                else "| > 1 copy | — | — |"
            )
            + oracle
        )
    return "\n".join([*lines, ""])


def main() -> None:
    from record import RESULTS, write_result  # (asks git for the commit)
    from routing_replay import add_setup_args

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sources", nargs="*", help="synthetic:NAME[@SEED] (default: the four)")
    add_setup_args(p)
    p.add_argument("--max-mean", type=float, default=1.10, help="the balance bound")
    p.add_argument(
        "--out", default=str(RESULTS / "routing_packing_bound"), help="path without suffix"
    )
    args = p.parse_args()
    from gpufleet.workload.prefix_sharing import WORKLOAD_NAMES

    args.sources = args.sources or [f"{SYNTHETIC}{n}" for n in WORKLOAD_NAMES]
    results = [run_source(s, args) for s in args.sources]
    text = markdown(results, args)
    print(text)
    write_result(Path(args.out), {"args": vars(args), "results": results}, text)


if __name__ == "__main__":
    main()
