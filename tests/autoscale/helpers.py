"""Scripted FleetSignals for pure policy tests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpufleet.autoscale.signals import FleetSignals, Percentiles, ReplicaSignals
from gpufleet.routing.types import ReplicaState


def fleet(
    ready: Sequence[tuple[int, int, float]] = (),
    *,
    starting: int = 0,
    draining: int = 0,
    queue: int = 0,
    ttft_p90_s: float | None = None,
    ready_in_s: float = 10.0,
    now_s: float = 0.0,
    cold_start_s: float | None = None,
) -> FleetSignals:
    """`ready` holds (running, waiting, kv_usage) per ready replica."""
    replicas = [
        ReplicaSignals(f"r{i}", ReplicaState.READY, running, waiting, kv, running + waiting)
        for i, (running, waiting, kv) in enumerate(ready)
    ]
    replicas += [
        ReplicaSignals(f"s{i}", ReplicaState.STARTING, expected_ready_s=now_s + ready_in_s)
        for i in range(starting)
    ]
    replicas += [ReplicaSignals(f"d{i}", ReplicaState.DRAINING) for i in range(draining)]
    ttft = None if ttft_p90_s is None else Percentiles(ttft_p90_s / 2, ttft_p90_s, ttft_p90_s * 2)
    return FleetSignals(
        replicas=tuple(replicas),
        queue_depth=queue,
        in_flight=sum(r.in_flight for r in replicas),
        ttft_s=ttft,
        cold_start_s=cold_start_s,
    )


def even(n_ready: int, total_running: int, *, waiting: int = 0, kv: float = 0.1):
    """`n_ready` replicas sharing `total_running` (and `waiting`) evenly."""
    out = []
    for i in range(n_ready):
        r = total_running // n_ready + (1 if i < total_running % n_ready else 0)
        w = waiting // n_ready + (1 if i < waiting % n_ready else 0)
        out.append((r, w, kv))
    return out


def windowed(
    n_ready: int,
    in_flight: int,
    admitted: int,
    *,
    tpot: Percentiles | None,
    requests: int | None = 500,
    starting: int = 0,
) -> FleetSignals:
    """`n_ready` replicas holding `in_flight` evenly, `admitted` requests so far, and a
    60 s latency window of `requests` with these TPOT percentiles."""
    s = fleet(even(n_ready, in_flight), starting=starting)
    return replace(s, admitted_total=admitted, tpot_s=tpot, window_s=60.0,
                   latency_requests=requests)  # fmt: skip
