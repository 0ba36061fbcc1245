"""Scaling policies side by side on the same live fleet and the same traffic (issue 5).

    python benchmarks/autoscale_policies.py [--policies default,hpa,kpa,ray_serve,queue_depth]
        [--json FILE] [--md FILE] [--seed 0]

For each policy, in one run: start a fresh fleet (simulated Llama-3.1-8B replicas with an
8-sequence batch, time slowed 3×, 8 s cold starts, 1–6 replicas, the real gateway with
prefix_aware routing), wait for the first replica, play the same seeded traffic (quiet,
ramp, burst, quiet; 2 minutes), and record what clients saw (TTFT/TPOT percentiles, errors)
and what the fleet cost (replica-seconds, against holding the peak the whole time).

The baselines are gpufleet's faithful re-implementations of Kubernetes HPA v2, Knative KPA
and Ray Serve's default policy with their published defaults (stabilization and delay
windows); their targets are set alike for fairness: 70 % of the 8-sequence batch per
replica (HPA 5.6 requests; KPA 8 × its default 70 % utilization; Ray Serve
target_ongoing_requests 5.6). The systems themselves need a cluster and are not run.

On a shared 2-core machine the replicas, gateway and load generator share the CPU: TTFT
tails include that contention, equally for every policy; replica-seconds do not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console

from gpufleet.fleet.config import validate_fleet
from gpufleet.fleet.demo import demo_fleet_data
from gpufleet.fleet.run import run_up
from gpufleet.workload import RatePhase

PHASES = (
    RatePhase("quiet", 10.0, 1.0, 1.0),
    RatePhase("ramp", 30.0, 1.0, 12.0),
    RatePhase("burst", 20.0, 15.0, 15.0),
    RatePhase("quiet", 60.0, 1.0, 1.0),
)
sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import RESULTS, write_result  # noqa: E402


def fleet_for(policy: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(json.dumps(demo_fleet_data(policy)))
    data["gateway"]["port"] = 0  # the demo's routing options kept
    return data


async def one(policy: str, seed: int) -> dict[str, Any]:
    cfg = validate_fleet(fleet_for(policy), source=f"{policy} fleet")
    console = Console(file=sys.stderr, force_terminal=False)
    stop = asyncio.Event()
    summary = await run_up(
        cfg, demo=True, stop=stop, console=console, port=0, phases=PHASES, seed=seed
    )
    assert summary is not None
    return {"policy": policy, **summary.to_json()}


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v * 1000:.0f}"


def markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| policy | requests | errors | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | TPOT p90 ms "
        "| scale-outs | scale-ins | cut | peak | replica-s | used / static peak |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    )
    lines = [
        f"| {r['policy']} | {r['requests']} | {r['errors']} | {_ms(r['ttft_p50_s'])} "
        f"| {_ms(r['ttft_p90_s'])} | {_ms(r['ttft_p99_s'])} | {_ms(r['tpot_p90_s'])} "
        f"| {r['scale_outs']} | {r['scale_ins']} | {r['cut_by_scale_in']} | {r['peak_replicas']} "
        f"| {r['replica_seconds']:.0f} | {r['replica_seconds'] / max(1e-9, r['static_peak_replica_seconds']):.0%} |"
        for r in rows
    ]
    return head + "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="default,hpa,kpa,ray_serve,queue_depth")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--out", type=Path, default=RESULTS / "autoscale_policies", help="path without suffix"
    )
    args = ap.parse_args()
    rows = []
    for policy in args.policies.split(","):
        print(f"running {policy} …", file=sys.stderr)
        rows.append(asyncio.run(one(policy.strip(), args.seed)))
    table = markdown(rows)
    write_result(args.out, {"phases": [asdict(p) for p in PHASES], "rows": rows}, table)
    print(table)


if __name__ == "__main__":
    main()
