"""The fleet end to end: real `gpufleet replica` processes behind the real gateway, the
controller with the default policy and the LocalProcessActuator, under a step load.

It must scale out during the step and back in after it, with zero failed requests and
zero requests cut by a scale-in (drained replicas finish what they hold).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gpufleet.fleet.config import validate_fleet
from gpufleet.fleet.run import fleet_up
from gpufleet.fleet.traffic import TrafficLog, drive
from gpufleet.routing.types import ReplicaState
from gpufleet.workload import RatePhase

pytestmark = pytest.mark.process  # every test here starts processes or servers

STEP = (
    RatePhase("low", 3.0, 1.0, 1.0),
    RatePhase("step", 10.0, 6.0, 6.0),
    RatePhase("low", 14.0, 1.0, 1.0),
)


def counts(run) -> dict[ReplicaState, int]:  # type: ignore[no-untyped-def]
    out = dict.fromkeys(ReplicaState, 0)
    for m in run.actuator.list():
        out[m.state] += 1
    return out


async def test_step_load_scales_out_and_back_in_without_failures(tmp_path: Path) -> None:
    cfg = validate_fleet(
        {
            # A 2-sequence batch and time slowed 4×: a few requests/s saturate a replica
            # while the test stays light on CPU.
            "replicas": {
                "args": "--max-num-seqs 2",
                "startup_s": 1.0,
                "time_scale": 4.0,
                "drain_deadline_s": 60.0,
            },
            "autoscale": {
                "policy": "default",
                "min_replicas": 1,
                "max_replicas": 4,
                "interval_s": 0.5,
                "params": {
                    "capacity_per_replica": 2,
                    "cold_start_s": 2.0,
                    "headroom_fraction": 0.0,
                    "trend_window_s": 4.0,
                    "peak_window_s": 4.0,
                    "scale_in_stabilization_s": 2.0,
                    "scale_in_cooldown_s": 2.0,
                },
            },
            "gateway": {"port": 0, "policy": "least_outstanding"},
        }
    )
    loop = asyncio.get_running_loop()
    async with fleet_up(cfg, port=0, log_dir=tmp_path / "logs") as run:
        end = loop.time() + 30.0  # hang guard for the first cold start
        while counts(run)[ReplicaState.READY] < 1:
            assert loop.time() < end, "first replica never became ready"
            await asyncio.sleep(0.1)

        traffic = TrafficLog()
        driver = loop.create_task(
            drive(run.url, cfg.replicas.model, STEP, log=traffic, seed=1, max_tokens=16)
        )
        peak_ready = 0
        while not driver.done():
            peak_ready = max(peak_ready, counts(run)[ReplicaState.READY])
            await asyncio.sleep(0.1)
        await driver

        end = loop.time() + 40.0  # hang guard for the scale-in
        while True:
            c = counts(run)
            if (
                c[ReplicaState.READY] + c[ReplicaState.STARTING] == 1
                and not c[ReplicaState.DRAINING]
            ):
                break
            assert loop.time() < end, f"did not scale back in: {c}; {run.changes[-1:]}"
            await asyncio.sleep(0.2)

        changes = run.changes
        cut = run.cut_requests

    failed = [r for r in traffic.results if not r.ok]
    assert traffic.sent > 40 and len(traffic.results) == traffic.sent
    assert failed == [], failed[:3]
    assert peak_ready >= 2, changes
    assert any(d.delta > 0 for d in changes) and any(d.delta < 0 for d in changes)
    # Several may go at once (`scale_in_many`), never below the minimum, and their drains
    # wait for the requests they hold.
    assert all(d.desired_replicas >= 1 for d in changes if d.delta < 0)
    assert cut == 0
