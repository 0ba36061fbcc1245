"""The end-of-run summary: what clients saw, and what the fleet cost in replica-seconds.

Percentiles are `gpufleet.stats`' (numpy's linear, as `gpufleet bench` reports them).

Replica-seconds count every replica that holds a GPU (starting, ready or draining), sampled
over the run; "static peak" is what provisioning the run's peak count for the whole run
would have cost — what a fleet without autoscaling needs to serve the same burst.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from gpufleet.fleet.traffic import RequestResult
from gpufleet.stats import percentiles


@dataclass(slots=True)
class ReplicaTimeline:
    """(time_s, replicas holding a GPU) samples; integrates to replica-seconds."""

    samples: list[tuple[float, int]] = field(default_factory=list)

    def add(self, now_s: float, count: int) -> None:
        self.samples.append((now_s, count))

    def between(self, start_s: float, end_s: float) -> ReplicaTimeline:
        return ReplicaTimeline([(t, n) for t, n in self.samples if start_s <= t <= end_s])

    def replica_seconds(self) -> float:
        total = 0.0
        for (t0, n0), (t1, _) in zip(self.samples, self.samples[1:], strict=False):
            total += n0 * (t1 - t0)
        return total

    def duration_s(self) -> float:
        return self.samples[-1][0] - self.samples[0][0] if len(self.samples) > 1 else 0.0

    def peak(self) -> int:
        return max((n for _, n in self.samples), default=0)


@dataclass(frozen=True, slots=True)
class Summary:
    requests: int
    ok: int
    errors: int
    error_kinds: dict[str, int]
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p90_s: float | None
    tpot_p99_s: float | None
    duration_s: float
    replica_seconds: float
    peak_replicas: int
    static_peak_replica_seconds: float
    scale_outs: int
    scale_ins: int
    cut_by_scale_in: int
    undrained: int = 0  # scale-outs served by taking back a draining replica

    @property
    def saved_fraction(self) -> float:
        if self.static_peak_replica_seconds <= 0:
            return 0.0
        return 1.0 - self.replica_seconds / self.static_peak_replica_seconds

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["saved_fraction"] = self.saved_fraction
        return out


def summarize(
    results: Sequence[RequestResult],
    timeline: ReplicaTimeline,
    *,
    scale_outs: int = 0,
    scale_ins: int = 0,
    cut_by_scale_in: int = 0,
    undrained: int = 0,
) -> Summary:
    ok = [r for r in results if r.ok]
    kinds: dict[str, int] = {}
    for r in results:
        if not r.ok:
            key = f"HTTP {r.status}" if r.status else r.error.split(":")[0]
            kinds[key] = kinds.get(key, 0) + 1
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpots = [r.tpot_s for r in ok if r.tpot_s is not None]
    none: list[float | None] = [None, None, None]
    ttft: list[float | None] = [*(percentiles(ttfts, (50, 90, 99)) or none)]
    tpot: list[float | None] = [*(percentiles(tpots, (50, 90, 99)) or none)]
    duration = timeline.duration_s()
    peak = timeline.peak()
    return Summary(
        requests=len(results),
        ok=len(ok),
        errors=len(results) - len(ok),
        error_kinds=kinds,
        ttft_p50_s=ttft[0],
        ttft_p90_s=ttft[1],
        ttft_p99_s=ttft[2],
        tpot_p50_s=tpot[0],
        tpot_p90_s=tpot[1],
        tpot_p99_s=tpot[2],
        duration_s=duration,
        replica_seconds=timeline.replica_seconds(),
        peak_replicas=peak,
        static_peak_replica_seconds=peak * duration,
        scale_outs=scale_outs,
        scale_ins=scale_ins,
        cut_by_scale_in=cut_by_scale_in,
        undrained=undrained,
    )


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v * 1000:.0f} ms"


def summary_lines(s: Summary) -> list[str]:
    return [
        f"requests {s.requests}: {s.ok} ok, {s.errors} errors"
        + (
            f" ({', '.join(f'{k}: {v}' for k, v in s.error_kinds.items())})"
            if s.error_kinds
            else ""
        ),
        f"TTFT p50 {_ms(s.ttft_p50_s)}, p90 {_ms(s.ttft_p90_s)}, p99 {_ms(s.ttft_p99_s)}",
        f"TPOT p50 {_ms(s.tpot_p50_s)}, p90 {_ms(s.tpot_p90_s)}, p99 {_ms(s.tpot_p99_s)}",
        f"scaling: {s.scale_outs} scale-outs, {s.scale_ins} scale-ins, "
        f"{s.cut_by_scale_in} requests cut by a scale-in, "
        f"{s.undrained} draining replicas taken back",
        f"replica-seconds {s.replica_seconds:.0f} used vs {s.static_peak_replica_seconds:.0f} "
        f"for {s.peak_replicas} replicas (the peak) held for {s.duration_s:.0f} s: "
        f"{s.saved_fraction:.0%} saved",
    ]
