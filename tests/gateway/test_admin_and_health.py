"""Admin API, active/passive health, scale-from-zero queue, signals."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from gpufleet.routing.types import ReplicaState

from .conftest import ADMIN_KEY, GatewayFactory, wait_until
from .stub_backend import StubBackend

MSG = [{"role": "user", "content": "hi"}]
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}


async def _json(resp: aiohttp.ClientResponse) -> Any:
    return await resp.json()


@pytest.mark.process
async def test_admin_requires_key(stubs: list[StubBackend], make_gateway: GatewayFactory) -> None:
    gw = await make_gateway([stubs[0].url])
    async with aiohttp.ClientSession() as s:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            async with s.get(gw.url + "/admin/replicas", headers=headers) as resp:
                assert resp.status == 401
                assert "error" in await resp.json()
    no_admin = await make_gateway([stubs[0].url], admin_key=None)
    async with aiohttp.ClientSession() as s, s.get(no_admin.url + "/admin/signals") as resp:
        assert resp.status == 403


@pytest.mark.process
async def test_admin_add_drain_delete(
    stubs: list[StubBackend], make_gateway: GatewayFactory
) -> None:
    gw = await make_gateway([stubs[0].url])
    base = gw.url + "/admin/replicas"
    async with aiohttp.ClientSession(headers=AUTH) as s:
        async with s.post(base, json={"url": stubs[1].url, "id": "extra"}) as resp:
            assert resp.status == 201
            added = await resp.json()
            assert added["id"] == "extra" and added["state"] == "starting"
        async with s.post(base, json={"url": stubs[1].url, "id": "extra"}) as resp:
            assert resp.status == 409
        async with s.post(base, json={"url": "ftp://x"}) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["param"] == "url"
        async with s.post(base, json={"id": "no-url"}) as resp:
            assert resp.status == 400
        await wait_until(lambda: gw.replicas.by_id["extra"].state is ReplicaState.READY)
        async with s.get(base) as resp:
            listed = {r["id"]: r for r in (await resp.json())["replicas"]}
        assert listed["extra"]["models"] == ["stub-model"]
        assert listed["extra"]["url"] == stubs[1].url
        assert set(listed["extra"]) >= {"id", "url", "models", "state", "in_flight", "stats",
                                        "pool"}  # fmt: skip
        first_id = next(rid for rid in listed if rid != "extra")
        # Drain the first: every new request goes to "extra".
        async with s.post(f"{base}/{first_id}/drain") as resp:
            assert resp.status == 200
            assert (await resp.json())["state"] == "draining"
        before = len(stubs[0].received)
        for _ in range(4):
            body = {"model": "stub-model", "messages": MSG}
            async with s.post(gw.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
        assert len(stubs[0].received) == before
        assert len(stubs[1].received) == 4
        # Taken back (a scale-out while it drained), then drained again.
        async with s.post(f"{base}/{first_id}/undrain") as resp:
            assert resp.status == 200
            assert (await resp.json())["state"] == "ready"
        async with s.post(f"{base}/{first_id}/undrain") as resp:
            assert resp.status == 404  # not draining: nothing to take back
        async with s.post(f"{base}/{first_id}/drain") as resp:
            assert resp.status == 200
        async with s.delete(f"{base}/{first_id}") as resp:
            assert resp.status == 200
        async with s.delete(f"{base}/{first_id}") as resp:
            assert resp.status == 404
        async with s.post(f"{base}/nope/drain") as resp:
            assert resp.status == 404
        async with s.get(base) as resp:
            assert [r["id"] for r in (await resp.json())["replicas"]] == ["extra"]


@pytest.mark.process
async def test_signals_report_load_and_scraped_stats(
    stubs: list[StubBackend], make_gateway: GatewayFactory
) -> None:
    stubs[0].num_running = 3
    gw = await make_gateway([stubs[0].url])
    await wait_until(lambda: all(r.stats is not None for r in gw.replicas))
    async with aiohttp.ClientSession(headers=AUTH) as s:
        body = {"model": "stub-model", "messages": MSG, "stream": True}
        async with s.post(gw.url + "/v1/chat/completions", json=body) as resp:
            await resp.read()
        async with s.get(gw.url + "/admin/signals") as resp:
            sig = await resp.json()
    assert sig["queue_depth"] == 0
    assert sig["in_flight_total"] == 0
    assert sig["replicas_by_state"]["ready"] == 1
    assert sig["ttft_s"]["p50"] is not None and sig["ttft_s"]["p50"] > 0
    assert sig["tpot_s"]["p99"] is not None
    (rep,) = sig["replicas"]
    assert (rep["num_running"], rep["num_waiting"], rep["kv_cache_usage"]) == (3, 2, 0.25)


@pytest.mark.process
async def test_passive_ejection_and_readmission(
    stubs: list[StubBackend], make_gateway: GatewayFactory
) -> None:
    gw = await make_gateway([s.url for s in stubs], health={"eject_after_failures": 2},
                            outlier={"consecutive_failures": 2, "base_ejection_time_s": 1.0})  # fmt: skip
    sick = stubs[0]
    sick.fail_status = 500
    sick.healthy = False
    sick_id = next(r.replica_id for r in gw.replicas if r.url == sick.url)
    async with aiohttp.ClientSession() as s:
        for _ in range(6):
            body = {"model": "stub-model", "messages": MSG}
            async with s.post(gw.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
        await wait_until(lambda: gw.replicas.by_id[sick_id].state is ReplicaState.DEAD)
        seen = len(sick.received)
        for _ in range(4):
            body = {"model": "stub-model", "messages": MSG}
            async with s.post(gw.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
        assert len(sick.received) == seen  # no traffic while ejected
        sick.fail_status = None
        sick.healthy = True
        await wait_until(lambda: gw.replicas.by_id[sick_id].state is ReplicaState.READY)
        for _ in range(4):
            body = {"model": "stub-model", "messages": MSG}
            async with s.post(gw.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
        assert len(sick.received) > seen
        async with s.get(gw.url + "/metrics") as resp:
            text = await resp.text()
    assert f'gpufleet_gateway_replica_ejections_total{{replica="{sick_id}"}} 1.0' in text


@pytest.mark.process
async def test_scale_from_zero_queue(
    stubs: list[StubBackend], make_gateway: GatewayFactory
) -> None:
    gw = await make_gateway([], models=["stub-model"], queue={"timeout_s": 30.0})
    async with aiohttp.ClientSession() as s:

        async def call() -> int:
            body = {"model": "stub-model", "messages": MSG}
            async with s.post(gw.url + "/v1/chat/completions", json=body) as resp:
                await resp.read()
                return resp.status

        tasks = [asyncio.create_task(call()) for _ in range(3)]
        await wait_until(lambda: gw.signals().queue_depth == 3)
        assert gw.signals().queue_depth_by_model == {"stub-model": 3}
        gw.add_replica(stubs[0].url)  # the in-process API the autoscaler uses
        assert await asyncio.gather(*tasks) == [200, 200, 200]
    assert gw.signals().queue_depth == 0


@pytest.mark.process
async def test_queue_timeout_and_overflow_give_503(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway(
        [], models=["stub-model"], queue={"timeout_s": 0.2, "max_size": 1, "retry_after_s": 7}
    )
    async with aiohttp.ClientSession() as s:
        body = {"model": "stub-model", "messages": MSG}
        first = asyncio.create_task(s.post(gw.url + "/v1/chat/completions", json=body))
        await wait_until(lambda: gw.signals().queue_depth == 1)
        async with s.post(gw.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 503  # overflow
            assert resp.headers["Retry-After"] == "7"
            assert "full" in (await resp.json())["error"]["message"]
        resp = await first
        assert resp.status == 503  # timed out waiting
        assert resp.headers["Retry-After"] == "7"
        resp.release()
        # A model nobody serves is still a 404, not a wait, even while a replica whose
        # models are not known yet is starting (the configured `models` are the truth).
        gw.add_replica("http://127.0.0.1:9")  # nothing listens there: starting for ever
        body = {"model": "other", "messages": MSG}
        async with s.post(gw.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 404


@pytest.mark.process
async def test_starting_replica_requests_wait_until_ready(
    stubs: list[StubBackend], make_gateway: GatewayFactory
) -> None:
    stubs[0].healthy = False
    gw = await make_gateway([stubs[0].url], wait_ready=False)
    async with aiohttp.ClientSession() as s:
        body = {"model": "stub-model", "messages": MSG}
        task = asyncio.create_task(s.post(gw.url + "/v1/chat/completions", json=body))
        await wait_until(lambda: gw.signals().queue_depth == 1)
        stubs[0].healthy = True
        resp = await task
        assert resp.status == 200
        resp.release()


def test_lean_histogram_exposes_cumulative_le_buckets() -> None:
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from gpufleet.fleet_state import LatencyWindows
    from gpufleet.gateway.metrics import GatewayMetrics

    metrics = GatewayMetrics(lambda: [], lambda: 0, LatencyWindows(60.0))
    ttft = metrics.latency("m", "t")[0]
    for value in (0.001, 0.001, 0.05, 100.0):  # 0.001 sits on a bound: le counts it
        ttft.observe(value)
    metrics.count_request("m", "t", 200)
    text = generate_latest(metrics.registry).decode()
    samples = {
        (s.name, s.labels.get("le")): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if fam.name == "gpufleet_gateway_time_to_first_token_seconds"
    }
    assert samples[("gpufleet_gateway_time_to_first_token_seconds_bucket", "0.001")] == 2
    assert samples[("gpufleet_gateway_time_to_first_token_seconds_bucket", "0.06")] == 3
    assert samples[("gpufleet_gateway_time_to_first_token_seconds_bucket", "+Inf")] == 4
    assert samples[("gpufleet_gateway_time_to_first_token_seconds_count", None)] == 4
    assert samples[("gpufleet_gateway_time_to_first_token_seconds_sum", None)] == 100.052
    assert 'gpufleet_gateway_requests_total{code="200",model="m",tenant="t"} 1.0' in text


@pytest.mark.process
async def test_drain_and_delete_let_requests_in_flight_finish(
    stubs: list[StubBackend], make_gateway: GatewayFactory
) -> None:
    gw = await make_gateway([stubs[0].url, stubs[1].url])
    rid = next(r.replica_id for r in gw.replicas if r.url == stubs[0].url)
    stubs[0].hold = asyncio.Event()
    stubs[1].hold = asyncio.Event()
    async with aiohttp.ClientSession() as s:
        body = {"model": "stub-model", "messages": MSG, "stream": True}
        tasks = [
            asyncio.create_task(s.post(gw.url + "/v1/chat/completions", json=body))
            for _ in range(4)
        ]
        await wait_until(lambda: gw.replicas.by_id[rid].in_flight == 2)
        assert gw.drain_replica(rid)["in_flight"] == 2
        assert gw.remove_replica(rid)["id"] == rid  # requests in flight still finish
        stubs[0].hold.set()
        stubs[1].hold.set()
        for task in tasks:
            resp = await task
            assert resp.status == 200
            assert (await resp.text()).endswith("data: [DONE]\n\n")
        async with s.get(gw.url + "/metrics") as resp:
            text = await resp.text()
    # The removed replica's counters stay in the exposition (counters never go back).
    assert f'gpufleet_gateway_replica_requests_total{{replica="{rid}"}} 2.0' in text


@pytest.mark.process
async def test_queue_depth_by_model_is_exposed_per_model(make_gateway: GatewayFactory) -> None:
    """A model group's KEDA/HPA scaler reads its own model's waiting requests: one series
    per served model, 0 for a model nobody waits for (a scaler reads 0, not "no data")."""
    gw = await make_gateway([], models=["a", "b"], queue={"max_size": 4, "timeout_s": 30})
    async with aiohttp.ClientSession() as s:
        body = {"model": "a", "messages": MSG}
        task = asyncio.create_task(s.post(gw.url + "/v1/chat/completions", json=body))
        await wait_until(lambda: gw.signals().queue_depth == 1)
        async with s.get(gw.url + "/metrics") as resp:
            text = await resp.text()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert 'gpufleet_gateway_queue_depth_by_model{model="a"} 1.0' in text
    assert 'gpufleet_gateway_queue_depth_by_model{model="b"} 0.0' in text
    assert "gpufleet_gateway_queue_depth 1.0" in text
