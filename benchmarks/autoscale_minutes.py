"""Where a scaling policy loses its SLO in the autoscaling study, minute by minute: the
requests out of SLO, the TPOT / TTFT percentiles of each failing minute, and the policy's
decisions (with their reasons) in a window of the replay. A diagnostic beside
`autoscale_study.py`, on the same scenario (or, with `--ramp`, `autoscale_ramp.py`'s: its
seed is `--seed`, 1 there). Minutes are `--minute-s` long (60; the ramp's burst is 90 s).

    GPUFLEET_SHARED=/work/shared python benchmarks/autoscale_minutes.py [--policy default]
        [--static 12] [--from-s 2300] [--to-s 2850] [--copies 10]
        [--ramp] [--seed 0] [--minute-s 60] [--out benchmarks/results/autoscale_minutes]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import autoscale_ramp as ramp
import autoscale_study as study
from gpufleet.routing import make_policy as make_routing_policy
from gpufleet.sim.scenario import build_config, build_requests
from gpufleet.sim.simulator import FleetSimulator
from gpufleet.stats import percentile
from record import RESULTS, write_result

JOINED_S = 30.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="default")
    ap.add_argument("--static", type=int, default=12, help="the static fleet's size (bounds)")
    ap.add_argument("--copies", type=int, default=10)
    ap.add_argument("--from-s", type=float, default=0.0, help="decisions shown from here")
    ap.add_argument("--to-s", type=float, default=math.inf, help="... to here")
    ap.add_argument("--min-out-share", type=float, default=0.01, help="minutes shown")
    ap.add_argument("--ramp", action="store_true", help="autoscale_ramp.py's scenario")
    ap.add_argument("--seed", type=int, default=None, help="the scenario's (0; --ramp: 1)")
    ap.add_argument("--minute-s", type=float, default=study.WINDOW_S, help="rows' span")
    ap.add_argument("--prefill-weight", type=float, default=None,
                    help="least_outstanding's prefill_weight (default: the policy's, 4; 1: off)")  # fmt: skip
    ap.add_argument("--join-quiet-s", type=float, default=None,
                    help="default's capacity_join_quiet_s (default: the policy's, 60; 0: off)")  # fmt: skip
    ap.add_argument("--default-param", action="append", default=[],
                    help="one more parameter of default, KEY=VALUE (a number, or none; repeatable)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=RESULTS / "autoscale_minutes")
    args = ap.parse_args()
    if args.ramp:
        mean_in, mean_out = ramp.MEAN_IN, ramp.MEAN_OUT
        sc = ramp.base_scenario(1 if args.seed is None else args.seed,
                                prefill_weight=args.prefill_weight)  # fmt: skip
    else:
        setup = argparse.Namespace(
            copies=args.copies,
            start_s=0.0,
            duration_s=None,
            seed=args.seed or 0,
            prefill_weight=args.prefill_weight,
        )
        peak_rps, start_rps, _, mean_in, mean_out = study.arrival_profile(setup)
        initial = max(1, math.ceil(args.static * start_rps / peak_rps))
        sc = study.base_scenario(setup).with_field("replicas", initial)
        sc = sc.with_field("min_replicas", 1).with_field("max_replicas", 2 * args.static)
    capacity = study.slo_capacity(mean_in, mean_out)
    unloaded = study.unloaded_latency(mean_in, mean_out)
    params = study.policy_params(args.policy, capacity, unloaded, None, args.join_quiet_s)
    if args.policy == "default":
        params.update(study.default_params(args.default_param))
    sc = sc.with_field("autoscale", args.policy)
    sc = sc.with_field("autoscale_params", tuple(params.items()))
    result = FleetSimulator(
        build_config(sc),
        build_requests(sc),
        make_routing_policy(sc.routing, seed=sc.seed, **dict(sc.routing_options)),
    ).run()
    minutes: dict[int, tuple[list[bool], list[float], list[float]]] = {}
    # Misses on a replica that became ready (after the start) less than JOINED_S before:
    # least-outstanding routing sends it every arrival until it holds as many as the rest.
    ready_s = {p.replica_id: p.ready_s for p in result.replicas if p.ready_s}
    joined: dict[int, int] = {}
    for r in result.requests:
        m = int(r.arrival_s // args.minute_s)
        ok, tpots, ttfts = minutes.setdefault(m, ([], [], []))
        ok.append(study.within_slo(r))
        up_s = ready_s.get(r.replica_id or "")
        if not ok[-1] and up_s is not None and 0 <= r.arrival_s - up_s < JOINED_S:
            joined[m] = joined.get(m, 0) + 1
        if r.ok and r.tpot_s is not None:
            tpots.append(r.tpot_s)
        if r.ok and r.ttft_s is not None:
            ttfts.append(r.ttft_s)
    rows: list[dict[str, Any]] = []
    for m, (ok, tpots, ttfts) in sorted(minutes.items()):
        out = ok.count(False)
        if out / len(ok) > args.min_out_share:
            rows.append({"minute": m, "requests": len(ok), "out_of_slo": out,
                         "out_on_joined": joined.get(m, 0),
                         "tpot_p90_ms": (percentile(tpots, 90) or 0.0) * 1e3,
                         "tpot_p99_ms": (percentile(tpots, 99) or 0.0) * 1e3,
                         "ttft_p90_s": percentile(ttfts, 90) or 0.0})  # fmt: skip
    decisions = [
        {"at_s": d.now_s, "from": d.current_replicas, "to": d.desired_replicas,
         "reason": d.reason}
        for d in result.scaling_changes
        if args.from_s <= d.now_s <= args.to_s
    ]  # fmt: skip
    lines = ["| minute | requests | out of SLO | of them on a replica up < 30 s "
             "| TPOT p90 / p99 ms | TTFT p90 s |", "| --- | ---: | ---: | ---: | --- | ---: |"]  # fmt: skip
    lines += [f"| {r['minute']} | {r['requests']} | {r['out_of_slo']} | {r['out_on_joined']} | "
              f"{r['tpot_p90_ms']:.0f} / {r['tpot_p99_ms']:.0f} | {r['ttft_p90_s']:.2f} |"
              for r in rows]  # fmt: skip
    lines += ["", "| at s | replicas | reason |", "| ---: | --- | --- |"]
    lines += [f"| {d['at_s']:.0f} | {d['from']} → {d['to']} | {d['reason']} |" for d in decisions]
    table = "\n".join(lines)
    data = {"setup": {"policy": args.policy, "static": args.static, "copies": args.copies,
                      "ramp": args.ramp, "seed": sc.seed, "minute_s": args.minute_s,
                      **study.effective_options(args),
                      "from_s": args.from_s, "to_s": args.to_s if math.isfinite(args.to_s) else None},
            "minutes": rows, "decisions": decisions}  # fmt: skip
    write_result(args.out, data, table)
    print(table)


if __name__ == "__main__":
    main()
