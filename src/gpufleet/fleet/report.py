"""`gpufleet up --report DIR`: the run as PNG plots and an HTML page (gpufleet.report)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.report import Decision, RequestPoint, RunRecord, write_report

if TYPE_CHECKING:
    from gpufleet.fleet.run import FleetRun
    from gpufleet.fleet.summary import Summary
    from gpufleet.fleet.traffic import TrafficLog


def up_record(
    run: FleetRun, traffic: TrafficLog | None, traffic_start_s: float, summary: Summary | None
) -> RunRecord:
    """Times in seconds since the fleet started (traffic began `traffic_start_s` later)."""
    requests = [
        RequestPoint(r.sent_s + traffic_start_s, r.ok, r.ttft_s, r.tpot_s, r.e2e_s)
        for r in (traffic.results if traffic is not None else [])
    ]
    decisions = [
        Decision(d.now_s - run.started_s, d.current_replicas, d.desired_replicas, d.reason)
        for d in run.changes
    ]
    figures: dict[str, Any] = {
        "policy": run.config.autoscale.policy,
        "model": run.config.replicas.model,
    }
    if summary is not None:
        figures.update({k: v for k, v in asdict(summary).items() if isinstance(v, int | float)})
    notes = [f"gateway {run.url}; times are seconds since the fleet started"]
    if traffic is None:
        notes.append("no demo traffic: latency plots are empty (run with --demo)")
    return RunRecord(
        title=f"gpufleet up ({run.config.autoscale.policy} policy)",
        requests=requests,
        replicas=list(run.timeline.samples),
        decisions=decisions,
        summary=figures,
        notes=notes,
    )


def write_up_report(record: RunRecord, directory: str | Path) -> list[Path]:
    return write_report(record, directory)
