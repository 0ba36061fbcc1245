#!/usr/bin/env python3
"""prefix_aware's `idle_first` in the simulator: new replicas during a burst (issue 13).

    .venv/bin/python benchmarks/routing_idle_first.py [--seeds 2] [--steady]

Two replicas of Llama-3.1-8B (16-sequence batches) take 3 req/s, then 14 for 40 s, then 3
again; the queue_depth autoscaler adds replicas (5 s cold start, 2..6). Prompts are
2,000 ± 50 % tokens behind one of 8 shared 1,500-token prefixes (weakly matched: no
history), answers 300. With `idle_first` off, pending prefill (blocks, not the wait for a
batch slot) kept new conversations on the queued holders of their prefix while a new
replica idled; on, they go to a replica whose engine reports an empty queue and fewer
requests than the mean. Reports TTFT and, per replica, when it was ready and when it got
its first request (the policy's choices, read off the simulator's clock). `--steady`
adds what it costs where nothing scales: 4 replicas at a steady 10 req/s, 1,200 prompts of
3,000 ± 50 % tokens behind 40 shared 2,000-token prefixes (prefix hit rate, TTFT).

Writes benchmarks/results/routing_idle_first.json and .md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gpufleet.routing import make_policy
from gpufleet.routing.types import ReplicaView, RequestInfo
from gpufleet.sim.report import summarize
from gpufleet.sim.scenario import Scenario, build_config, build_requests
from gpufleet.sim.simulator import FleetSimulator
from gpufleet.workload import RatePhase

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import RESULTS, write_result


def scenario(seed: int) -> Scenario:
    return Scenario(
        rate_steps=(
            RatePhase("quiet", 20, 3, 3),
            RatePhase("burst", 40, 14, 14),
            RatePhase("after", 20, 3, 3),
        ),
        input_tokens=2000,
        output_tokens=300,
        range_ratio=0.5,
        prefix_groups=8,
        prefix_tokens=1500,
        max_num_seqs=16,
        replicas=2,
        routing="prefix_aware",
        autoscale="queue_depth",
        min_replicas=2,
        max_replicas=6,
        startup_s=5.0,
        seed=seed,
    )


def run(seed: int, idle_first: bool) -> dict[str, Any]:
    sc = scenario(seed)
    policy = make_policy("prefix_aware", seed=seed, idle_first=idle_first)
    sim = FleetSimulator(build_config(sc), build_requests(sc), policy)
    first: dict[str, float] = {}
    choose = policy.choose

    def recording(info: RequestInfo, views: Any) -> ReplicaView | None:
        chosen = choose(info, views)
        if chosen is not None:
            first.setdefault(chosen.replica_id, sim.clock.now_s)
        return chosen

    policy.choose = recording  # type: ignore[method-assign]
    s = summarize(sim.run())
    waits = [
        first[r["replica_id"]] - r["ready_s"]
        for r in s["replicas"]
        if r["ready_s"] and r["replica_id"] in first
    ]
    return {
        "seed": seed,
        "idle_first": idle_first,
        "ttft_ms": {k: s["ttft_ms"][k] for k in ("mean", "p50", "p99")},
        "new_replica_first_request_after_ready_s": waits,
        "requests": {r["replica_id"]: r["requests"] for r in s["replicas"] if r["requests"]},
    }


def steady(seed: int, idle_first: bool) -> dict[str, Any]:
    sc = Scenario(rate=10.0, num_requests=1200, input_tokens=3000, output_tokens=300,
                  range_ratio=0.5, prefix_groups=40, prefix_tokens=2000, max_num_seqs=16,
                  replicas=4, routing="prefix_aware", seed=seed)  # fmt: skip
    policy = make_policy("prefix_aware", seed=seed, idle_first=idle_first)
    s = summarize(FleetSimulator(build_config(sc), build_requests(sc), policy).run())
    queries = sum(r["prefix_queries_tokens"] for r in s["replicas"])
    hits = sum(r["prefix_hits_tokens"] for r in s["replicas"])
    return {
        "seed": seed,
        "idle_first": idle_first,
        "hit_rate": hits / queries if queries else 0.0,
        "ttft_ms": {k: s["ttft_ms"][k] for k in ("mean", "p50", "p99")},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--steady", action="store_true", help="add the steady-state table")
    ap.add_argument("--out", type=Path, default=RESULTS / "routing_idle_first")
    args = ap.parse_args()
    rows = [run(seed, on) for seed in range(args.seeds) for on in (False, True)]
    flat = [steady(s, on) for s in range(args.seeds) for on in (False, True)] if args.steady else []
    lines = [
        "| seed | idle_first | mean TTFT ms | p50 TTFT ms | p99 TTFT ms | new replicas: "
        "first request after ready, s (max) | requests per replica |",
        "| ---: | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        t = r["ttft_ms"]
        waits = r["new_replica_first_request_after_ready_s"]
        lines.append(
            f"| {r['seed']} | {'on' if r['idle_first'] else 'off'} | {t['mean']:.0f} | "
            f"{t['p50']:.0f} | {t['p99']:.0f} | {max(waits, default=0.0):.2f} | "
            f"{' '.join(str(v) for v in r['requests'].values())} |"
        )
    if flat:
        lines += [
            "",
            "Steady (no scaling):",
            "",
            "| seed | idle_first | prefix hit rate | mean TTFT ms | p50 TTFT ms | p99 TTFT ms |",
            "| ---: | --- | ---: | ---: | ---: | ---: |",
        ]
        for r in flat:
            t = r["ttft_ms"]
            lines.append(
                f"| {r['seed']} | {'on' if r['idle_first'] else 'off'} | {r['hit_rate']:.4f} | "
                f"{t['mean']:.0f} | {t['p50']:.0f} | {t['p99']:.0f} |"
            )
    table = "\n".join(lines)
    print(table)
    data = {"args": {"seeds": args.seeds, "steady": args.steady}, "results": rows, "steady": flat}
    write_result(args.out, data, table)


if __name__ == "__main__":
    main()
