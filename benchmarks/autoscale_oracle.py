"""The hindsight lower bound of the autoscaling study (issue 12): the GPU-hours of a fleet
that knows the whole arrival curve and holds, each minute, the fewest replicas that serve
that minute within the SLO, starting each replica a cold start before the minute that
needs it.

    GPUFLEET_SHARED=/work/shared python benchmarks/autoscale_oracle.py [--copies 10]
        [--sizes 5-14] [--workers 2] [--out benchmarks/results/autoscale_oracle]

How: fixed fleets of every size in `--sizes` replay the study's requests (its scenario,
`autoscale_study.base_scenario`); per minute, the sizes whose 1-minute window holds its
p90s, and how many of its requests each serves within the SLO; the schedule is the
cheapest pick of one size per minute whose requests within the SLO add up to the study's
target (99 %) plus `--margin` (`needs`). The schedule of needs is then replayed by `autoscale_study.ScheduledFleet`,
which starts replicas a cold start ahead and drains them once no minute within a cold
start needs them, to check it holds: the study's "oracle" row replays that schedule
(`autoscale_study.py` reads it from this script's JSON). Not a policy: it reads the
future. A size a minute needs is taken from a fleet that was that size all along (its
backlog from earlier minutes included), so the bound is tight only where needs change
slowly; the replay measures what it actually holds.

Beside it, the causal bound (`causal_needs`): each minute sized by the needs above of the
minute last complete when its replicas had to start, times 1 + a margin; the cheapest
margin whose requests within the SLO (as the sweep's fixed fleets served each minute)
reach the target is what the study's `causal` row replays. A policy that reads only the
past cannot know even that much (it measures the capacity as it goes).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from gpufleet.routing import make_policy as make_routing_policy
from gpufleet.sim.scenario import build_config, build_requests
from gpufleet.sim.simulator import FleetSimulator
from gpufleet.stats import percentile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import autoscale_study as study
from record import RESULTS, write_result


def per_minute(job: dict[str, Any]) -> dict[str, Any]:
    """One fixed fleet: per minute of arrivals, its requests within the SLO, its count, and
    whether the window's p90 TTFT and TPOT hold."""
    sc = job["scenario"]
    result = FleetSimulator(build_config(sc), build_requests(sc),
                            make_routing_policy(sc.routing, seed=sc.seed,
                                               **dict(sc.routing_options))).run()  # fmt: skip
    minutes: dict[int, list[Any]] = {}
    for r in result.requests:
        minutes.setdefault(int(r.arrival_s // study.WINDOW_S), []).append(r)
    out: dict[int, dict[str, Any]] = {}
    for k, reqs in minutes.items():
        good = sum(1 for r in reqs if study.within_slo(r))
        ttfts = [r.ttft_s if r.ok and r.ttft_s is not None else math.inf for r in reqs]
        tpots = [r.tpot_s for r in reqs if r.ok and r.tpot_s is not None]
        window_ok = (percentile(ttfts, 90) or 0.0) <= study.TTFT_SLO_S and (
            percentile(tpots, 90) or 0.0
        ) <= study.TPOT_SLO_S
        out[k] = {"good": good, "n": len(reqs), "window_ok": window_ok}
    return {"replicas": job["replicas"], "minutes": out}


def needs(sweep: list[dict[str, Any]], target: float) -> dict[int, int]:
    """Per minute, the fewest replicas such that every minute's window holds its p90s and
    the requests within the SLO add up to `target` of all: from the smallest size whose
    window holds, a replica at a time to the minute where it brings the most requests
    within the SLO (a marginal-gain greedy: the fleet's total is what the target is on)."""
    by_size = {s["replicas"]: s["minutes"] for s in sweep}
    sizes = sorted(by_size)
    minutes = sorted({k for s in sweep for k in s["minutes"]})

    def row(k: int, n: int) -> dict[str, Any]:
        return by_size[n].get(k) or {"good": 0, "n": 0, "window_ok": False}

    need = {k: next((n for n in sizes if row(k, n)["window_ok"]), sizes[-1]) for k in minutes}
    total = sum(row(k, sizes[-1])["n"] for k in minutes)
    good = sum(row(k, need[k])["good"] for k in minutes)
    while good < target * total:
        open_ = [k for k in minutes if need[k] < sizes[-1]]
        if not open_:
            break
        k = max(open_, key=lambda m: row(m, need[m] + 1)["good"] - row(m, need[m])["good"])
        good += row(k, need[k] + 1)["good"] - row(k, need[k])["good"]
        need[k] += 1
    return need


def causal_needs(need: dict[int, int], margin: float, seen_min: int = 1) -> dict[int, int]:
    """A causal schedule with perfect knowledge of the past: minute m holds the need of the
    last `seen_min` minutes complete when its replicas had to start (a cold start of two
    minutes before m: minutes up to m − 3) times (1 + margin). No policy knows a past
    minute's need exactly (it measures the capacity as it goes), so a causal policy's
    cost is at least this one's at the margin that holds the target."""
    lag = math.ceil(study.COLD_START_S / study.WINDOW_S) + 1
    first = min(need)
    out = {}
    for m in sorted(need):
        seen = [need[k] for k in range(m - lag - seen_min + 1, m - lag + 1) if k in need]
        out[m] = math.ceil(max(seen or [need[first]]) * (1.0 + margin))
    return out


def sweep_attainment(sweep: list[dict[str, Any]], schedule: dict[int, int]) -> float:
    """Requests within the SLO of a schedule, each minute as a fleet of its size all along
    served it (the sweep; above its largest size, as the largest)."""
    by_size = {s["replicas"]: s["minutes"] for s in sweep}
    sizes = sorted(by_size)
    good = total = 0
    for k, n in schedule.items():
        size = min(sizes[-1], max(sizes[0], n))
        row = by_size[size].get(k) or {"good": 0, "n": 0}
        good, total = good + row["good"], total + row["n"]
    return good / total if total else 0.0


def held_gpu_hours(need: dict[int, int]) -> float:
    """GPU-hours a schedule holds: replicas a cold start ahead (`ScheduledFleet`), drains not."""
    sched = study.ScheduledFleet(need, study.COLD_START_S)
    end_s = (max(need) + 1) * study.WINDOW_S
    return sum(sched.desired(float(t)) for t in range(int(end_s))) * study.TP / 3600


def causal_table(
    sweep: list[dict[str, Any]], need: dict[int, int]
) -> tuple[list[str], dict[str, Any]]:
    """The causal bound (`causal_needs`) at margins 0–40 %: the cheapest reaching the target
    by the sweep's estimate is what the study's `causal` row replays."""
    lines = ["", "Causal bound: each minute sized by the needs above of the minute last seen "
             "complete when its replicas had to start (m − 3), times 1 + margin "
             "(`causal_needs`); attainment as the sweep's fixed fleets served each minute.",
             "", "| margin | GPU-hours held | × oracle | requests within the SLO (sweep) |",
             "| --- | --- | --- | --- |"]  # fmt: skip
    oracle_h = held_gpu_hours(need)
    best: dict[str, Any] | None = None
    for pct in range(0, 45, 5):
        sched = causal_needs(need, pct / 100)
        gpu_h, att = held_gpu_hours(sched), sweep_attainment(sweep, sched)
        lines.append(f"| {pct} % | {gpu_h:.1f} | {gpu_h / oracle_h:.2f} | {att:.2%} |")
        if best is None and att >= study.TARGET:
            best = {"margin": pct / 100, "schedule_gpu_hours": gpu_h, "sweep_attainment": att,
                    "need_by_minute": {str(k): n for k, n in sorted(sched.items())}}  # fmt: skip
    return lines, best or {}


def sizes_arg(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=10)
    ap.add_argument("--start-s", type=float, default=0.0)
    ap.add_argument("--duration-s", type=float, default=None)
    ap.add_argument("--sizes", type=sizes_arg, default=sizes_arg("5-14"))
    ap.add_argument(
        "--margin",
        type=float,
        default=0.001,
        help="over the target: the replay of the schedule is not the sweep",
    )
    ap.add_argument(
        "--sweep",
        type=Path,
        default=None,
        help="reuse this script's earlier JSON (its sweep) instead of simulating",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--out", type=Path, default=RESULTS / "autoscale_oracle")
    args = ap.parse_args()
    base = study.base_scenario(args)
    if args.sweep is not None:
        sweep = [{"replicas": s["replicas"],
                  "minutes": {int(k): v for k, v in s["minutes"].items()}}
                 for s in json.loads(args.sweep.read_text())["sweep"]]  # fmt: skip
    else:
        jobs = [{"replicas": n, "scenario": base.with_field("replicas", n)} for n in args.sizes]
        with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
            sweep = list(pool.map(per_minute, jobs))
    need = needs(sweep, study.TARGET + args.margin)
    replica_s = sum(n * study.WINDOW_S for n in need.values())
    # Held GPUs by the schedule, cold starts included (drains not: the replay counts them).
    gpu_h = held_gpu_hours(need)
    lines = [f"Schedule: {gpu_h:.1f} GPU-hours held (cold starts included, drains not; the "
             "study's `oracle` row replays it).", "",
             "| minute | replicas needed |", "| --- | --- |"]  # fmt: skip
    lines += [f"| {k} | {n} |" for k, n in sorted(need.items())]
    causal_lines, causal = causal_table(sweep, need)
    lines += causal_lines
    data = {
        "setup": {"copies": args.copies, "start_s": args.start_s,
                  "duration_s": args.duration_s, "sizes": [s["replicas"] for s in sweep],
                  "target": study.TARGET, "margin": args.margin},
        "need_by_minute": {str(k): n for k, n in sorted(need.items())},
        "replica_hours_without_cold_starts": replica_s / 3600,
        "schedule_gpu_hours": gpu_h,
        "causal": causal,
        "sweep": [{"replicas": s["replicas"],
                   "minutes": {str(k): v for k, v in sorted(s["minutes"].items())}}
                  for s in sweep],
    }  # fmt: skip
    write_result(args.out, data, "\n".join(lines) + "\n")
    print(json.dumps(data["need_by_minute"]))


if __name__ == "__main__":
    main()
