#!/usr/bin/env python3
"""LoRA routing: adapter-affine routing against adapter-blind routing on the same trace.

    .venv/bin/python benchmarks/lora_routing.py [--sim-only] [--live-only]

Policies compared: `lora_affinity` (over least_outstanding), `round_robin`,
`least_outstanding`. Two parts:

- **sim** (at scale): `gpufleet sim`'s scenario, 16 replicas of Llama-3.1-8B on H100,
  Zipf(1.0) popularity over 128 adapters, `--max-loras 4`, open loop; the same requests
  for every policy.
- **live** (a few replicas): 3 real `gpufleet replica --enable-lora --max-loras 2`
  processes with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True behind the gateway (in-process,
  the same code as `gpufleet gateway`), 16 adapters declared in the config and loaded
  nowhere, Zipf(1.0) requests sent open loop and streamed; TTFT measured by the client,
  adapter loads from the gateway.

Per policy: TTFT p50/p99 (ms), adapter loads by the gateway per minute, GPU slot hit rate
(sim). Writes benchmarks/results/lora_routing.json and .md.
Live TTFTs include this machine's CPU contention: compare policies within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from gpufleet.gateway.config import validate_config
from gpufleet.gateway.server import Gateway
from gpufleet.replica.testing import DEFAULT_MODEL, ReplicaProcess
from gpufleet.routing.types import ReplicaState
from gpufleet.sim.scenario import Scenario, run_scenario
from gpufleet.workload import AdapterPopularity

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import write_result

POLICIES = ("lora_affinity", "round_robin", "least_outstanding")


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


# -- sim ------------------------------------------------------------------------------------
def run_sim(requests: int) -> list[dict[str, Any]]:
    base = Scenario(
        num_requests=requests, rate=60.0, input_tokens=512, output_tokens=128,
        range_ratio=0.5, replicas=16, lora_adapters=128, lora_zipf=1.0, max_loras=4, seed=1,
    )  # fmt: skip
    rows = []
    for policy in POLICIES:
        s = run_scenario(base.with_field("routing", policy))
        lo = s["lora"]
        rows.append({
            "part": "sim", "policy": policy, "completed": s["completed"],
            "ttft_p50_ms": s["ttft_ms"]["median"], "ttft_p99_ms": s["ttft_ms"]["p99"],
            "adapter_loads_per_min": lo["adapter_loads_per_min"],
            "gpu_slot_hit_rate": lo["gpu_slot_hit_rate"], "disk_loads": lo["disk_loads"],
        })  # fmt: skip
        print(rows[-1], file=sys.stderr)
    return rows


# -- live -----------------------------------------------------------------------------------
async def one(s: aiohttp.ClientSession, url: str, model: str, delay_s: float) -> float | None:
    await asyncio.sleep(delay_s)
    body = {"model": model, "prompt": "summarize the table " * 20, "max_tokens": 32,
            "stream": True}  # fmt: skip
    t0 = time.perf_counter()
    async with s.post(url + "/v1/completions", json=body) as r:
        if r.status != 200:
            return None
        async for _ in r.content:
            return time.perf_counter() - t0
    return None


async def run_live_policy(policy: str, n: int, rate: float) -> dict[str, Any]:
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    args = ("--step-time", "base_s=0.01,per_token_s=2e-5", "--enable-lora", "--max-loras", "2")
    pop = AdapterPopularity(16, 1.0, seed=2)
    reps: list[ReplicaProcess] = []
    try:
        for _ in range(3):
            reps.append(ReplicaProcess(*args, env=env))
        cfg = validate_config({
            "replicas": [{"url": r.url, "id": f"r{i}"} for i, r in enumerate(reps)],
            "models": [DEFAULT_MODEL], "policy": policy, "scrape_interval_s": 0.5,
            "adapters": [{"name": a, "path": f"org/{a}"} for a in pop.names()],
        })  # fmt: skip
        gw = Gateway(cfg)
        await gw.start("127.0.0.1", 0)
        try:
            while not all(r.state is ReplicaState.READY for r in gw.replicas):
                await asyncio.sleep(0.05)
            rng = random.Random(3)
            draws = pop.draws()
            t, plan = 0.0, []
            for _ in range(n):
                t += rng.expovariate(rate)
                plan.append((t, next(draws) or DEFAULT_MODEL))
            t0 = time.perf_counter()
            async with aiohttp.ClientSession() as s:
                ttfts = await asyncio.gather(*(one(s, gw.url, m, d) for d, m in plan))
            span_s = time.perf_counter() - t0
            loads = sum(r.adapter_loads for r in gw.replicas)
        finally:
            await gw.stop()
    finally:
        for r in reps:
            r.close()
    ok = [x for x in ttfts if x is not None]
    return {
        "part": "live", "policy": policy, "completed": len(ok),
        "ttft_p50_ms": 1e3 * quantile(ok, 0.5), "ttft_p99_ms": 1e3 * quantile(ok, 0.99),
        "adapter_loads_per_min": 60.0 * loads / span_s, "adapter_loads": loads,
    }  # fmt: skip


def markdown(rows: list[dict[str, Any]]) -> str:
    out = ["| part | policy | completed | TTFT p50 (ms) | TTFT p99 (ms) | adapter loads/min "
           "| GPU slot hit rate |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        hit = f"{r['gpu_slot_hit_rate']:.1%}" if "gpu_slot_hit_rate" in r else "-"
        out.append(f"| {r['part']} | {r['policy']} | {r['completed']} | {r['ttft_p50_ms']:.1f} "
                   f"| {r['ttft_p99_ms']:.1f} | {r['adapter_loads_per_min']:.1f} | {hit} |")  # fmt: skip
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--sim-only", action="store_true")
    ap.add_argument("--live-only", action="store_true")
    ap.add_argument("--sim-requests", type=int, default=20_000)
    ap.add_argument("--live-requests", type=int, default=300)
    ap.add_argument("--live-rate", type=float, default=20.0)
    a = ap.parse_args()
    rows: list[dict[str, Any]] = []
    if not a.live_only:
        rows += run_sim(a.sim_requests)
    if not a.sim_only:
        for policy in POLICIES:
            rows.append(asyncio.run(run_live_policy(policy, a.live_requests, a.live_rate)))
            print(rows[-1], file=sys.stderr)
    table = markdown(rows)
    write_result("lora_routing", {"rows": rows}, table)
    print(table)


if __name__ == "__main__":
    main()
