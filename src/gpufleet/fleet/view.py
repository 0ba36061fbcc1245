"""The live terminal view of `gpufleet up`: replicas, traffic, and scaling decisions.

`render` is a pure function of a snapshot, so it is tested without a terminal; the runner
refreshes it a few times a second inside rich's Live.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gpufleet.autoscale.decision import ScalingDecision
from gpufleet.autoscale.signals import FleetSignals
from gpufleet.routing.types import ReplicaState

_STATE_STYLE = {
    ReplicaState.STARTING: "yellow",
    ReplicaState.READY: "green",
    ReplicaState.DRAINING: "magenta",
    ReplicaState.DEAD: "red",
}


@dataclass(slots=True)
class Snapshot:
    elapsed_s: float
    gateway_url: str
    policy: str
    signals: FleetSignals | None
    decisions: Sequence[ScalingDecision]  # the ones that changed the count, newest last
    latest: ScalingDecision | None
    phase: str = ""
    target_rps: float = 0.0
    sent: int = 0
    done: int = 0
    errors: int = 0
    client_in_flight: int = 0
    replica_ttft_p90_s: dict[str, float] = field(default_factory=dict)
    total_s: float | None = None
    started_s: float = 0.0  # decisions carry the controller clock; show them from the start


def _pct(v: float) -> str:
    return f"{v * 100:.0f}%"


def render(s: Snapshot) -> RenderableType:
    head = Text()
    head.append("gpufleet up", style="bold")
    head.append(f"  gateway {s.gateway_url}  policy {s.policy}  ")
    clock = f"{s.elapsed_s:.0f} s" + (f" / {s.total_s:.0f} s" if s.total_s else "")
    head.append(clock, style="cyan")
    if s.phase:
        head.append(f"\ntraffic: {s.phase} at {s.target_rps:.1f} req/s", style="bold cyan")
        head.append(
            f"   sent {s.sent}, finished {s.done}, errors {s.errors}, in flight {s.client_in_flight}"
        )
    sig = s.signals
    if sig is not None:
        ttft = "—" if sig.ttft_s is None else f"{sig.ttft_s.p90_s * 1000:.0f} ms"
        tpot = "—" if sig.tpot_s is None else f"{sig.tpot_s.p90_s * 1000:.0f} ms"
        head.append(
            f"\ngateway: queue {sig.queue_depth}, in flight {sig.in_flight}, "
            f"TTFT p90 {ttft}, TPOT p90 {tpot} (last {sig.window_s:.0f} s)"
        )

    table = Table(expand=True, title="replicas", title_justify="left")
    for col in ("replica", "state", "in-flight", "running", "waiting", "KV", "TTFT p90"):
        table.add_column(col, justify="left" if col in ("replica", "state") else "right")
    if sig is not None:
        for r in sorted(sig.replicas, key=lambda r: r.replica_id):
            ttft_p90 = s.replica_ttft_p90_s.get(r.replica_id)
            table.add_row(
                r.replica_id,
                Text(str(r.state), style=_STATE_STYLE.get(r.state, "")),
                str(r.in_flight),
                str(r.running),
                str(r.waiting),
                _pct(r.kv_usage),
                "—" if ttft_p90 is None else f"{ttft_p90 * 1000:.0f} ms",
            )

    lines = Text()
    for d in list(s.decisions)[-6:]:
        arrow = "▲" if d.delta > 0 else "▼"
        lines.append(
            f"{d.now_s - s.started_s:6.0f} s {arrow} {d.current_replicas}→{d.desired_replicas}  ",
            style="green" if d.delta > 0 else "magenta",
        )
        lines.append(d.reason + "\n")
    if s.latest is not None:
        lines.append("now: ", style="bold")
        lines.append(s.latest.reason)
    return Group(
        Panel(head),
        table,
        Panel(lines, title="scaling decisions (why)", title_align="left"),
    )
