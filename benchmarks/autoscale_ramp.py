"""The autoscale study's second workload: does `default` hold the SLO on a synthetic ramp
and burst, not only on the Azure trace it was studied on? (issue 12)

    python benchmarks/autoscale_ramp.py [--policies default,hpa,kpa,ray_serve,queue_depth]
        [--workers 2] [--out benchmarks/results/autoscale_ramp] [--merge]

Same model, layout, cold start, SLO, attainment and policy inputs as
`autoscale_study.py`; Poisson arrivals at 8 req/s for 5 min, a ramp to 30 over 400 s,
30 for 200 s, a burst at 45 for 90 s, a fall to 10 over 300 s and 10 for 210 s (1,500 s,
~30k requests), prompts 1,500 ± 80 % and answers 250 ± 80 % tokens; 3 replicas at first,
1..20. No trace needed.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from gpufleet.sim.scenario import Scenario
from gpufleet.workload.arrivals import RatePhase

sys.path.insert(0, str(Path(__file__).resolve().parent))
import autoscale_study as study
from record import RESULTS, write_result

PHASES = (
    RatePhase("low", 300, 8, 8),
    RatePhase("ramp", 400, 8, 30),
    RatePhase("high", 200, 30, 30),
    RatePhase("burst", 90, 45, 45),
    RatePhase("fall", 300, 30, 10),
    RatePhase("tail", 210, 10, 10),
)
MEAN_IN, MEAN_OUT = 1500, 250


def base_scenario(
    seed: int, slow_start_s: float = 0.0, prefill_weight: float | None = None
) -> Scenario:
    """The ramp's scenario, before a policy is set (also `autoscale_minutes.py --ramp`)."""
    return Scenario(
        model=study.MODEL, gpu=study.GPU, tp=study.TP, rate_steps=PHASES,
        input_tokens=MEAN_IN, output_tokens=MEAN_OUT, range_ratio=0.8,
        routing="least_outstanding", startup_s=study.COLD_START_S, drain_deadline_s=600.0,
        seed=seed, replicas=3, min_replicas=1, max_replicas=20, slow_start_s=slow_start_s,
        routing_options=study.routing_options(prefill_weight),
    )  # fmt: skip


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| policy | attainment (requests) | attainment (1-min windows) | GPU-hours | peak "
             "| scale-outs / -ins (drains taken back) | TTFT p99 s | TPOT p99 ms |", "|" + " --- |" * 8]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['attainment_requests']:.2%} | {r['attainment_windows']:.2%} "
            f"| {r['gpu_hours']:.1f} | {r['peak_replicas']} | {r['scale_outs']} / {r['scale_ins']} ({r.get('undrained', 0)}) "
            f"| {(r['ttft_p99_ms'] or 0) / 1000:.2f} | {r['tpot_p99_ms'] or 0:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default=",".join(study.POLICIES))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--slow-start-s", type=float, default=0.0,
                    help="the gateway's slow start for replicas that become ready (0: off)")  # fmt: skip
    ap.add_argument("--prefill-weight", type=float, default=None,
                    help="least_outstanding counts a request awaiting its first token this "
                         "many times (default: the policy's, 4; 1: off)")  # fmt: skip
    ap.add_argument("--join-quiet-s", type=float, default=None,
                    help="default's capacity: no bound from above this long after a join "
                         "(default: the policy's, 60; 0: off)")  # fmt: skip
    ap.add_argument("--default-param", action="append", default=[],
                    help="one more parameter of default, KEY=VALUE (a number, or none; repeatable)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=RESULTS / "autoscale_ramp")
    ap.add_argument("--merge", action="store_true",
                    help="keep the rows of --out's JSON for the policies not rerun")  # fmt: skip
    ap.add_argument("--prompt-token-weight", default=None,
                    help="default's capacity in work: 'physics' or a number (wave 13b)")  # fmt: skip
    args = ap.parse_args()
    capacity = study.slo_capacity(MEAN_IN, MEAN_OUT)
    unloaded = study.unloaded_latency(MEAN_IN, MEAN_OUT)
    weight = study.resolve_weight(args.prompt_token_weight, MEAN_IN, MEAN_OUT, capacity)
    base = base_scenario(args.seed, args.slow_start_s, args.prefill_weight)
    jobs: list[dict[str, Any]] = []
    for policy in [p.strip() for p in args.policies.split(",") if p.strip()]:
        params = study.policy_params(policy, capacity, unloaded, weight, args.join_quiet_s)
        if policy == "default":
            params.update(study.default_params(args.default_param))
        sc = base.with_field("autoscale", policy)
        jobs.append({"name": policy, "scenario": sc.with_field("autoscale_params",
                                                               tuple(params.items()))})  # fmt: skip
    rows = study.run_jobs(jobs, args.workers)
    kept = ""
    if args.merge:
        rows, kept = study.merge_rows(args.out.with_suffix(".json"), rows)
    table = markdown(rows)
    data = {"setup": {"model": study.MODEL, "gpu": study.GPU, "tp": study.TP,
                      "phases": [dataclasses.asdict(p) for p in PHASES],
                      "capacity_per_replica": capacity, "unloaded_ttft_tpot_s": unloaded,
                      "slow_start_s": args.slow_start_s,
                      **study.effective_options(args),
                      "default_params": args.default_param},
            "rows": rows}  # fmt: skip
    write_result(args.out, data, table, note=f"rows kept from {kept}" if kept else "")
    print(table)


if __name__ == "__main__":
    main()
