"""What a simulated run reports, with `gpufleet bench`'s metric definitions (vLLM's).

TTFT, TPOT and E2E are summarized by `gpufleet.stats.summarize_ms` (mean, median,
std and percentiles in ms, numpy's linear percentiles); throughputs divide by the span
from the first arrival to the last completion; failed requests add no tokens.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from gpufleet.sim.results import RequestResult, SimResult
from gpufleet.stats import DEFAULT_PERCENTILES, summarize_ms


def summarize(
    result: SimResult, percentiles: Sequence[float] = DEFAULT_PERCENTILES
) -> dict[str, Any]:
    """The run's figures as plain JSON-able data."""
    reqs = result.requests
    ok = [r for r in reqs if r.ok]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpots = [t for r in ok if (t := r.tpot_s) is not None]
    e2es = [r.e2e_s for r in ok if r.e2e_s is not None]
    queued = [r.dispatched_s - r.arrival_s for r in ok if r.dispatched_s is not None]
    start_s = min((r.arrival_s for r in reqs), default=0.0)
    end_s = max((r.finished_s or r.arrival_s for r in reqs), default=0.0)
    span_s = max(end_s - start_s, 1e-9)
    total_in = sum(r.input_tokens for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    queries = sum(r.prefix_queries_tokens for r in result.replicas)
    hits = sum(r.prefix_hits_tokens for r in result.replicas)
    served = [r for r in result.replicas if r.requests > 0]
    counts = [r.requests for r in served]
    mean_count = sum(counts) / len(counts) if counts else 0.0
    loads = [r.mean_in_flight for r in served]
    mean_load = sum(loads) / len(loads) if loads else 0.0
    replica_s = sum(r.lifetime_s for r in result.replicas)
    gpu_hours = sum(r.gpu_hours for r in result.replicas)
    cost_usd = sum(r.cost_usd for r in result.replicas)
    errors = Counter(r.error for r in reqs if r.error is not None)
    changes = result.scaling_changes
    return {
        "requests": len(reqs),
        "completed": len(ok),
        "failed": len(reqs) - len(ok),
        "failures": dict(errors),
        "duration_s": span_s,
        "request_throughput": len(ok) / span_s,
        "output_throughput": total_out / span_s,
        "total_token_throughput": (total_in + total_out) / span_s,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "ttft_ms": summarize_ms(ttfts, percentiles),
        "tpot_ms": summarize_ms(tpots, percentiles),
        "e2el_ms": summarize_ms(e2es, percentiles),
        "gateway_queue_ms": summarize_ms(queued, percentiles),
        "prefix_cache_hit_rate": hits / queries if queries else 0.0,
        "prefix_cache_queries_tokens": queries,
        "prefix_cache_hits_tokens": hits,
        "preemptions": sum(r.preemptions for r in result.replicas),
        "replicas_used": len({r.replica_id for r in result.replicas}),
        "peak_ready_replicas": max((n for _, n, _ in result.fleet_size), default=0),
        "replica_seconds": replica_s,
        "gpu_hours": gpu_hours,
        "cost_usd": cost_usd,
        "groups": _by_group(result),
        "tenants": _by_tenant(reqs, percentiles),
        "crashes": result.crashes,
        "retries": result.retries,
        "max_mean_requests": max(counts) / mean_count if mean_count else 0.0,
        "max_mean_in_flight": max(loads) / mean_load if mean_load else 0.0,
        "scaling_decisions": len(result.decisions),
        "undrained": result.undrained,
        "scaling_changes": [
            {
                "t_s": round(d.now_s, 3),
                "from": d.current_replicas,
                "to": d.desired_replicas,
                "policy": d.policy,
                "reason": d.reason,
            }
            for d in changes
        ],
        "lora": _lora_summary(result, span_s),
        "replicas": [asdict(r) for r in result.replicas],
        # (t_s, ready, ready + starting + draining) at every change of the fleet
        "fleet_timeline": [list(x) for x in result.fleet_size],
        "sim_events": result.events,
        "sim_wall_s": result.wall_s,
        "sim_cpu_s": result.cpu_s,
        "sim_events_per_s": result.events / result.wall_s if result.wall_s > 0 else 0.0,
        "virtual_s": result.end_s,
    }


def _by_group(result: SimResult) -> dict[str, dict[str, Any]]:
    """Per replica group (layout): replicas, requests, replica-seconds, GPU-hours, cost."""
    out: dict[str, dict[str, Any]] = {}
    for r in result.replicas:
        g = out.setdefault(r.group, {"replicas": set(), "requests": 0, "replica_seconds": 0.0,
                                     "gpu_hours": 0.0, "cost_usd": 0.0, "restarts": 0})  # fmt: skip
        g["replicas"].add(r.replica_id)
        g["requests"] += r.requests
        g["replica_seconds"] += r.lifetime_s
        g["gpu_hours"] += r.gpu_hours
        g["cost_usd"] += r.cost_usd
        g["restarts"] += 1 if r.restarts else 0
    for g in out.values():
        g["replicas"] = len(g["replicas"])
    return out


def _by_tenant(
    reqs: Sequence[RequestResult], percentiles: Sequence[float]
) -> dict[str, dict[str, Any]]:
    """Per tenant: requests, completed, failures by reason, TTFT and TPOT."""
    out: dict[str, dict[str, Any]] = {}
    for name in sorted({r.tenant for r in reqs if r.tenant is not None}):
        mine = [r for r in reqs if r.tenant == name]
        ok = [r for r in mine if r.ok]
        out[name] = {
            "requests": len(mine),
            "completed": len(ok),
            "failures": dict(Counter(r.error for r in mine if r.error is not None)),
            "ttft_ms": summarize_ms([r.ttft_s for r in ok if r.ttft_s is not None], percentiles),
            "tpot_ms": summarize_ms([t for r in ok if (t := r.tpot_s) is not None], percentiles),
        }
    return out


def _lora_summary(result: SimResult, span_s: float) -> dict[str, float] | None:
    """LoRA figures (None without adapters): the gateway's adapter loads onto replicas,
    and the engines' GPU slot hit rate (admissions whose adapter was in a slot)."""
    reps = result.replicas
    admissions = sum(r.lora_admissions for r in reps)
    if not admissions:
        return None
    loads = sum(r.adapter_loads for r in reps)
    return {
        "adapter_loads": loads,
        "adapter_loads_per_min": 60.0 * loads / span_s,
        "gpu_slot_hit_rate": sum(r.lora_gpu_hits for r in reps) / admissions,
        "disk_loads": sum(r.lora_disk_loads for r in reps),
        "slot_activations": sum(r.lora_activations for r in reps),
        "admissions": admissions,
    }


def format_summary(s: dict[str, Any], title: str = "gpufleet sim") -> str:
    """A short plain-text report (the CLI prints it; --json writes everything)."""
    lines = [f"== {title} =="]

    def row(name: str, value: str) -> None:
        lines.append(f"{name:<36}{value}")

    row("Requests (completed/failed)", f"{s['completed']} / {s['failed']}")
    if s["failures"]:
        row("Failures", ", ".join(f"{k}: {v}" for k, v in sorted(s["failures"].items())))
    row("Span (s, virtual)", f"{s['duration_s']:.1f}")
    row("Request throughput (req/s)", f"{s['request_throughput']:.2f}")
    row("Output token throughput (tok/s)", f"{s['output_throughput']:.1f}")
    row("Total token throughput (tok/s)", f"{s['total_token_throughput']:.1f}")
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2el_ms", "E2E latency")):
        m = s[key]
        row(
            f"{label} (ms) mean/p50/p90/p99",
            f"{m['mean']:.1f} / {m['median']:.1f} / {m.get('p90', 0.0):.1f} / "
            f"{m.get('p99', 0.0):.1f}",
        )
    row("Gateway queue p99 (ms)", f"{s['gateway_queue_ms'].get('p99', 0.0):.1f}")
    row("Prefix cache hit rate", f"{s['prefix_cache_hit_rate']:.1%}")
    row("Preemptions", str(s["preemptions"]))
    if s.get("lora"):
        lo = s["lora"]
        row("LoRA loads (gateway) / per min", f"{lo['adapter_loads']} / "
            f"{lo['adapter_loads_per_min']:.1f}")  # fmt: skip
        row("LoRA GPU slot hit rate", f"{lo['gpu_slot_hit_rate']:.1%}")
        row("LoRA disk loads / slot activations", f"{lo['disk_loads']} / "
            f"{lo['slot_activations']}")  # fmt: skip
    row("Load max/mean (requests)", f"{s['max_mean_requests']:.2f}")
    row("Load max/mean (time-avg in flight)", f"{s['max_mean_in_flight']:.2f}")
    row("Replicas used / peak ready", f"{s['replicas_used']} / {s['peak_ready_replicas']}")
    row("Replica-seconds", f"{s['replica_seconds']:.0f}")
    row("GPU-hours (cost)", f"{s['gpu_hours']:.2f} (${s['cost_usd']:.2f})")
    if len(s["groups"]) > 1:
        for name, g in s["groups"].items():
            lines.append(f"  group {name}: {g['replicas']} replicas, {g['requests']} requests, "
                         f"{g['gpu_hours']:.2f} GPU-h (${g['cost_usd']:.2f})")  # fmt: skip
    for name, t in s["tenants"].items():
        fails = ", ".join(f"{k} {v}" for k, v in sorted(t["failures"].items())) or "none failed"
        lines.append(f"  tenant {name}: {t['completed']}/{t['requests']} ({fails}), TTFT p90 "
                     f"{t['ttft_ms'].get('p90', 0.0):.0f} ms")  # fmt: skip
    if s["crashes"] or s["retries"]:
        row("Replica crashes / retried requests", f"{s['crashes']} / {s['retries']}")
    if s["scaling_decisions"]:
        row("Scaling ticks / changes", f"{s['scaling_decisions']} / {len(s['scaling_changes'])}")
        if s.get("undrained"):
            row("Drains taken back (no cold start)", str(s["undrained"]))
        for c in s["scaling_changes"][:20]:
            lines.append(f"  t={c['t_s']:>8.1f}s  {c['from']} -> {c['to']}  {c['reason']}")
        if len(s["scaling_changes"]) > 20:
            lines.append(f"  ... {len(s['scaling_changes']) - 20} more (see --json)")
    row(
        "Simulated events (events/s wall)",
        f"{s['sim_events']} ({s['sim_events_per_s']:.0f}/s, {s['sim_wall_s']:.1f} s wall, "
        f"{s['sim_cpu_s']:.1f} s CPU)",
    )
    return "\n".join(lines)


COMPARISON_COLUMNS = (
    ("completed", "done", "{:d}"),
    ("failed", "failed", "{:d}"),
    ("ttft_p50_ms", "TTFT p50 ms", "{:.0f}"),
    ("ttft_p99_ms", "TTFT p99 ms", "{:.0f}"),
    ("tpot_p50_ms", "TPOT p50 ms", "{:.1f}"),
    ("tpot_p99_ms", "TPOT p99 ms", "{:.1f}"),
    ("e2el_p99_ms", "E2E p99 ms", "{:.0f}"),
    ("request_throughput", "req/s", "{:.2f}"),
    ("prefix_cache_hit_rate", "hit rate", "{:.1%}"),
    ("preemptions", "preempt", "{:d}"),
    ("max_mean_requests", "max/mean", "{:.2f}"),
    ("replica_seconds", "replica-s", "{:.0f}"),
    ("scaling_changes", "scalings", "{:d}"),
)


def comparison_row(name: str, s: dict[str, Any]) -> dict[str, Any]:
    return {
        "scenario": name,
        "completed": s["completed"],
        "failed": s["failed"],
        "ttft_p50_ms": s["ttft_ms"]["median"],
        "ttft_p99_ms": s["ttft_ms"].get("p99", 0.0),
        "tpot_p50_ms": s["tpot_ms"]["median"],
        "tpot_p99_ms": s["tpot_ms"].get("p99", 0.0),
        "e2el_p99_ms": s["e2el_ms"].get("p99", 0.0),
        "request_throughput": s["request_throughput"],
        "prefix_cache_hit_rate": s["prefix_cache_hit_rate"],
        "preemptions": s["preemptions"],
        "max_mean_requests": s["max_mean_requests"],
        "replica_seconds": s["replica_seconds"],
        "scaling_changes": len(s["scaling_changes"]),
        "adapter_loads": (s.get("lora") or {}).get("adapter_loads", 0),
        "lora_gpu_slot_hit_rate": (s.get("lora") or {}).get("gpu_slot_hit_rate", 0.0),
    }


def comparison_table(rows: Sequence[dict[str, Any]]) -> str:
    """A markdown table, one scenario per row."""
    header = ["scenario"] + [label for _, label, _ in COMPARISON_COLUMNS]
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = [str(r["scenario"])] + [fmt.format(r[key]) for key, _, fmt in COMPARISON_COLUMNS]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)
