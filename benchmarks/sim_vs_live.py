"""Does the simulator predict the live fleet? The same seeded workload through `gpufleet up`
in real time and through `gpufleet sim` on a virtual clock (issue 12).

    python benchmarks/sim_vs_live.py [--repeats 3] [--seed 0] [--time-scale 6] [--stretch 1.5]
        [--policy default] [--out benchmarks/results/sim_vs_live] [--raw]

The fleet: simulated Llama-3.1-8B replicas (h100-sxm, 8-sequence batch, time slowed
`--time-scale`×, 8 s cold starts), 3 to 6 under the demo's `default` policy, the real
gateway with prefix_aware routing. The workload: a ramp and a burst of streamed chat
requests on six ~500-token system prompts, 64 output tokens, Poisson arrivals, one seed.

Live: `gpufleet up` (gateway, autoscaler and controller in this process, replicas as child
processes); traffic starts once the initial replicas are ready. The load generator runs in
a process of its own (live_client.py), as a real user's client does (in one process with
the gateway, one event loop on 2 cores woke 0.3-0.8 s late at p99: -41..-53 % of TTFT that
no fleet has). Simulated: the same request shapes and arrival times, the same layout (its
step times slowed by the same factor), the same policy objects and parameters, the same
gateway settings, and the router given each prompt's prefix hashes as the live gateway
computes them from the very text sent (`GatewayHashes`, `block_tokens`: the replicas'
words are ~6.7 bytes a token, not the ~4 of English). The simulator's cold start is what
a live replica really takes from spawn to ready here (process start, imports,
`--startup-s`, the actuator's health poll), measured in each live run: real behaviour,
not a fitted knob.

Beside the table, per live run, where the TTFT goes (live_probes.py): the mean over every
request at the client, gateway, replicas and engines, each process's CPU seconds, how late
the event loops woke, and the machine's load average. `--time-scale` 6 leaves the fleet's
own processes ~12 % of one core here, enough on 2 cores while other jobs leave one free
(load <= ~3); a busier machine needs a larger scale (rates x 3 / scale).

    python benchmarks/sim_vs_live.py --repeats 3    # the committed result; ~11 min

`--raw` writes every request of each run under benchmarks/results/raw/sim_vs_live/ (git
ignores it; the n-th request sent is the simulator's n-th arrival).

Agreement (`gpufleet.sim.agreement`, wave 19): TTFT and TPOT p50/p90/p99 of every request
of every run pooled, the simulator's within 10 % of live's, or the share of live requests
within the simulator's pNN NN % within 2 standard errors (live varies run to run, most
where a figure sits on a knee), scale-outs and scale-ins within ±1, the same requests cut
(0). The live side repeats `--repeats` times; the simulator is deterministic per seed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpufleet.fleet.config import FleetConfig, validate_fleet
from gpufleet.fleet.demo import demo_fleet_data
from gpufleet.fleet.run import fleet_up
from gpufleet.fleet.traffic import RequestResult, demo_workload
from gpufleet.gateway.cadence import SCRAPE_AFTER_TICK_S
from gpufleet.routing import make_policy as make_routing_policy
from gpufleet.routing.prefix import ROUTING_BLOCK_BYTES, prompt_text, request_prefix_hashes
from gpufleet.routing.prefix_aware import PrefixAware
from gpufleet.routing.types import ReplicaState, ReplicaView, RequestInfo, RoutingPolicy
from gpufleet.sim.agreement import TOLERANCE, Z, compare_figures, compare_requests
from gpufleet.sim.report import summarize
from gpufleet.sim.scenario import Scenario, build_config
from gpufleet.sim.simulator import FleetSimulator
from gpufleet.stats import percentiles
from gpufleet.workload import RatePhase, sim_requests, synthetic_shapes, text_conversations

sys.path.insert(0, str(Path(__file__).resolve().parent))
from live_client import cpu_s, loop_lag
from live_probes import FleetProbe, measure_overhead
from record import RAW, RESULTS, write_result

# At time scale 3 (the demo's); `phases()` scales the rates (x 3 / scale) and stretches.
BASE_PHASES = (
    RatePhase("quiet", 15.0, 2.0, 2.0),
    RatePhase("ramp", 30.0, 2.0, 12.0),
    RatePhase("burst", 20.0, 15.0, 15.0),
    RatePhase("quiet", 45.0, 2.0, 2.0),
)


def phases(time_scale: float, stretch: float) -> tuple[RatePhase, ...]:
    k = 3.0 / time_scale
    return tuple(
        RatePhase(p.name, p.duration_s * stretch, p.start_rps * k, p.end_rps * k)
        for p in BASE_PHASES
    )


MIN_REPLICAS, MAX_REPLICAS, STARTUP_S = 3, 6, 8.0
PCTS = (50, 90, 99)


def fleet_config(
    policy: str,
    time_scale: float,
    min_replicas: int = MIN_REPLICAS,
    max_replicas: int = MAX_REPLICAS,
) -> FleetConfig:
    data: dict[str, Any] = json.loads(json.dumps(demo_fleet_data(policy)))
    data["replicas"].update(time_scale=time_scale, startup_s=STARTUP_S)
    data["autoscale"].update(min_replicas=min_replicas, max_replicas=max_replicas)
    data["gateway"] = {"port": 0}
    return validate_fleet(data, source="sim_vs_live fleet")


def figures(
    plan: tuple[RatePhase, ...],
    points: list[tuple[float, float | None, float | None]],
    requests: int,
    changes: list[tuple[float, int, int, str]],
    cut: int,
    undrained: int = 0,
) -> dict[str, Any]:
    """What both sides report: (sent, TTFT, TPOT) of each completed request, and the
    scaling changes (t, from, to, why) since the traffic began."""
    out: dict[str, Any] = {"requests": requests, "errors": requests - len(points)}
    out["requests_ms"] = {}  # every request's, for the pooled comparison (`compare`)
    for i, name in ((1, "ttft"), (2, "tpot")):
        values = [v for pt in points if (v := pt[i]) is not None]
        out["requests_ms"][name] = [round(v * 1000, 2) for v in values]
        got = percentiles(values, PCTS) or [None] * len(PCTS)
        for p, v in zip(PCTS, got, strict=True):
            out[f"{name}_p{p}_ms"] = None if v is None else v * 1000
    by_phase, t = {}, 0.0
    for i, phase in enumerate(plan):
        ttfts = [v for sent, v, _ in points if t <= sent < t + phase.duration_s and v is not None]
        got = percentiles(ttfts, (50, 90)) or [None, None]
        by_phase[f"{i}:{phase.name}"] = [None if v is None else round(v * 1000, 1) for v in got]
        t += phase.duration_s
    out["ttft_by_phase_p50_p90_ms"] = by_phase
    ttfts = [v for _, v, _ in points if v is not None]
    out["ttft_mean_ms"] = 1000 * sum(ttfts) / max(1, len(ttfts))
    out["scale_outs"] = sum(1 for _, a, b, _ in changes if b > a)
    out["scale_ins"] = sum(1 for _, a, b, _ in changes if b < a)
    out["cut"] = cut
    out["undrained"] = undrained  # scale-outs served by taking back a draining replica
    out["changes"] = [(round(t, 1), a, b, why) for t, a, b, why in changes]
    return out


CLIENT = Path(__file__).resolve().parent / "live_client.py"


async def client_process(run: Any, model: str, plan: tuple[RatePhase, ...], seed: int,
                         out: Path) -> tuple[asyncio.subprocess.Process, float]:  # fmt: skip
    """Start the load generator in its own process; (it, its t0 on time.monotonic())."""
    phases_json = json.dumps([dataclasses.asdict(p) for p in plan])
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(CLIENT), run.url, model, "--phases", phases_json,
        "--seed", str(seed), "--out", str(out), stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    line = await proc.stdout.readline()
    if not line.startswith(b"t0 "):
        raise RuntimeError(f"the load generator did not start: {line!r}")
    return proc, float(line.split()[1])


async def live_once(
    cfg: FleetConfig, plan: tuple[RatePhase, ...], seed: int, raw: Path | None = None
) -> dict[str, Any]:
    clock = time.monotonic
    load_at_start = os.getloadavg()[0]
    async with fleet_up(cfg, port=0) as run:
        deadline = clock() + 180.0
        initial = cfg.autoscale.min_replicas
        while sum(m.state is ReplicaState.READY for m in run.actuator.list()) < initial:
            if clock() > deadline:
                raise RuntimeError("the initial replicas did not become ready in 180 s")
            await asyncio.sleep(0.1)
        initial_cold_start_s = run.actuator.observed_cold_start_s()
        before = len(run.changes)
        with tempfile.TemporaryDirectory(prefix="sim_vs_live-") as tmp:
            log_path = Path(tmp) / "client.json"
            client, t0 = await client_process(run, cfg.replicas.model, plan, seed, log_path)
            loop, probe, cpu0 = asyncio.get_running_loop(), FleetProbe(run), cpu_s()
            sampling = loop.create_task(probe.sample())
            lag = loop.create_task(loop_lag(plan, t0))
            if await client.wait() != 0:
                raise RuntimeError(f"the load generator failed ({client.returncode})")
            got = json.loads(log_path.read_text())
            if raw is not None:  # every request, for pairing with the simulator's (`--raw`)
                raw.write_text(json.dumps(got["results"]))
        probe.stop.set()
        await sampling
        cpu = {"gateway": cpu_s() - cpu0, "replicas": probe.added().get("cpu_s", 0.0),
               "client": got["cpu_s"]}  # fmt: skip
        changes = [(d.now_s - t0, d.current_replicas, d.desired_replicas, d.reason)
                   for d in run.changes[before:]]  # fmt: skip
        cold_start_s = run.actuator.observed_cold_start_s()
        cut, undrained = run.cut_requests, run.undrained
        # The fleet is quiet again: measure what the HTTP path adds to one request.
        overhead_s = await measure_overhead(run, cfg.replicas.model, seed)
        lag_ms = await lag
    results = [RequestResult(**r) for r in got["results"]]
    points = [(r.sent_s, r.ttft_s, r.tpot_s) for r in results if r.ok]
    out = figures(plan, points, len(results), changes, cut, undrained)
    ttft_split = {"client_ms": out["ttft_mean_ms"], "client_n": len(points), **probe.ttft_ms()}
    return {**out, "engine_tokens": probe.tokens(), "cold_start_s": cold_start_s,
            "initial_cold_start_s": initial_cold_start_s, "request_overhead_s": overhead_s,
            "ttft_mean_by_layer": ttft_split, "cpu_s_during_traffic": cpu,
            "event_loop_lag_p50_p99_ms_by_phase": {"gateway": lag_ms,
                                                    "client": got["event_loop_lag_p50_p99_ms_by_phase"]},
            "load_average_1m": [load_at_start, os.getloadavg()[0]], "cpus": os.cpu_count()}  # fmt: skip


def block_tokens(plan: tuple[RatePhase, ...], seed: int) -> int:
    """The prompt tokens in one of the live gateway's routing blocks (`ROUTING_BLOCK_BYTES`
    of rendered prompt) for this workload's text: ~6.7 bytes a token, not English's ~4,
    so prefix_aware's costs, counted in blocks, weigh as live (measured from the text)."""
    convs = list(text_conversations(synthetic_shapes(demo_workload(plan, seed))))
    tokens = sum(c.turns[0].input_tokens for c in convs)
    text_bytes = sum(len(prompt_text({"messages": [{"role": "user", "content": c.turns[0].text}]},
                                     "/v1/chat/completions").encode()) for c in convs)  # fmt: skip
    return max(1, round(ROUTING_BLOCK_BYTES * tokens / max(1, text_bytes)))


class GatewayHashes(PrefixAware):
    """prefix_aware given each request's prefix hashes as the live gateway computes them
    (`request_prefix_hashes` of the very text sent), not the simulator's from token counts:
    bytes and tokens do not align, and the burst's routing sits on such margins. The
    simulator names request i `sim-i`."""

    def __init__(self, hashes: list[tuple[int, ...]], seed: int, **options: Any) -> None:
        super().__init__(seed=seed, **options)
        self._hashes = {f"sim-{i}": h for i, h in enumerate(hashes)}

    def choose(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> ReplicaView | None:
        hashes = self._hashes.get(request.request_id)
        if hashes is None:  # loud, rather than routing on the simulator's hashes unseen
            raise KeyError(f"no gateway hashes for {request.request_id!r} (named sim-i?)")
        return super().choose(dataclasses.replace(request, prefix_hashes=hashes), replicas)


def routing_policy(
    name: str, plan: tuple[RatePhase, ...], seed: int, options: dict[str, Any] | None = None
) -> RoutingPolicy:
    """The gateway's routing policy with its options (`gateway.policy_options`)."""
    if name != "prefix_aware":
        return make_routing_policy(name, seed=seed, **(options or {}))
    convs = text_conversations(synthetic_shapes(demo_workload(plan, seed)))
    return GatewayHashes([request_prefix_hashes({"messages": [{"role": "user", "content":
                                                 c.turns[0].text}]}, "/v1/chat/completions")
                          for c in convs], seed, **(options or {}))  # fmt: skip


def sim_once(
    cfg: FleetConfig,
    plan: tuple[RatePhase, ...],
    seed: int,
    time_scale: float,
    cold_start_s: float,
    overhead_s: float,
    phase_s: float = 0.0,
    raw: Path | None = None,
) -> dict[str, Any]:
    sc = Scenario(
        model=cfg.replicas.model, gpu=cfg.replicas.gpu, tp=cfg.replicas.tp,
        max_num_seqs=cfg.replicas.arg_int("--max-num-seqs") or 256, time_scale=time_scale,
        routing=str(cfg.gateway_settings()["policy"]), autoscale=cfg.autoscale.policy,
        autoscale_params=tuple(cfg.policy_params().items()), min_replicas=cfg.autoscale.min_replicas,
        max_replicas=cfg.autoscale.max_replicas, replicas=cfg.autoscale.min_replicas, startup_s=cold_start_s,
        autoscale_interval_s=cfg.autoscale.interval_s,
        drain_deadline_s=cfg.replicas.drain_deadline_s, request_overhead_s=overhead_s, seed=seed,
        tick_phase_s=phase_s, scrape_phase_s=(phase_s + SCRAPE_AFTER_TICK_S) % 1.0,
    )  # fmt: skip
    requests = sim_requests(synthetic_shapes(demo_workload(plan, seed)))
    routing = routing_policy(sc.routing, plan, seed, cfg.gateway_settings().get("policy_options"))
    config = dataclasses.replace(build_config(sc), routing_block_tokens=block_tokens(plan, seed))
    result = FleetSimulator(config, requests, routing).run()
    s = summarize(result)
    points = [(r.arrival_s, r.ttft_s, r.tpot_s) for r in result.requests if r.ok]
    changes = [(d.now_s, d.current_replicas, d.desired_replicas, d.reason)
               for d in result.scaling_changes]  # fmt: skip
    cut = s["failures"].get("drain_deadline", 0)
    tokens = {"prompt_tokens": s["total_input_tokens"],
              "prefix_queries_tokens": s["prefix_cache_queries_tokens"],
              "prefix_hit_rate": s["prefix_cache_hit_rate"]}  # fmt: skip
    if raw is not None:  # every request, for pairing with the live runs' (`--raw`)
        rows = [(r.arrival_s, r.ttft_s, r.tpot_s, r.replica_id, r.input_tokens, r.prefix_hit_tokens)
                for r in result.requests]  # fmt: skip
        raw.write_text(json.dumps(rows))
    return {**figures(plan, points, s["requests"], changes, cut, s["undrained"]),
            "engine_tokens": tokens,
            "cold_start_s": cold_start_s,
            "request_overhead_s": overhead_s, "tick_phase_s": phase_s}  # fmt: skip


# Live, the autoscaler's ticks and the gateway's scrapes fall anywhere in their 1 s
# interval of the traffic's start; the simulator is run at these phases and averaged.
PHASES_S = (0.0, 0.2, 0.4, 0.6, 0.8)


def sim_mean(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The simulator's figures averaged over the tick phases (each run is kept too)."""
    out: dict[str, Any] = {"runs": runs}
    for key in [*METRICS, *COUNTS]:
        values = [r[key] for r in runs]
        out[key] = sum(values) / len(values)
        out[f"{key}_range"] = (min(values), max(values))
    return out


METRICS = [f"{m}_p{p}_ms" for m in ("ttft", "tpot") for p in PCTS]
COUNTS = ("scale_outs", "scale_ins", "cut", "undrained")


def compare(live: list[dict[str, Any]], sim: dict[str, Any]) -> dict[str, Any]:
    """The sim against every request of the live runs (latency; the runs' means where an
    earlier result kept no requests) and each live run (counts)."""
    out: dict[str, Any] = {"pooled": all("requests_ms" in r for r in [*live, *sim["runs"]])}
    for key in METRICS:
        name, p = key.split("_")[0], float(key.split("_")[1][1:])
        values = [r[key] for r in live if r[key] is not None]
        if out["pooled"]:
            got = compare_requests([r["requests_ms"][name] for r in live],
                                   [r["requests_ms"][name] for r in sim["runs"]], p)  # fmt: skip
        else:
            got = compare_figures(values, [r[key] for r in sim["runs"]])
        out[key] = {**dataclasses.asdict(got), "live_min": min(values), "live_max": max(values)}
    for key in COUNTS:
        values = [r[key] for r in live]
        out[key] = {"live": values, "live_mean": sum(values) / len(values), "sim": sim[key],
                    "sim_range": sim[f"{key}_range"]}  # fmt: skip
    out["agrees"] = (
        all(out[k]["agrees"] for k in METRICS)
        and all(abs(out[k]["live_mean"] - sim[k]) <= 1 for k in ("scale_outs", "scale_ins"))
        and sim["cut"] == 0
        and all(v == 0 for v in out["cut"]["live"])
    )
    return out


def markdown(cmp: dict[str, Any], sim: dict[str, Any], nominal: dict[str, Any]) -> str:
    what = "all requests" if cmp["pooled"] else "mean"
    lines = [f"| figure | live: {what} (runs' range) | sim: {what} (tick phases' range) "
             f"| sim − live | live requests ≤ sim ± {Z:g} SE | agrees | sim, nothing measured |",
             "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for key in METRICS:
        c = cmp[key]
        lo, hi = sim[f"{key}_range"]
        share = (f"{c['noise']:.1f} ms" if c["share"] is None  # (earlier runs: no requests)
                 else f"{c['share']:.1%} ± {c['share_noise']:.1%}")  # fmt: skip
        lines.append(f"| {key.replace('_', ' ')} | {c['live']:.1f} ({c['live_min']:.1f}–"
                     f"{c['live_max']:.1f}) | {c['sim']:.1f} ({lo:.1f}–{hi:.1f}) | {c['error']:+.1%} "
                     f"| {share} | {c['agrees']} | {nominal[key]:.1f} |")  # fmt: skip
    for key in COUNTS:
        c = cmp[key]
        lo, hi = c["sim_range"]
        lines.append(f"| {key.replace('_', '-')} | {c['live_mean']:.1f} ({', '.join(map(str, c['live']))}) "
                     f"| {c['sim']:.1f} ({lo}–{hi}) | {c['sim'] - c['live_mean']:+.1f} | | "
                     f"| {nominal[key]:.1f} |")  # fmt: skip
    lines.append(
        f"\nagrees (latency within {TOLERANCE:.0%}, or live's share of requests within "
        f"the sim's pNN at NN % ± {Z:g} SE; scalings ±1, 0 cut): {cmp['agrees']}"
    )
    return "\n".join(lines) + "\n"


def where_ttft_goes(live: list[dict[str, Any]], sim: dict[str, Any]) -> str:
    """Per live run: the machine's load, and each layer's mean TTFT over every request
    beside the simulator's, each process's CPU, how late each event loop woke, and the
    prompt tokens the engines looked up in their prefix caches and the share they held."""
    sim_ms = sum(r["ttft_mean_ms"] for r in sim["runs"]) / len(sim["runs"])
    lines = [f"\nWhere TTFT goes (mean over every request, ms; the simulator: {sim_ms:.0f}; "
             f"its engines' prompt tokens and prefix hits: {_tokens(sim['runs'][0])}):\n",
             "| live run | load 1m start → end | cold start s | client | gateway | replica "
             "| engine | CPU s gateway / replicas / client | loop lag p99 ms, burst: gateway / client "
             "| prompt tokens, prefix hits |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for i, r in enumerate(live, 1):
        if "ttft_mean_by_layer" not in r:
            continue  # a run of an earlier version of this benchmark
        t, cpu = r["ttft_mean_by_layer"], r["cpu_s_during_traffic"]
        lag = {k: max((v[1] or 0.0 for p, v in by.items() if "burst" in p), default=0.0)
               for k, by in r["event_loop_lag_p50_p99_ms_by_phase"].items()}  # fmt: skip
        load = " → ".join(f"{x:.1f}" for x in r["load_average_1m"])
        lines.append(f"| {i} | {load} | {r['cold_start_s']:.1f} | {t['client_ms']:.0f} "
                     f"| {t['gateway_ms']:.0f} | {t['replica_ms']:.0f} | {t['engine_ms']:.0f} "
                     f"| {cpu['gateway']:.1f} / {cpu['replicas']:.1f} / {cpu['client']:.1f} "
                     f"| {lag['gateway']:.0f} / {lag['client']:.0f} | {_tokens(r)} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def _tokens(run: dict[str, Any]) -> str:
    """A run's prompt tokens looked up in the prefix caches, and the share they held."""
    t = run.get("engine_tokens")
    if t is None:
        return "–"  # a run of an earlier version of this benchmark
    return f"{t['prefix_queries_tokens'] / 1000:.0f} k, {t['prefix_hit_rate']:.1%}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-scale", type=float, default=6.0)
    ap.add_argument("--stretch", type=float, default=1.5, help="phases this many times longer")
    ap.add_argument("--policy", default="default")
    ap.add_argument("--min-replicas", type=int, default=MIN_REPLICAS)
    ap.add_argument("--max-replicas", type=int, default=MAX_REPLICAS)
    ap.add_argument("--out", type=Path, default=RESULTS / "sim_vs_live")
    ap.add_argument("--raw", action="store_true",
                    help=f"write every request of each run under {RAW / 'sim_vs_live'}/")  # fmt: skip
    ap.add_argument("--live-from", type=Path, default=None,
                    help="reuse the live runs of an earlier result JSON (simulate again only)")  # fmt: skip
    args = ap.parse_args()
    cfg = fleet_config(args.policy, args.time_scale, args.min_replicas, args.max_replicas)
    plan = phases(args.time_scale, args.stretch)
    live = json.loads(args.live_from.read_text())["live"] if args.live_from else []
    raw_dir = RAW / "sim_vs_live" if args.raw else None
    if raw_dir is not None:
        raw_dir.mkdir(parents=True, exist_ok=True)
    for i in range(0 if args.live_from else args.repeats):
        print(f"live run {i + 1}/{args.repeats} …", file=sys.stderr)
        raw = raw_dir / f"live{i + 1}.json" if raw_dir is not None else None
        with contextlib.suppress(KeyboardInterrupt):
            live.append(asyncio.run(live_once(cfg, plan, args.seed, raw)))
        print(json.dumps(live[-1]), file=sys.stderr)
    cold = [r["cold_start_s"] for r in live if r["cold_start_s"] is not None]
    cold_start_s = sum(cold) / len(cold) if cold else STARTUP_S
    overhead_s = sum(r.get("request_overhead_s", 0.0) for r in live) / len(live)
    sim = sim_mean([sim_once(cfg, plan, args.seed, args.time_scale, cold_start_s, overhead_s, ph,
                             raw_dir / f"sim{ph:.1f}.json" if raw_dir is not None else None)
                    for ph in PHASES_S])  # fmt: skip
    # Beside it, the simulator told only what the fleet config says (nothing measured).
    nominal = sim_mean([sim_once(cfg, plan, args.seed, args.time_scale, STARTUP_S, 0.0, ph)
                        for ph in PHASES_S])  # fmt: skip
    cmp = compare(live, sim)
    table = markdown(cmp, sim, nominal) + where_ttft_goes(live, sim)
    for r in nominal["runs"]:
        del r["requests_ms"]  # (not compared: the figures above say enough)
    data = {"phases": [dataclasses.asdict(p) for p in plan], "time_scale": args.time_scale,
            "policy": args.policy, "live": live, "sim": sim, "sim_nothing_measured": nominal,
            "comparison": cmp}  # fmt: skip
    note = (f"measured on the live fleet: cold start {cold_start_s:.1f} s (nominal "
            f"{STARTUP_S:g} s), HTTP path {overhead_s * 1000:.1f} ms per request")  # fmt: skip
    write_result(args.out, data, table, note=note)
    print(table)


if __name__ == "__main__":
    main()
