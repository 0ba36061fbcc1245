"""How fast `gpufleet sim` replays a real trace, and what the engine-level model adds.

    python benchmarks/sim_speed.py [--trace FILE] [--requests N] [--replicas 8] [--json FILE]

Side by side in one run, on the same requests (default: the whole Mooncake conversation
hour, 12,031 requests, Llama-3.1-8B on H100 replicas):

* `gpufleet sim` (engines with continuous batching, paged KV and prefix caching, the
  gateway's routing policies) with round_robin and prefix_aware;
* the engine-free fleet replay of `gpufleet.routing.replay` (FIFO prefill, LRU prefix cache,
  unbounded decode) with the same two policies — the quick model the routing work used.

For each: wall seconds, events, events per second, simulated seconds per wall second, and
the prefix-cache hit rate and TTFT each model predicts. Writes JSON (default
benchmarks/results/sim_speed.json) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from gpufleet.errors import UserError
from gpufleet.routing import make_policy
from gpufleet.routing.replay import ReplayRequest, ReplicaTiming, replay
from gpufleet.shared_data import shared_file
from gpufleet.sim.report import summarize
from gpufleet.sim.scenario import Scenario, build_config, build_requests
from gpufleet.sim.simulator import FleetSimulator
from gpufleet.workload import SegmentHasher

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import RESULTS, write_result


def run_engine_sim(sc: Scenario) -> dict[str, Any]:
    cfg = build_config(sc)
    reqs = build_requests(sc)
    start = time.perf_counter()
    cpu0 = time.process_time()
    result = FleetSimulator(cfg, reqs, make_policy(sc.routing, seed=sc.seed)).run()
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    s = summarize(result)
    return {
        "model": "gpufleet sim (engines)",
        "policy": sc.routing,
        "requests": len(reqs),
        "wall_s": wall,
        "cpu_s": cpu,
        "events": result.events,
        "events_per_s": result.events / wall,
        "events_per_cpu_s": result.events / cpu if cpu > 0 else 0.0,
        "virtual_s": result.end_s,
        "speedup_x": result.end_s / wall,
        "prefix_hit_rate": s["prefix_cache_hit_rate"],
        "ttft_p50_ms": s["ttft_ms"]["median"],
        "ttft_p99_ms": s["ttft_ms"]["p99"],
        "tpot_p50_ms": s["tpot_ms"]["median"],
        "preemptions": s["preemptions"],
    }


def run_replay(sc: Scenario) -> dict[str, Any]:
    cfg = build_config(sc)
    reqs = build_requests(sc)
    hasher = SegmentHasher(cfg.routing_block_tokens)
    rr = [
        ReplayRequest(r.arrival_s, tuple(hasher.hashes(r.segments)), r.output_tokens,
                      prompt_tokens=r.input_tokens)
        for r in reqs
    ]  # fmt: skip
    kv_tokens = cfg.engine.num_gpu_blocks * cfg.engine.block_size
    blocks = max(1, kv_tokens // cfg.routing_block_tokens)
    timing = ReplicaTiming(cache_blocks=blocks, block_tokens=cfg.routing_block_tokens)
    start = time.perf_counter()
    cpu0 = time.process_time()
    report = replay(make_policy(sc.routing, seed=sc.seed), rr, replicas=sc.replicas, timing=timing)
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    virtual = max((r.arrival_s for r in rr), default=0.0)
    return {
        "model": "routing.replay (engine-free)",
        "policy": sc.routing,
        "requests": len(rr),
        "wall_s": wall,
        "cpu_s": cpu,
        "events": 3 * len(rr),
        "events_per_s": 3 * len(rr) / wall if wall > 0 else 0.0,
        "events_per_cpu_s": 3 * len(rr) / cpu if cpu > 0 else 0.0,
        "virtual_s": virtual,
        "speedup_x": virtual / wall if wall > 0 else 0.0,
        "prefix_hit_rate": report.hit_rate,
        "ttft_p50_ms": report.ttft_quantile_s(0.5) * 1000,
        "ttft_p99_ms": report.ttft_quantile_s(0.99) * 1000,
        "tpot_p50_ms": timing.tpot_s * 1000,
        "preemptions": 0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--trace",
        default=None,
        help="default: $GPUFLEET_SHARED/traces/mooncake_conversation.jsonl (or sample:mooncake)",
    )
    parser.add_argument("--requests", type=int, default=None, help="First N requests only.")
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--model", default="meta-llama/Llama-3.1-8B")
    parser.add_argument("--gpu", default="h100-sxm")
    parser.add_argument("--policies", default="round_robin,prefix_aware")
    parser.add_argument(
        "--out", "--json", type=Path, default=RESULTS / "sim_speed", help="path without suffix"
    )
    args = parser.parse_args(argv)
    if args.trace is None:
        try:
            args.trace = str(shared_file("traces", "mooncake_conversation.jsonl"))
        except UserError as e:
            parser.error(str(e))

    rows = []
    for policy in args.policies.split(","):
        sc = Scenario(
            model=args.model, gpu=args.gpu, trace=args.trace, num_requests=args.requests,
            replicas=args.replicas, routing=policy,
        )  # fmt: skip
        for runner in (run_engine_sim, run_replay):
            row = runner(sc)
            rows.append(row)
            print(f"{row['model']} {policy}: {row['wall_s']:.1f} s", file=sys.stderr)
    setup = {"trace": args.trace, "replicas": args.replicas, "model": args.model, "gpu": args.gpu}
    lines = [
        f"{rows[0]['requests']} requests from {Path(args.trace).name}, {args.replicas} "
        f"replicas of {args.model} on {args.gpu}",
        "",
        "| model | policy | wall s | CPU s | events | events/CPU s | sim s / wall s | hit rate "
        "| TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | preemptions |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['policy']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | "
            f"{r['events']} | {r['events_per_cpu_s']:.0f} | {r['speedup_x']:.0f} | {r['prefix_hit_rate']:.1%} | "
            f"{r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} | {r['tpot_p50_ms']:.1f} | "
            f"{r['preemptions']} |"
        )
    json_path, _ = write_result(args.out, {"setup": setup, "rows": rows}, "\n".join(lines))
    print("\n".join(lines))
    print(f"\nJSON: {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
