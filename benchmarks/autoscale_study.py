"""The study the simulator exists for: which scaling policy serves a day's traffic within
its SLO for the fewest GPU-hours? (issue 12)

    GPUFLEET_SHARED=/work/shared python benchmarks/autoscale_study.py [--copies 10]
        [--start-s 0] [--duration-s S] [--policies default,hpa,kpa,ray_serve,queue_depth]
        [--static N | --static-from JSON] [--peak-static N | --peak-search]
        [--prefill-weight W] [--join-quiet-s S]
        [--workers 2] [--out benchmarks/results/autoscale_study] [--merge]

The Azure LLM conversation trace (2023-11-16, 19,366 requests in 58 minutes, mean 1,155
prompt and 211 output tokens), Llama-3.1-70B at TP=4 on H100 (bf16), 120 s cold starts,
SLO: TTFT p90 <= 2 s and TPOT <= 100 ms. At its own rate the trace is 5.5 req/s, which one
replica almost holds (no room to scale: see the docs), so it is replayed `--copies` times
interleaved (10: 194k requests, 55 req/s on average, 85 in the busiest minute), its
bursts and lulls kept (`gpufleet.workload.tile_records`).

Every policy gets the same inputs: the per-replica capacity the planner finds for this
layout and request size within the SLO (`max_serving_concurrency_within_slo`: the most
requests in flight whose mean TTFT and TPOT meet it), `default` and `queue_depth` as
`capacity_per_replica`, the baselines' targets at 70 % of it as in `gpufleet up --demo`
(HPA and Ray Serve 0.7 x capacity; KPA capacity with its own 70 % utilization), bounds
1..2 x the static fleet, the same initial fleet, 1 s ticks. `default` also gets the SLO's
attainment (99 %: it sizes on p99 latency), the planner's unloaded TTFT and TPOT (one
request alone: where its queue model of a replica starts), and measures the capacity on
the fleet (`gpufleet.autoscale.capacity`); the planner's is only its ceiling. The initial fleet is what the
busiest minute before a cold start and a minute have passed needs (the static fleet scaled
by that minute's rate): no policy can change the fleet sooner (a replica started on the
first minute's evidence is ready a cold start later), and the replay starts from an empty
system, whose in-flight count fills up over the first seconds like a ramp.
Two static baselines, each with its `× static` column: the smallest fixed fleet, from the
planner's peak-minute estimate upwards, that reaches the attainment target over the whole
run (99 % of requests and of 1-minute windows), and the fleet sized for the peak: the
smallest that holds the target in every minute (99 % of each minute's requests within the
SLO; searched the same way from where `autoscale_oracle.py`'s sweep says every minute
holds, `peak_start`). The first meets the hour's target and misses its busiest minute's.

The `oracle` row is the hindsight lower bound (`autoscale_oracle.py`, whose schedule this
replays when its JSON is for the same slice): the fewest replicas each minute, known in
advance from fixed fleets' replays, such that the requests within the SLO reach the
target, each replica started a cold start before the minute that needs it. No policy
that reads only the past can do better by much; the ≤ 0.7 × target is measured against it.
The `causal` row replays the oracle script's causal bound: each minute sized by the needs
of the minutes already complete when its replicas had to start, plus the smallest margin
that holds the target on the sweep (`autoscale_oracle.causal_needs`): what a policy that
knew every past minute's need exactly, but not the future, would spend.

Attainment, two ways (they differ; both are reported):
  requests — the fraction of requests with TTFT <= 2 s and TPOT <= 100 ms (a failed
             request misses);
  windows  — the fraction of 1-minute windows (by arrival) whose p90 TTFT <= 2 s and
             p90 TPOT <= 100 ms (a failed request counts as an infinite TTFT).
GPU-hours: 4 GPUs x the hours each replica held them (cold starts and drains included);
cost at the catalog's H100 price.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from gpufleet.autoscale.decision import ScalingDecision
from gpufleet.autoscale.policies.default import DefaultPolicy
from gpufleet.autoscale.signals import FleetSignals
from gpufleet.plan.layout import Layout
from gpufleet.plan.perf_serving import max_serving_concurrency_within_slo, predict_serving
from gpufleet.routing import make_policy as make_routing_policy
from gpufleet.routing.simple import DEFAULT_PREFILL_WEIGHT
from gpufleet.shared_data import shared_file
from gpufleet.sim.report import summarize
from gpufleet.sim.results import SimResult
from gpufleet.sim.scenario import Scenario, build_config, build_requests
from gpufleet.sim.simulator import FleetSimulator
from gpufleet.specs import load_model
from gpufleet.specs.gpus import load_gpu
from gpufleet.stats import percentile
from gpufleet.workload import read_trace, slice_records, tile_records

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import RESULTS, write_result

MODEL, GPU, TP = "meta-llama/Llama-3.1-70B", "h100-sxm", 4
COLD_START_S = 120.0
TTFT_SLO_S, TPOT_SLO_S = 2.0, 0.100
TARGET = 0.99
WINDOW_S = 60.0
POLICIES = ("default", "hpa", "kpa", "ray_serve", "queue_depth")


def trace_file() -> Path:
    return shared_file("traces", "azure_llm_2023_conv.csv")


LAYOUT = Layout(tp=TP, pp=1, ep=1, weight_dtype="bf16", kv_dtype="bf16")


def slo_capacity(mean_in: int, mean_out: int) -> int:
    """Requests in flight one replica holds within the SLO (the planner's answer)."""
    p = max_serving_concurrency_within_slo(
        load_model(MODEL), load_gpu(GPU), LAYOUT, mean_in, mean_out, ttft_slo_s=TTFT_SLO_S,
        tpot_slo_s=TPOT_SLO_S, max_num_seqs=256,
    )  # fmt: skip
    if p is None:
        raise SystemExit("the layout cannot meet the SLO even with one request in flight")
    return p.concurrency


def unloaded_latency(mean_in: int, mean_out: int) -> tuple[float, float]:
    """(TTFT, TPOT) of one request alone on a replica (the planner's answer): where the
    default policy's capacity model starts queueing from."""
    p = predict_serving(load_model(MODEL), load_gpu(GPU), LAYOUT, mean_in, mean_out, 1,
                        max_num_seqs=256)  # fmt: skip
    return p.ttft_s, p.tpot_s


def prompt_token_weight(mean_in: int, mean_out: int, capacity: int) -> float:
    """A prompt token's cost on a replica in output tokens' (the planner's step-time
    model): prefill time per prompt token (one mean prompt alone) over decode time per
    output token at the batch the replica holds within the SLO."""
    model, gpu = load_model(MODEL), load_gpu(GPU)
    alone = predict_serving(model, gpu, LAYOUT, mean_in, mean_out, 1, max_num_seqs=256)
    full = predict_serving(model, gpu, LAYOUT, mean_in, mean_out, capacity, max_num_seqs=256)
    return (alone.ttft_s / mean_in) / (full.tpot_s / capacity)


def resolve_weight(flag: str | None, mean_in: int, mean_out: int, capacity: int) -> float | None:
    """--prompt-token-weight: None (off), 'physics' (`prompt_token_weight`) or a number."""
    if flag is None:
        return None
    if flag == "physics":
        return prompt_token_weight(mean_in, mean_out, capacity)
    return float(flag)


def policy_params(
    policy: str,
    capacity: int,
    unloaded: tuple[float, float] | None = None,
    prompt_weight: float | None = None,
    join_quiet_s: float | None = None,
) -> dict[str, Any]:
    if policy == "default":
        ttft0, tpot0 = unloaded if unloaded is not None else (None, None)
        return {"capacity_per_replica": capacity, "ttft_p90_slo_s": TTFT_SLO_S,
                "tpot_p90_slo_s": TPOT_SLO_S, "cold_start_s": COLD_START_S,
                "slo_attainment": TARGET, "capacity_source": "planner, within the SLO",
                "ttft_unloaded_s": ttft0, "tpot_unloaded_s": tpot0,
                **({"prompt_token_weight": prompt_weight} if prompt_weight else {}),
                **({"capacity_join_quiet_s": join_quiet_s} if join_quiet_s is not None else {})}  # fmt: skip
    if policy == "queue_depth":
        return {"capacity_per_replica": capacity}
    if policy == "hpa":
        return {"target_per_replica": 0.7 * capacity}
    if policy == "kpa":
        return {"target_per_replica": float(capacity)}
    return {"target_ongoing_requests": 0.7 * capacity}  # ray_serve


def within_slo(r: Any) -> bool:
    """One request met the SLO (a failed one did not)."""
    return bool(
        r.ok and r.ttft_s is not None and r.ttft_s <= TTFT_SLO_S
        and (r.tpot_s is None or r.tpot_s <= TPOT_SLO_S)
    )  # fmt: skip


def attainment(result: SimResult) -> dict[str, float]:
    reqs = result.requests
    good = sum(1 for r in reqs if within_slo(r))
    windows: dict[int, tuple[list[float], list[float]]] = {}
    for r in reqs:
        ttfts, tpots = windows.setdefault(int(r.arrival_s // WINDOW_S), ([], []))
        ttfts.append(r.ttft_s if r.ok and r.ttft_s is not None else math.inf)
        if r.ok and r.tpot_s is not None:
            tpots.append(r.tpot_s)
    ok_windows = sum(
        1 for ttfts, tpots in windows.values()
        if (percentile(ttfts, 90) or 0.0) <= TTFT_SLO_S and (percentile(tpots, 90) or 0.0) <= TPOT_SLO_S
    )  # fmt: skip
    return {"requests": good / len(reqs), "windows": ok_windows / len(windows)}


def minute_attainment(requests: list[Any]) -> dict[int, float]:
    """Per minute of arrivals, the fraction of its requests within the SLO."""
    good: dict[int, int] = {}
    total: dict[int, int] = {}
    for r in requests:
        k = int(r.arrival_s // WINDOW_S)
        total[k] = total.get(k, 0) + 1
        good[k] = good.get(k, 0) + within_slo(r)
    return {k: good.get(k, 0) / n for k, n in sorted(total.items())}


@dataclasses.dataclass(slots=True)
class ScheduledFleet:
    """Replicas by minute, known in advance: a replica starts a cold start before the
    first minute that needs it and drains when neither this minute nor any starting
    within a cold start needs it."""

    need_by_minute: dict[int, int]
    cold_start_s: float
    minute_s: float = WINDOW_S
    name: str = "oracle"

    def desired(self, now_s: float) -> int:
        first = int(now_s // self.minute_s)
        last = int((now_s + self.cold_start_s) // self.minute_s)
        return max(self.need_by_minute.get(k, 0) for k in range(first, last + 1))

    def decide(self, now_s: float, signals: FleetSignals) -> ScalingDecision:
        want = max(1, self.desired(now_s))
        return ScalingDecision(want, "schedule", self.name, now_s, signals.current_replicas)


def run_one(job: dict[str, Any]) -> dict[str, Any]:
    """One fleet (a policy, a static size, or the hindsight schedule) over the study's
    requests."""
    sc: Scenario = job["scenario"]
    config = build_config(sc)
    if job.get("schedule") is not None and config.autoscale is not None:
        oracle = ScheduledFleet(job["schedule"], COLD_START_S, name=job["name"])
        config = dataclasses.replace(
            config, autoscale=dataclasses.replace(config.autoscale, policy=oracle)
        )
    result = FleetSimulator(config, build_requests(sc),
                            make_routing_policy(sc.routing, seed=sc.seed,
                                               **dict(sc.routing_options))).run()  # fmt: skip
    s = summarize(result)
    att = attainment(result)
    ok = [r for r in result.requests if r.ok]
    per_minute: dict[int, list[float]] = {}
    for r in ok:
        if r.ttft_s is not None:
            per_minute.setdefault(int(r.arrival_s // WINDOW_S), []).append(r.ttft_s)
    by_minute = minute_attainment(result.requests)
    worst = min(by_minute, key=lambda k: (by_minute[k], k))
    return {
        "name": job["name"],
        "attainment_requests": att["requests"],
        "attainment_windows": att["windows"],
        # the worst minute's requests within the SLO (a fleet sized for the peak holds the
        # target in every minute: `peak_fleet`)
        "attainment_worst_minute": by_minute[worst],
        "worst_minute": worst,
        "gpu_hours": s["gpu_hours"],
        "cost_usd": s["cost_usd"],
        "replica_seconds": s["replica_seconds"],
        "peak_replicas": max((total for _, _, total in result.fleet_size), default=0),
        "scale_outs": sum(1 for d in result.scaling_changes if d.delta > 0),
        "scale_ins": sum(1 for d in result.scaling_changes if d.delta < 0),
        "undrained": s.get("undrained", 0),  # scale-outs served by a draining replica
        "failed": s["failed"],
        "failures": s["failures"],
        "ttft_p90_ms": s["ttft_ms"].get("p90"),
        "ttft_p99_ms": s["ttft_ms"].get("p99"),
        "tpot_p90_ms": s["tpot_ms"].get("p90"),
        "tpot_p99_ms": s["tpot_ms"].get("p99"),
        "fleet_timeline": [(t, total) for t, _, total in result.fleet_size],
        "ttft_p90_by_minute_s": {k: percentile(v, 90) for k, v in sorted(per_minute.items())},
        "sim_cpu_s": s["sim_cpu_s"],
    }


def base_scenario(args: argparse.Namespace) -> Scenario:
    return Scenario(
        model=MODEL, gpu=GPU, tp=TP, trace=str(trace_file()), trace_copies=args.copies,
        trace_start_s=args.start_s, duration_s=args.duration_s, routing="least_outstanding",
        startup_s=COLD_START_S, drain_deadline_s=600.0, seed=args.seed,
        slow_start_s=getattr(args, "slow_start_s", 0.0),
        routing_options=routing_options(getattr(args, "prefill_weight", None)),
    )  # fmt: skip


def default_params(pairs: list[str]) -> dict[str, float | None]:
    """--default-param KEY=VALUE (numbers, or none), e.g. headroom_fraction=0.2, or
    forecast_rise_z=none to turn the forecast off (on by default since wave 17)."""
    out: dict[str, float | None] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        out[key.strip()] = None if value.strip().lower() in ("none", "null") else float(value)
    return out


def routing_options(prefill_weight: float | None) -> tuple[tuple[str, Any], ...]:
    """least_outstanding's options: none when not given (the policy's default weight, 4;
    a given 1 is passed, so that it routes unweighted)."""
    return () if prefill_weight is None else (("prefill_weight", prefill_weight),)


# (a slotted dataclass: the class attribute is the slot, the default is the field's)
DEFAULT_JOIN_QUIET_S = next(
    f.default for f in dataclasses.fields(DefaultPolicy) if f.name == "capacity_join_quiet_s"
)


def effective_options(args: argparse.Namespace) -> dict[str, float]:
    """The prefill weight and join-quiet window the run used, the defaults filled in."""
    return {"prefill_weight": DEFAULT_PREFILL_WEIGHT if args.prefill_weight is None
            else args.prefill_weight,
            "join_quiet_s": DEFAULT_JOIN_QUIET_S if args.join_quiet_s is None
            else args.join_quiet_s}  # fmt: skip


def arrival_profile(args: argparse.Namespace) -> tuple[float, float, float, int, int]:
    """(busiest-minute rate, busiest rate before a cold start and a minute have passed, mean
    rate, mean in, mean out) of the slice."""
    records = tile_records(read_trace(trace_file()), args.copies)
    records = slice_records(records, start_s=args.start_s, duration_s=args.duration_s)
    per_min: dict[int, int] = {}
    for r in records:
        per_min[int(r.arrival_s // WINDOW_S)] = per_min.get(int(r.arrival_s // WINDOW_S), 0) + 1
    full = [n for k, n in per_min.items() if k < max(per_min)]  # the last minute is partial
    span_s = records[-1].arrival_s - records[0].arrival_s
    mean_in = round(sum(r.input_tokens for r in records) / len(records))
    mean_out = round(sum(r.output_tokens for r in records) / len(records))
    start = [n for k, n in per_min.items() if k * WINDOW_S < COLD_START_S + WINDOW_S]
    return (max(full) / WINDOW_S, max(start) / WINDOW_S, len(records) / span_s, mean_in,
            mean_out)  # fmt: skip


def oracle_schedules(args: argparse.Namespace) -> dict[str, dict[int, int]]:
    """The schedules `autoscale_oracle.py` found for this slice of the trace, by row name:
    `oracle` (hindsight) and `causal` (its causal bound: the needs of minutes already seen
    when a replica must start, with the margin that holds the target); none when not
    found, or found for another slice."""
    path = args.oracle
    if path is None or not path.exists():
        return {}
    data = json.loads(path.read_text())
    setup = data.get("setup", {})
    if (setup.get("copies"), setup.get("start_s"), setup.get("duration_s")) != (
        args.copies, args.start_s, args.duration_s,
    ):  # fmt: skip
        print(f"{path}: another slice of the trace; no oracle row", file=sys.stderr)
        return {}
    out = {"oracle": {int(k): int(n) for k, n in data["need_by_minute"].items()}}
    causal = data.get("causal", {}).get("need_by_minute")
    if causal:
        out["causal"] = {int(k): int(n) for k, n in causal.items()}
    return out


def run_jobs(jobs: list[dict[str, Any]], workers: int) -> list[dict[str, Any]]:
    if workers <= 1 or len(jobs) == 1:
        return [run_one(j) for j in jobs]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(run_one, jobs))


def meets_overall(r: dict[str, Any]) -> bool:
    """The target on both measures over the whole run (99 % of requests and of windows)."""
    return min(r["attainment_requests"], r["attainment_windows"]) >= TARGET


def meets_every_minute(r: dict[str, Any]) -> bool:
    """The target in every minute: a fleet sized for the peak minute."""
    return bool(r["attainment_worst_minute"] >= TARGET)


def static_fleet(
    base: Scenario,
    start_n: int,
    workers: int,
    meets: Callable[[dict[str, Any]], bool] = meets_overall,
    tried: dict[int, dict[str, Any]] | None = None,
) -> tuple[dict[str, Any], list[Any]]:
    """The smallest fixed fleet that `meets` the target, searched from `start_n` (and one
    below, to show it is the smallest); `tried`: sizes already run (shared by searches)."""
    tried = {} if tried is None else tried
    n = start_n
    while True:
        sizes = [m for m in (n - 1, n) if m >= 1 and m not in tried]
        jobs = [{"name": f"static {m}", "scenario": base.with_field("replicas", m)} for m in sizes]
        for m, r in zip(sizes, run_jobs(jobs, workers), strict=True):
            tried[m] = r
            print(f"  static {m}: attainment {r['attainment_requests']:.4f} requests, "
                  f"{r['attainment_windows']:.4f} windows, worst minute "
                  f"{r['attainment_worst_minute']:.4f} ({r['worst_minute']})",
                  file=sys.stderr)  # fmt: skip
        if meets(tried[n]) and (n - 1 < 1 or not meets(tried[n - 1])):
            return tried[n], sorted(tried.items())
        n = n - 1 if meets(tried[n]) else n + 1


def peak_start(args: argparse.Namespace, n_static: int) -> int:
    """Where the search for the fleet sized for the peak starts: the smallest size of the
    oracle's sweep (`autoscale_oracle.py`, same slice) whose every minute holds the target
    (one above its largest when none does); without the sweep, the static fleet."""
    path = args.oracle
    if path is None or not path.exists():
        return n_static
    data = json.loads(path.read_text())
    setup = data.get("setup", {})
    if (setup.get("copies"), setup.get("start_s"), setup.get("duration_s")) != (
        args.copies, args.start_s, args.duration_s,
    ):  # fmt: skip
        return n_static
    worst = {s["replicas"]: min(m["good"] / m["n"] for m in s["minutes"].values() if m["n"])
             for s in data.get("sweep", [])}  # fmt: skip
    if not worst:
        return n_static
    holding = [n for n, w in sorted(worst.items()) if w >= TARGET]
    return max(n_static, holding[0] if holding else max(worst) + 1)


def merge_rows(previous: Path, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """The rows just run, and in their old places, a previous run's rows for the fleets not
    rerun (`--merge`), with which commit and fleets those were ('' when none)."""
    if not previous.exists():
        return rows, ""
    old = json.loads(previous.read_text())
    new = {r["name"]: r for r in rows}
    merged = [new.pop(r["name"], r) for r in old.get("rows", [])] + list(new.values())
    kept = [r["name"] for r in merged if r not in rows]
    if not kept:
        return merged, ""
    commit = str(old.get("meta", {}).get("commit", "?"))[:12]
    return merged, f"commit {commit} ({', '.join(kept)})"


def static_label(r: dict[str, Any], every_minute: bool) -> str:
    what = "every minute ≥ 99 %: sized for the peak" if every_minute else "99 % of requests"
    return f"{r['name']} ({what})"


def markdown(
    rows: list[dict[str, Any]], static: dict[str, Any], peak: dict[str, Any] | None
) -> str:
    """The table: each fleet's GPU-hours against both static baselines — the smallest
    fixed fleet meeting 99 % of all requests, and the smallest meeting 99 % in every
    minute (the fleet sized for the peak; '—' when not run)."""
    head = ("| fleet | attainment (requests) | attainment (1-min windows) | worst minute "
            "| GPU-hours | × static (99 % of requests) | × static (every minute: peak) "
            "| cost $ | peak | scale-outs / -ins (drains taken back) | TTFT p90 / p99 s | TPOT p90 / p99 ms | failed |\n"
            "|" + " --- |" * 13 + "\n")  # fmt: skip
    lines = []
    statics = [(static, static_label(static, False))]
    if peak is not None:
        statics.append((peak, static_label(peak, True)))
    for r, name in [*statics, *((r, r["name"]) for r in rows)]:
        worst = r.get("attainment_worst_minute")
        worst_s = f"{worst:.2%} (min {r['worst_minute']})" if worst is not None else "—"
        x_peak = f"{r['gpu_hours'] / peak['gpu_hours']:.2f}" if peak is not None else "—"
        lines.append(
            f"| {name} | {r['attainment_requests']:.2%} | {r['attainment_windows']:.2%} "
            f"| {worst_s} | {r['gpu_hours']:.1f} | {r['gpu_hours'] / static['gpu_hours']:.2f} "
            f"| {x_peak} "
            f"| {r['cost_usd']:.0f} | {r['peak_replicas']} | {r['scale_outs']} / {r['scale_ins']} ({r.get('undrained', 0)}) "
            f"| {(r['ttft_p90_ms'] or 0) / 1000:.2f} / {(r['ttft_p99_ms'] or 0) / 1000:.2f} "
            f"| {r['tpot_p90_ms'] or 0:.0f} / {r['tpot_p99_ms'] or 0:.0f} | {r['failed']} |"
        )
    return head + "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], statics: list[dict[str, Any]], path: Path) -> None:
    """Replicas and TTFT p90 (per minute of arrivals) over time, one line per fleet."""
    from gpufleet.report.plots import pyplot

    plt = pyplot("--png")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 8), sharex=True)
    for r in [*statics, *rows]:
        ts, ns = zip(*r["fleet_timeline"], strict=True)
        top.step([t / 60 for t in ts], ns, where="post", label=r["name"], linewidth=1.5)
        # int keys as run, str keys as read back from JSON (`--merge`)
        by_minute = {int(k): v for k, v in r["ttft_p90_by_minute_s"].items()}
        minutes = sorted(by_minute)
        bottom.plot([m + 0.5 for m in minutes], [by_minute[m] for m in minutes], marker=".",
                    label=r["name"])  # fmt: skip
    bottom.axhline(TTFT_SLO_S, color="red", linestyle="--", label="SLO: TTFT p90 2 s")
    bottom.set_yscale("log")
    top.set_ylabel("replicas holding GPUs (TP=4)")
    top.set_title("Azure conversation trace ×10, Llama-3.1-70B TP=4 on H100, 120 s cold starts")
    bottom.set_ylabel("TTFT p90 per minute (s)")
    bottom.set_xlabel("minutes")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=10)
    ap.add_argument("--start-s", type=float, default=0.0)
    ap.add_argument("--duration-s", type=float, default=None)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--static", type=int, default=None,
                    help="skip the search: this size (and the peak's, unless --peak-static)")  # fmt: skip
    ap.add_argument("--static-from", type=Path, default=None,
                    help="take the static row from this earlier run's JSON (same slice and "
                         "routing: the autoscaler does not change it)")  # fmt: skip
    ap.add_argument("--peak-static", type=int, default=None,
                    help="the fleet sized for the peak minute: skip its search, this size")  # fmt: skip
    ap.add_argument("--peak-search", action="store_true",
                    help="with --static: still search the fleet sized for the peak")  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--slow-start-s", type=float, default=0.0,
                    help="the gateway's slow start for replicas that become ready (0: off)")  # fmt: skip
    ap.add_argument("--prefill-weight", type=float, default=None,
                    help="least_outstanding counts a request awaiting its first token this "
                         "many times (default: the policy's, 4; 1: off; routing.simple._loads)")  # fmt: skip
    ap.add_argument("--join-quiet-s", type=float, default=None,
                    help="default's capacity takes no bound from above this long after a "
                         "replica joins (default: the policy's, 60; 0: off; "
                         "SloCapacity.join_quiet_s)")  # fmt: skip
    ap.add_argument("--default-param", action="append", default=[],
                    help="one more parameter of default, KEY=VALUE (a number, or none; repeatable)")  # fmt: skip
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--out", type=Path, default=RESULTS / "autoscale_study")
    ap.add_argument("--oracle", type=Path, default=RESULTS / "autoscale_oracle.json",
                    help="the hindsight schedule (autoscale_oracle.py) to replay as a row")  # fmt: skip
    ap.add_argument("--merge", action="store_true",
                    help="keep the rows of --out's JSON for the fleets not rerun (their "
                         "commit is noted)")  # fmt: skip
    ap.add_argument("--prompt-token-weight", default=None,
                    help="default's capacity in work: 'physics' (the step-time model's "
                         "prompt/output token cost) or a number (docs/up.md, wave 13b)")  # fmt: skip
    args = ap.parse_args()
    peak_rps, start_rps, mean_rps, mean_in, mean_out = arrival_profile(args)
    capacity = slo_capacity(mean_in, mean_out)
    weight = resolve_weight(args.prompt_token_weight, mean_in, mean_out, capacity)
    # Little's law: requests in flight = rate x time in the system (prefill + decode at
    # the SLO's TPOT, an upper bound), per replica holding `capacity`.
    per_replica_rps = capacity / (mean_out * TPOT_SLO_S)
    planned = math.ceil(peak_rps / per_replica_rps)
    print(f"capacity {capacity} in flight/replica (~{per_replica_rps:.1f} req/s); busiest minute "
          f"{peak_rps:.1f} req/s -> {planned} replicas", file=sys.stderr)  # fmt: skip
    base = base_scenario(args)
    if args.static_from is not None:  # the static row of an earlier run, not run again
        static, tried = json.loads(args.static_from.read_text())["static"], []
    elif args.static is not None:
        job = {
            "name": f"static {args.static}",
            "scenario": base.with_field("replicas", args.static),
        }
        static, tried = run_jobs([job], 1)[0], []
    else:
        static, tried = static_fleet(base, planned, args.workers)
    n_static = int(static["name"].split()[1])
    peak: dict[str, Any] | None = None
    if args.peak_static is not None:
        job = {"name": f"static {args.peak_static}",
               "scenario": base.with_field("replicas", args.peak_static)}  # fmt: skip
        peak = run_jobs([job], 1)[0]
    elif (args.static is None and args.static_from is None) or args.peak_search:
        known = dict(tried) if tried else {n_static: static}
        peak, tried = static_fleet(base, peak_start(args, n_static), args.workers,
                                   meets_every_minute, known)  # fmt: skip
    initial = max(1, math.ceil(n_static * start_rps / peak_rps))
    jobs = []
    for policy in [p.strip() for p in args.policies.split(",") if p.strip()]:
        sc = base.with_field("autoscale", policy).with_field("replicas", initial)
        sc = sc.with_field("min_replicas", 1).with_field("max_replicas", 2 * n_static)
        params = policy_params(policy, capacity, unloaded_latency(mean_in, mean_out), weight,
                               args.join_quiet_s)  # fmt: skip
        if policy == "default":
            params.update(default_params(args.default_param))
        sc = sc.with_field("autoscale_params", tuple(params.items()))
        jobs.append({"name": policy, "scenario": sc})
    for name, schedule in oracle_schedules(args).items():
        sc = jobs[0]["scenario"] if jobs else base.with_field("autoscale", "default")
        first = ScheduledFleet(schedule, COLD_START_S).desired(0.0)
        sc = sc.with_field("replicas", max(1, first)).with_field("max_replicas", 4 * n_static)
        jobs.append({"name": name, "scenario": sc, "schedule": schedule})
    rows = run_jobs(jobs, args.workers)
    note = ""
    if args.merge:
        rows, kept = merge_rows(args.out.with_suffix(".json"), rows)
        note = f"; rows kept from {kept}" if kept else ""
    if peak is None and args.merge and args.out.with_suffix(".json").exists():
        # --static without --peak-static: the previous run's fleet sized for the peak stands.
        peak = json.loads(args.out.with_suffix(".json").read_text()).get("static_peak")
        if peak is not None:
            note += f"; the fleet sized for the peak ({peak['name']}) kept from the previous run"
    table = markdown(rows, static, peak)
    png = args.out.with_suffix(".png")
    plot(rows, [static] + ([peak] if peak is not None and peak is not static else []), png)
    data = {
        "setup": {"model": MODEL, "gpu": GPU, "tp": TP, "copies": args.copies,
                  "start_s": args.start_s, "duration_s": args.duration_s,
                  "cold_start_s": COLD_START_S, "ttft_p90_slo_s": TTFT_SLO_S,
                  "tpot_slo_s": TPOT_SLO_S, "capacity_per_replica": capacity,
                  "busiest_minute_rps": peak_rps, "mean_rps": mean_rps,
                  "initial_replicas": initial, "planned_static": planned,
                  "slow_start_s": args.slow_start_s, **effective_options(args),
                  "default_params": args.default_param},
        "static": static, "static_peak": peak, "static_tried": {str(n): {k: v for k, v in r.items() if k not in (
            "fleet_timeline", "ttft_p90_by_minute_s")} for n, r in tried},
        "rows": rows,
    }  # fmt: skip
    searched = args.static is None and args.static_from is None
    if args.merge and not searched and args.out.with_suffix(".json").exists():
        # --static skipped the search: the previous run's sizes tried still stand beside
        # those run now.
        previous = json.loads(args.out.with_suffix(".json").read_text())
        data["static_tried"] = {**previous.get("static_tried", {}), **data["static_tried"]}
    write_result(args.out, data, table, note=f"PNG: {png.name}{note}")
    print(table)


if __name__ == "__main__":
    main()
