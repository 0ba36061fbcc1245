"""docs/multi-model.md's fleet, run briefly: two groups on two engine personalities behind
one gateway; the group at zero scales from its own queue while the other keeps serving."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpufleet.fleet.config import validate_fleet
from gpufleet.fleet.run import FleetRun, fleet_up
from gpufleet.routing.types import ReplicaState

from .test_model_groups import doc_fleet

pytestmark = pytest.mark.process  # every test here starts processes or servers

LLAMA, QWEN = "meta-llama/Llama-3.1-8B", "Qwen/Qwen3-8B"
KEY = {"Authorization": "Bearer k"}


async def _until(what: str, predicate: Any, timeout_s: float = 30.0) -> None:
    """Hang guard only: returns as soon as `predicate()` holds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < end, f"never: {what}"
        await asyncio.sleep(0.05)


def _ready(run: FleetRun, group: str) -> int:
    (g,) = (g for g in run.groups if g.name == group)
    return sum(1 for m in g.actuator.list() if m.state is ReplicaState.READY)


async def _chat(s: aiohttp.ClientSession, url: str, model: str) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with s.post(url + "/v1/chat/completions", json=body) as resp:
        await resp.read()
        return resp.status


async def test_two_models_two_engines_scale_on_their_own(tmp_path: Path) -> None:
    data = doc_fleet()
    data["gateway"].update(port=0, admin_key="k")
    for g in data["groups"]:
        g["replicas"]["startup_s"] = 0.3  # the doc's 20 s cold start, shortened
        g["autoscale"]["interval_s"] = 0.3
    cfg = validate_fleet(data)
    async with (
        fleet_up(cfg, port=0, log_dir=tmp_path / "logs") as run,
        aiohttp.ClientSession() as s,
    ):
        await _until("llama's first replica ready", lambda: _ready(run, "llama") == 1)
        assert [m.replica_id for g in run.groups for m in g.actuator.list()] == ["llama-1"]
        async with s.get(run.url + "/v1/models") as resp:
            assert {c["id"] for c in (await resp.json())["data"]} == {LLAMA, QWEN}

        # Qwen has no replica: its request waits in Qwen's queue, and Qwen's group scales out
        waiting = asyncio.get_running_loop().create_task(_chat(s, run.url, QWEN))
        await _until("qwen's request queued", lambda: run.gateway.signals().queue_depth == 1)
        assert run.gateway.signals().queue_depth_by_model == {QWEN: 1}
        llama, qwen = run.groups
        # each group's autoscaler reads its own model's signals
        assert (await qwen.controller.read_signals()).queue_depth == 1
        mine = await llama.controller.read_signals()
        assert mine.queue_depth == 0 and [r.replica_id for r in mine.replicas] == ["llama-1"]
        # ... while Llama's requests pass straight through
        assert [await _chat(s, run.url, LLAMA) for _ in range(3)] == [200, 200, 200]
        assert await asyncio.wait_for(waiting, 60) == 200

        first = qwen.controller.changes[0]
        assert (first.current_replicas, first.desired_replicas) == (0, 1)
        assert "1 waiting" in first.reason
        # Qwen's queue did not scale Llama (a forecast of Llama's own requests might)
        assert not any("waiting" in d.reason for d in llama.controller.changes)
        gw = {r.replica_id: r for r in run.gateway.replicas}
        await _until("both scraped", lambda: all(r.load_signals for r in gw.values()))
        assert {rid: (r.engine, r.load_signals) for rid, r in gw.items()} == {
            "llama-1": ("vllm", "engine"),
            "qwen-1": ("sglang", "engine"),
        }
        assert gw["qwen-1"].models == frozenset({QWEN})
        async with s.get(run.url + "/admin/autoscale", headers=KEY) as resp:
            body = await resp.json()
        assert set(body["groups"]) == {"llama", "qwen"}
        assert body["groups"]["qwen"]["model"] == QWEN
