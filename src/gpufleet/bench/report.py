"""The result of a run (or a sweep) as data, JSON, and a rich table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpufleet.bench.metrics import BenchMetrics
from gpufleet.bench.overhead import ClientOverhead
from gpufleet.bench.scrape import ServerMetricsDelta


@dataclass
class BenchReport:
    config: dict[str, Any]
    metrics: BenchMetrics
    client: ClientOverhead
    server: ServerMetricsDelta | None = None
    server_note: str = ""  # why `server` is None
    # per successful request, in seconds, for CDF plots
    ttfts_s: list[float] = field(default_factory=list)
    tpots_s: list[float] = field(default_factory=list)
    e2els_s: list[float] = field(default_factory=list)
    interrupted: bool = False  # stopped early (Ctrl-C): covers the requests that finished

    def to_dict(self, per_request: bool = True) -> dict[str, Any]:
        m = self.metrics
        out: dict[str, Any] = {
            "config": self.config,
            "interrupted": self.interrupted,
            "metrics": m.flat(),
            "goodput_slo_ms": m.goodput_slo_ms,
            "failures": [
                {
                    "status": f.status,
                    "error_type": f.error_type,
                    "count": f.count,
                    "example": f.example,
                }
                for f in m.failures
            ],
            "server_metrics": self.server.to_dict() if self.server else None,
            "server_metrics_note": self.server_note,
            "client_overhead": self.client.to_dict(),
        }
        if per_request:
            out["ttfts_ms"] = [x * 1000 for x in self.ttfts_s]
            out["tpots_ms"] = [x * 1000 for x in self.tpots_s]
            out["e2els_ms"] = [x * 1000 for x in self.e2els_s]
        return out


@dataclass
class SweepReport:
    param: str  # "rate" or "concurrency"
    values: list[float]
    reports: list[BenchReport]
    knee_index: int | None
    knee_rule: str

    @property
    def knee_value(self) -> float | None:
        return None if self.knee_index is None else self.values[self.knee_index]

    def to_dict(self) -> dict[str, Any]:
        return {
            "param": self.param,
            "values": self.values,
            "knee_index": self.knee_index,
            "knee_value": self.knee_value,
            "knee_rule": self.knee_rule,
            "points": [r.to_dict(per_request=False) for r in self.reports],
        }
