"""CPU per request along one run of a `sim_speed.py` case: where a long run gets slower.

    GPUFLEET_SHARED=../shared python benchmarks/sim_speed_slope.py [--case synthetic1m] [--scale 0.3] [--parts 10]
                                         [--gpu-memory-utilization 0.9] [--drop-results]

Runs the case (compiled where `make sim-compiled` built it) on one core and prints, for
each tenth (`--parts`) of its requests, the CPU microseconds per request ended in it and
how full the replicas' KV pools are (blocks never used yet, cached runs). The 1 M
synthetic case's CPU per request rises as its 256 prefix caches fill, with the same
instructions per request: docs/sim.md "How fast it runs". `--gpu-memory-utilization`
shrinks the pools (a diagnostic: the predictions change); `--drop-results` drops the
finished requests' results as it goes (nothing reads them here), to see whether the
memory they hold costs anything. Prints each part as it ends and writes the parts'
table with `record.write_result` (`--out`, default benchmarks/results/sim_speed_slope).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

from gpufleet.native import is_compiled
from gpufleet.routing import make_policy
from gpufleet.sim.scenario import build_config, build_requests
from gpufleet.sim.simulator import FleetSimulator, Progress

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import write_result
from sim_speed import case_scenarios


def pool_fill(sim: FleetSimulator) -> tuple[float, float]:
    """(fraction of KV blocks ever used, mean cached runs) over the replicas."""
    pools = [r.engine.kv.pool for r in sim.replicas.values()]
    used = sum(1.0 - p._fresh / p.num_blocks for p in pools) / len(pools)
    return used, sum(p.num_cached_runs for p in pools) / len(pools)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", default="synthetic1m")
    parser.add_argument("--scale", type=float, default=0.3)
    parser.add_argument("--parts", type=int, default=10)
    parser.add_argument("--gpu-memory-utilization", type=float, default=None)
    parser.add_argument("--drop-results", action="store_true")
    parser.add_argument("--out", default="sim_speed_slope", help="result stem (.json, .md)")
    args = parser.parse_args()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, as sim_speed.py
    sc, special = case_scenarios(args.scale)[args.case]
    if special is not None:
        parser.error(f"{args.case} is built by sim_speed.py itself; pick a scenario case")
    if args.gpu_memory_utilization is not None:
        sc = dataclasses.replace(sc, gpu_memory_utilization=args.gpu_memory_utilization)
    reqs = build_requests(sc)
    cfg = build_config(sc)
    sim = FleetSimulator(cfg, reqs, make_policy(sc.routing, seed=sc.seed))
    print(f"{args.case} at {args.scale}: {len(reqs)} requests, {cfg.engine.num_gpu_blocks} "
          f"KV blocks a replica, compiled: {is_compiled(sys.modules[FleetSimulator.__module__])}")  # fmt: skip
    step = max(1, len(reqs) // args.parts)
    dropped = 0
    last = [time.process_time(), 0]
    parts: list[dict[str, float]] = []

    def progress(p: Progress) -> None:
        nonlocal dropped
        done = p.requests_done + dropped
        if args.drop_results:
            dropped += len(sim.clients.results)
            sim.clients.results.clear()
        if done - last[1] >= step or done == len(reqs):
            now = time.process_time()
            used, runs = pool_fill(sim)
            us = (now - last[0]) / max(1, done - last[1]) * 1e6
            print(f"requests {last[1]:>8,}-{done:<8,} {us:6.1f} CPU µs/request   KV blocks "
                  f"ever used {used:4.0%}, cached runs {runs:6.0f} a replica", flush=True)  # fmt: skip
            parts.append({"first_request": last[1], "last_request": done, "cpu_us_per_request": us,
                          "kv_blocks_ever_used": used, "cached_runs_per_replica": runs})  # fmt: skip
            last[:] = [time.process_time(), done]  # (the pools' census not counted)

    cpu0 = time.process_time()
    result = sim.run(progress)
    run_cpu_s = time.process_time() - cpu0
    print(f"run(): {run_cpu_s:.1f} CPU s, {result.events} events")
    table = "\n".join(
        ["| requests | CPU µs / request | KV blocks ever used | cached runs a replica |",
         "| --- | ---: | ---: | ---: |"]
        + [f"| {p['first_request']:,.0f}-{p['last_request']:,.0f} | {p['cpu_us_per_request']:.1f} "
           f"| {p['kv_blocks_ever_used']:.0%} | {p['cached_runs_per_replica']:.0f} |" for p in parts]
    )  # fmt: skip
    data = {"case": args.case, "scale": args.scale, "requests": len(reqs),
            "compiled": is_compiled(sys.modules[FleetSimulator.__module__]),
            "drop_results": args.drop_results, "run_cpu_s": run_cpu_s,
            "events": result.events, "parts": parts}  # fmt: skip
    for path in write_result(args.out, data, table):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
