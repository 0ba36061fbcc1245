"""sim_vs_live's load generator, in a process of its own as a real user's client is.

    python benchmarks/live_client.py URL MODEL --phases JSON [--seed 0] --out FILE

Plays the seeded demo workload (`gpufleet.fleet.traffic.drive`: the same requests, the
same arrival times, `gpufleet bench`'s streaming client) against the gateway at URL, and
writes every request's result, this process's event-loop lag and its CPU seconds as JSON.
It prints `t0 <seconds>` when the traffic starts, on `time.monotonic()`'s clock
(CLOCK_MONOTONIC: the same in every process of the machine), so the process that holds the
gateway can line its own measurements up with the requests' send times.

In one process with the gateway, the client's reading and parsing of every streamed chunk
and the gateway's relaying of it share one event loop: on a small machine that loop then
wakes late, and every request's TTFT includes the wait. A client of its own keeps what the
client measures to what the fleet does.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpufleet.fleet.traffic import TrafficLog, drive
from gpufleet.stats import percentiles
from gpufleet.workload import RatePhase


async def loop_lag(
    plan: Sequence[RatePhase], t0: float, period_s: float = 0.05
) -> dict[str, list[float | None]]:
    """How late this process's event loop wakes, per phase of `plan` (from `t0` on
    `time.monotonic()`): p50/p99 ms past a `period_s` sleep. On a starved CPU this is
    what every chunk waits for on top of the engine."""
    loop, lags = asyncio.get_running_loop(), []
    end_s = sum(p.duration_s for p in plan)
    while (now := time.monotonic() - t0) < end_s:
        start = loop.time()
        await asyncio.sleep(period_s)
        lags.append((now, loop.time() - start - period_s))
    out, t = {}, 0.0
    for i, phase in enumerate(plan):
        got = [lag for at, lag in lags if t <= at < t + phase.duration_s]
        ps = percentiles(got, (50, 99)) or [None, None]
        out[f"{i}:{phase.name}"] = [None if v is None else round(v * 1000, 1) for v in ps]
        t += phase.duration_s
    return out


def cpu_s() -> float:
    """This process's CPU seconds (user + system) so far."""
    t = os.times()
    return t.user + t.system


async def play(url: str, model: str, plan: Sequence[RatePhase], seed: int) -> dict[str, Any]:
    started: list[float] = []
    lag: list[asyncio.Task[dict[str, list[float | None]]]] = []

    def clock() -> float:
        # `drive` reads the clock first, for its t0: announce it then.
        now = time.monotonic()
        if not started:
            started.append(now)
            print(f"t0 {now!r}", flush=True)
            lag.append(asyncio.get_running_loop().create_task(loop_lag(plan, now)))
        return now

    traffic = TrafficLog()
    cpu0 = cpu_s()
    await drive(url, model, plan, log=traffic, seed=seed, clock=clock)
    return {
        "t0": started[0],
        "results": [dataclasses.asdict(r) for r in traffic.results],
        "event_loop_lag_p50_p99_ms_by_phase": await lag[0],
        "cpu_s": cpu_s() - cpu0,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("model")
    ap.add_argument("--phases", required=True, help="JSON list of RatePhase fields")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    plan = tuple(RatePhase(**p) for p in json.loads(args.phases))
    got = asyncio.run(play(args.url, args.model, plan, args.seed))
    args.out.write_text(json.dumps(got))


if __name__ == "__main__":
    main()
