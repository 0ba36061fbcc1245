"""How fast `gpufleet sim` replays a fleet, on one core, at the scales issue 12 names.

    python benchmarks/sim_speed.py [--cases mooncake,azure10x,synthetic1m,tokens,peers]
                                   [--scale 1.0] [--json FILE] [--skip vidur]

Each case runs in its own process pinned to one CPU (peak memory is that process's):

* `mooncake`: the Mooncake conversation hour (12,031 requests, ~12k-token prompts sharing
  512-token blocks) over 8 Llama-3.1-8B / H100 replicas, `prefix_aware` routing;
* `azure10x`: the Azure conversation trace at 10x its rate (ten copies interleaved,
  ~190k requests) over 64 replicas, `least_outstanding` routing;
* `synthetic1m`: 1 M requests, multi-turn sessions (4 turns, each resending the history)
  starting as a Poisson process, mixed lengths, over 256 replicas, `power_of_two` routing;
* `tokens`: 20k requests at 64, 256 and 1024 output tokens (requests/s should not fall
  with the tokens generated), engines jumping over decode runs and, beside them, stepping
  one iteration per event (the simulator before issue 12);
* `peers`: on the Mooncake hour, the engine-free fleet replay (`gpufleet.routing.replay`),
  the simulator stepping every iteration, and Vidur (microsoft/vidur, pip) if it can run
  here (it needs its profiling data; otherwise the exact error is recorded).

For each: CPU seconds, wall seconds, requests per CPU second, simulated seconds per CPU
second, events, peak memory, and what the run predicts (hit rate, TTFT, TPOT). The traces
are under $GPUFLEET_SHARED/traces (docs/data.md); `--scale` shrinks every case (0.1 = a
tenth of the requests) for a quick look. Writes benchmarks/results/sim_speed.{json,md}
(`--out` elsewhere) and prints the markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpufleet.native import import_sources_only, is_compiled

if "--interpreted" in sys.argv:  # before any compiled module is imported (make sim-compiled)
    import_sources_only()

from gpufleet.errors import UserError
from gpufleet.routing import make_policy
from gpufleet.shared_data import shared_file
from gpufleet.sim.report import summarize
from gpufleet.sim.scenario import Scenario, build_config, build_requests
from gpufleet.sim.simulator import FleetSimulator
from gpufleet.workload import SimRequest, sim_requests, trace_shapes
from gpufleet.workload.traces import read_trace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import peer_venv, pinned
from record import RESULTS, write_result

TRACES = {"mooncake": "mooncake_conversation.jsonl", "azure": "azure_llm_2023_conv.csv"}
TARGETS = {"mooncake": 3.0, "azure10x": 30.0, "synthetic1m": 120.0}  # CPU s (issue 12)
MEMORY_TARGET_GIB = {"synthetic1m": 4.0}


def shared_trace(name: str) -> Path:
    """traces/NAME of the shared data ($GPUFLEET_SHARED): a UserError naming it if absent."""
    return shared_file("traces", name)


def azure_tiled(path: Path, copies: int, limit: int | None) -> list[SimRequest]:
    """`copies` copies of the trace interleaved: copy k shifted by k/copies of the mean gap,
    so the rate is `copies` times the trace's and its bursts keep their shape."""
    records = read_trace(path)
    gap = (records[-1].arrival_s - records[0].arrival_s) / max(1, len(records) - 1)
    tiled = []
    for k in range(copies):  # each copy its own prompts (its own seed)
        for r in sim_requests(trace_shapes(records, seed=k)):
            tiled.append((r.arrival_s + k * gap / copies, r))
    tiled.sort(key=lambda pair: pair[0])
    if limit is not None:
        tiled = tiled[:limit]
    return [SimRequest(i, t, r.segments, r.output_tokens) for i, (t, r) in enumerate(tiled)]


# -------------------------------------------------------------------------- cases


def case_scenarios(scale: float) -> dict[str, tuple[Scenario, str | None]]:
    """name -> (scenario, special request builder or None)."""

    def n(count: int) -> int:
        return max(1, round(count * scale))

    mooncake = str(shared_trace(TRACES["mooncake"]))
    return {
        "mooncake": (
            Scenario(trace=mooncake, num_requests=n(12_031), replicas=8, routing="prefix_aware"),
            None,
        ),
        "azure10x": (
            Scenario(num_requests=n(193_660), replicas=64, routing="least_outstanding"),
            "azure10x",
        ),
        "synthetic1m": (
            Scenario(
                sessions=n(250_000),
                turns=4,
                rate=150.0,
                input_tokens=600,
                output_tokens=200,
                range_ratio=0.9,
                replicas=256,
                routing="power_of_two",
                seed=1,
            ),
            None,
        ),
        **{
            f"tokens{osl}": (
                Scenario(
                    num_requests=n(20_000),
                    rate=25.0,
                    input_tokens=512,
                    output_tokens=osl,
                    range_ratio=0.5,
                    replicas=16,
                    routing="least_outstanding",
                    seed=2,
                ),
                None,
            )
            for osl in (64, 256, 1024)
        },
    }


def build(name: str, scale: float, jump: bool) -> tuple[Scenario, list[SimRequest], FleetSimulator]:
    sc, special = case_scenarios(scale)[name]
    if special == "azure10x":
        reqs = azure_tiled(shared_trace(TRACES["azure"]), 10, sc.num_requests)
    else:
        reqs = build_requests(sc)
    cfg = dataclasses.replace(build_config(sc), jump_decode_runs=jump)
    return sc, reqs, FleetSimulator(cfg, reqs, make_policy(sc.routing, seed=sc.seed))


def run_case(name: str, scale: float, jump: bool) -> dict[str, Any]:
    """Runs in the child process: build the requests, simulate, measure (the run's CPU
    time is the case's figure; building the requests and the fleet, which `gpufleet sim`
    pays too, is `build_cpu_s`, and summarizing the result after it `summary_cpu_s`)."""
    build0 = time.process_time()
    sc, reqs, sim = build(name, scale, jump)
    build_cpu_s = time.process_time() - build0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    result = sim.run()
    cpu_s = time.process_time() - cpu0
    wall_s = time.perf_counter() - wall0
    summary0 = time.process_time()
    s = summarize(result)  # (with the collector's first passes over what the run left)
    summary_cpu_s = time.process_time() - summary0
    tokens = sum(r.output_tokens for r in result.requests)
    return {
        "case": name,
        "engines": "jump over decode runs" if jump else "step every iteration",
        "compiled": is_compiled(sys.modules[FleetSimulator.__module__]),  # make sim-compiled
        "replicas": sc.replicas,
        "requests": len(reqs),
        "completed": sum(r.ok for r in result.requests),
        "output_tokens": tokens,
        "cpu_s": cpu_s,
        "build_cpu_s": build_cpu_s,
        "summary_cpu_s": summary_cpu_s,
        "wall_s": wall_s,
        "requests_per_cpu_s": len(reqs) / cpu_s,
        "tokens_per_cpu_s": tokens / cpu_s,
        "virtual_s": result.end_s,
        "virtual_s_per_cpu_s": result.end_s / cpu_s,
        "events": result.events,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "prefix_hit_rate": s["prefix_cache_hit_rate"],
        "ttft_p50_ms": s["ttft_ms"]["median"],
        "ttft_p99_ms": s["ttft_ms"]["p99"],
        "tpot_p50_ms": s["tpot_ms"]["median"],
        "preemptions": s["preemptions"],
    }


def run_replay(scale: float) -> dict[str, Any]:
    """The engine-free fleet replay on the Mooncake hour (FIFO prefill, LRU prefix cache,
    unbounded decode): the quick model the routing work used."""
    from gpufleet.routing.replay import ReplayRequest, ReplicaTiming, replay
    from gpufleet.workload import SegmentHasher

    sc, _ = case_scenarios(scale)["mooncake"]
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
    wall0, cpu0 = time.perf_counter(), time.process_time()
    report = replay(make_policy(sc.routing, seed=sc.seed), rr, replicas=sc.replicas, timing=timing)
    cpu_s = time.process_time() - cpu0
    return {
        "case": "mooncake",
        "engines": "none (routing.replay)",
        "replicas": sc.replicas,
        "requests": len(rr),
        "completed": len(rr),
        "cpu_s": cpu_s,
        "wall_s": time.perf_counter() - wall0,
        "requests_per_cpu_s": len(rr) / cpu_s,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "prefix_hit_rate": report.hit_rate,
        "ttft_p50_ms": report.ttft_quantile_s(0.5) * 1000,
        "ttft_p99_ms": report.ttft_quantile_s(0.99) * 1000,
        "tpot_p50_ms": timing.tpot_s * 1000,
    }


VIDUR = pinned("vidur")[0]


def run_vidur(scale: float) -> dict[str, Any]:
    """Vidur (pip) on the Mooncake hour's lengths and arrival times, 8 H100 replicas of
    Llama-3-8B, vLLM's scheduler. Vidur predicts step times from profiling data it fetches
    from the Hugging Face Hub (not in the wheel); where it cannot, the row records the
    exact error."""
    row: dict[str, Any] = {"case": "mooncake", "engines": f"Vidur ({VIDUR})", "replicas": 8}
    sc, _ = case_scenarios(scale)["mooncake"]
    reqs = build_requests(sc)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "gpufleet-vidur"
    work.mkdir(parents=True, exist_ok=True)
    trace = work / "mooncake_vidur.csv"
    with trace.open("w") as f:  # the columns of Vidur's trace_replay generator
        f.write("Date,Time,PromptTokenCount,CompletionTokenCount\n")
        for r in reqs:
            f.write(f"2023-08-21,{r.arrival_s},{r.input_tokens},{r.output_tokens}\n")
    try:
        python = peer_venv("vidur", [VIDUR]) / "bin" / "python"
    except subprocess.CalledProcessError as e:
        return {**row, "error": f"pip install {VIDUR} failed: {e}"}
    argv = [
        str(python), "-m", "vidur.main",
        "--replica_config_device", "h100",
        "--replica_config_model_name", "meta-llama/Llama-3-8B",
        "--cluster_config_num_replicas", "8",
        "--replica_scheduler_config_type", "vllm",
        "--request_generator_config_type", "trace_replay",
        "--trace_request_generator_config_trace_file", str(trace),
        "--trace_request_generator_config_max_tokens", "131072",
        "--metrics_config_output_dir", str(work / "out"),
    ]  # fmt: skip
    wall0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=3600)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    row.update(requests=len(reqs), wall_s=time.perf_counter() - wall0,
               cpu_s=usage.ru_utime + usage.ru_stime)  # fmt: skip
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        errors = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception)\b", ln)]
        return {**row, "error": (errors or lines or [f"exit status {proc.returncode}"])[-1]}
    row["requests_per_cpu_s"] = len(reqs) / row["cpu_s"]
    return row


# -------------------------------------------------------------------------- driver


def child(kind: str, name: str, scale: float) -> dict[str, Any]:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    if kind == "replay":
        return run_replay(scale)
    if kind == "vidur":
        return run_vidur(scale)
    return run_case(name, scale, jump=kind == "jump")


def spawn(kind: str, name: str, scale: float, interpreted: bool = False) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--child", kind, name, "--scale", str(scale)]
    argv += ["--interpreted"] if interpreted else []
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        return {"case": name, "engines": kind, "error": tail[0]}
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def python_loop_ns() -> float:
    """CPU ns of one iteration of a plain Python loop here and now: the unit that makes
    these figures comparable across machines and loads (a quiet modern core: ~30 ns)."""
    best = float("inf")
    for _ in range(5):
        cpu0 = time.process_time()
        x = 0
        for i in range(1_000_000):
            x += i & 7
        best = min(best, (time.process_time() - cpu0) * 1e3)
    return best


def plan_runs(cases: list[str]) -> list[tuple[str, str]]:
    runs: list[tuple[str, str]] = []
    for case in cases:
        if case == "tokens":
            for osl in (64, 256, 1024):
                runs += [("jump", f"tokens{osl}"), ("step", f"tokens{osl}")]
        elif case == "peers":
            runs += [("replay", "mooncake"), ("step", "mooncake"), ("vidur", "mooncake")]
        else:
            runs.append(("jump", case))
    return runs


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| case | engines | replicas | requests | CPU s | target | build CPU s | req / CPU s | "
            "sim s / CPU s | events | peak GiB | hit rate | TTFT p50 ms | TPOT p50 ms |")  # fmt: skip
    out = [head, "| --- | --- |" + " ---: |" * 12]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['case']} | {r['engines']} |" + " |" * 11 + f" {r['error']} |")
            continue
        target = TARGETS.get(r["case"]) if r["engines"].startswith("jump") else None
        cells = [
            r["case"], r["engines"], r.get("replicas", ""), r["requests"], f"{r['cpu_s']:.1f}",
            f"≤ {target:g}" if target else "",
            f"{r['build_cpu_s']:.1f}" if "build_cpu_s" in r else "",
            f"{r.get('requests_per_cpu_s', 0):,.0f}",
            f"{r['virtual_s_per_cpu_s']:.0f}" if "virtual_s_per_cpu_s" in r else "",
            r.get("events", ""), f"{r['peak_rss_gib']:.2f}" if "peak_rss_gib" in r else "",
            f"{r['prefix_hit_rate']:.1%}" if "prefix_hit_rate" in r else "",
            f"{r['ttft_p50_ms']:.0f}" if "ttft_p50_ms" in r else "",
            f"{r['tpot_p50_ms']:.1f}" if "tpot_p50_ms" in r else "",
        ]  # fmt: skip
        out.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="mooncake,azure10x,synthetic1m,tokens,peers")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="Fraction of each case's requests."
    )
    parser.add_argument(
        "--out", "--json", type=Path, default=RESULTS / "sim_speed", help="path without suffix"
    )
    parser.add_argument(
        "--skip", default="", help="Comma-separated engines to leave out (e.g. vidur: no network)."
    )
    parser.add_argument(
        "--interpreted",
        action="store_true",
        help="Import gpufleet from its sources even where it is compiled (make sim-compiled).",
    )
    parser.add_argument("--child", nargs=2, metavar=("KIND", "CASE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.scale)))
        return 0
    try:
        for name in TRACES.values():
            shared_trace(name)
    except UserError as e:
        parser.error(str(e))
    loop_ns = python_loop_ns()
    rows = []
    skip = {k for k in args.skip.split(",") if k}
    for kind, name in plan_runs(args.cases.split(",")):
        if kind in skip:
            continue
        row = spawn(kind, name, args.scale, args.interpreted)
        rows.append(row)
        print(f"{name} ({row['engines']}): "
              + (row["error"] if "error" in row else f"{row['cpu_s']:.1f} CPU s"), file=sys.stderr)  # fmt: skip
    setup = {"scale": args.scale, "one_core": True, "python_loop_ns": loop_ns,
             "load_average": os.getloadavg(),
             "compiled": any(r.get("compiled") for r in rows)}  # fmt: skip
    md = table(rows) + (
        f"\n\nOne core per case; a plain Python loop iteration took {loop_ns:.0f} ns of CPU "
        f"here (load average {os.getloadavg()[0]:.1f}; ~30 ns on a quiet modern core)."
        + (" The simulator compiled with mypyc (make sim-compiled)." if setup["compiled"] else "")
    )
    json_path, _ = write_result(args.out, {"setup": setup, "rows": rows}, md, peers=["vidur"])
    print(md)
    print(f"\nJSON: {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
