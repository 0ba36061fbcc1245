"""`gpufleet up` with `gateway: {workers: 2}`: the controller drives the worker pool
through the same calls as a single gateway; its replica reaches both workers, the
autoscaler's signals and /admin/autoscale answer whichever worker takes the connection."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from gpufleet.fleet.config import validate_fleet
from gpufleet.fleet.run import fleet_up
from gpufleet.gateway.workers import WorkerPool
from gpufleet.routing.types import ReplicaState

pytestmark = pytest.mark.process  # starts a replica and two gateway workers

KEY = "sk-admin-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
BODY = {"model": "", "prompt": "hello", "max_tokens": 4, "stream": True}


async def test_up_with_two_gateway_workers(tmp_path: Path) -> None:
    cfg = validate_fleet(
        {
            "replicas": {"startup_s": 0.2, "time_scale": 0.05},
            "autoscale": {"min_replicas": 1, "max_replicas": 1, "interval_s": 0.2},
            "gateway": {"port": 0, "policy": "least_outstanding", "workers": 2, "admin_key": KEY},
        }
    )
    loop = asyncio.get_running_loop()
    async with fleet_up(cfg, port=0, log_dir=tmp_path / "logs") as run:
        assert isinstance(run.gateway, WorkerPool)
        end = loop.time() + 30.0  # hang guard for the first cold start
        async with aiohttp.ClientSession() as s:
            while True:
                async with s.get(run.url + "/admin/signals", headers=AUTH) as resp:
                    signals = await resp.json()
                if signals["replicas_by_state"]["ready"] == 1:
                    break
                assert loop.time() < end, "the replica never became ready on the workers"
                await asyncio.sleep(0.1)
            body = {**BODY, "model": cfg.replicas.model}
            for _ in range(10):  # fresh connections: the kernel spreads them over workers
                async with (
                    aiohttp.ClientSession() as fresh,
                    fresh.post(run.url + "/v1/completions", json=body) as resp,
                ):
                    assert resp.status == 200
                    assert (await resp.text()).endswith("data: [DONE]\n\n")
            async with s.get(run.url + "/admin/autoscale", headers=AUTH) as resp:
                assert resp.status == 200
            async with s.get(run.url + "/admin/signals", headers=AUTH) as resp:
                merged = await resp.json()
            async with s.get(run.url + "/metrics") as resp:
                metrics = await resp.text()
            # The workers' counts, summed, beside the supervisor's autoscaler gauges.
            assert "gpufleet_autoscale_replicas" in metrics
            assert "gpufleet_gateway_requests_total" in metrics
            # The controller reads the merged signals: the workers' TTFT samples reach it.
            end = loop.time() + 10.0
            while (last := run.controller.last_signals) is None or last.ttft_s is None:
                assert loop.time() < end, "the autoscaler never saw the workers' TTFT"
                await asyncio.sleep(0.1)
        assert merged["streamed_requests_in_window"] == 10
        assert [m.state for m in run.actuator.list()] == [ReplicaState.READY]
        assert len(last.ready) == 1
