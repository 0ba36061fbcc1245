"""The gateway's autoscaling signals as plain data (pure: the caller passes the time).

`Gateway.signals()` (live) and the simulator both build the dict the controller reads
(`gpufleet.autoscale.gateway_link.fleet_signals`) with these functions, so the two cannot
drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpufleet.routing.types import ReplicaState, ReplicaView

if TYPE_CHECKING:
    from gpufleet.gateway.metrics import RecentWindow

SIGNAL_QUANTILES = (0.5, 0.9, 0.99)


def latency_signals(
    now_s: float, ttft_window: RecentWindow, tpot_window: RecentWindow
) -> dict[str, Any]:
    """TTFT / TPOT percentiles over the recent window of streamed requests."""
    return {
        "window_s": ttft_window.window_s,
        "ttft_s": ttft_window.percentiles(now_s, SIGNAL_QUANTILES),
        "tpot_s": tpot_window.percentiles(now_s, SIGNAL_QUANTILES),
        "streamed_requests_in_window": ttft_window.count(),
    }


def gateway_signals(
    now_s: float,
    replicas: Sequence[ReplicaView],
    queue_depth: int,
    queue_depth_by_model: Mapping[str, int],
    latency: Mapping[str, Any],
) -> dict[str, Any]:
    """What an autoscaler needs from the gateway: queue, in-flight, latency, replicas."""
    by_state: dict[str, int] = {str(s): 0 for s in ReplicaState}
    for r in replicas:
        by_state[str(r.state)] += 1
    out: dict[str, Any] = {
        "time_s": now_s,
        "queue_depth": queue_depth,
        "queue_depth_by_model": dict(queue_depth_by_model),
        "in_flight_total": sum(r.in_flight for r in replicas),
        "replicas_by_state": by_state,
    }
    out.update(latency)
    out["replicas"] = [
        {
            "id": r.replica_id,
            "url": r.url,
            "state": str(r.state),
            "pool": r.pool,
            "models": sorted(r.models),
            "in_flight": r.in_flight,
            "num_running": r.stats.num_running if r.stats else None,
            "num_waiting": r.stats.num_waiting if r.stats else None,
            "kv_cache_usage": r.stats.kv_cache_usage if r.stats else None,
            "stats_age_s": (now_s - r.stats.scraped_at_s) if r.stats else None,
        }
        for r in replicas
    ]
    return out
