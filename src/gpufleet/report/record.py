"""What a run report is drawn from: per-request latencies and the fleet over time.

Plain data (no plotting imports), filled by `gpufleet up` (live traffic) and `gpufleet sim`
(virtual time) alike; times are seconds from the start of the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class RequestPoint:
    sent_s: float  # when the request arrived (s from the start)
    ok: bool
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    t_s: float
    current: int
    desired: int
    reason: str = ""


@dataclass(slots=True)
class RunRecord:
    title: str
    requests: list[RequestPoint] = field(default_factory=list)
    # (t_s, replicas holding a GPU: starting + ready + draining) — what costs money
    replicas: list[tuple[float, int]] = field(default_factory=list)
    # (t_s, replicas ready to serve), when known
    ready: list[tuple[float, int]] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)  # scale-outs and scale-ins
    summary: dict[str, Any] = field(default_factory=dict)  # key figures for the HTML table
    notes: list[str] = field(default_factory=list)
