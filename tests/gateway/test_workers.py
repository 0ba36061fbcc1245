"""`gpufleet gateway --workers 2`: two gateway processes on one port, one supervisor; the
admin API, /metrics and the autoscaler's signals answer as one gateway whichever worker
a connection lands on; a worker that dies is started again with the fleet's changes."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from gpufleet.fleet_state import PeerEvents
from gpufleet.gateway.config import validate_config
from gpufleet.gateway.workers import WorkerPool, merge_expositions

from .conftest import ADMIN_KEY, wait_until
from .stub_backend import StubBackend

pytestmark = pytest.mark.process  # every test here starts processes or servers

AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
BODY = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}


@pytest.fixture
async def pool(stubs: list[StubBackend]) -> AsyncIterator[WorkerPool]:
    cfg = validate_config({"admin_key": ADMIN_KEY, "replicas": [{"url": stubs[0].url}],
                           "health": {"probe_interval_s": 0.1}, "scrape_interval_s": 0.1})  # fmt: skip
    p = WorkerPool(cfg, workers=2)
    await p.start("127.0.0.1", 0)
    try:
        yield p
    finally:
        await p.stop()


async def _get(s: aiohttp.ClientSession, url: str) -> Any:
    async with s.get(url, headers=AUTH) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json() if "json" in resp.content_type else await resp.text()


async def test_workers_answer_as_one_gateway(pool: WorkerPool, stubs: list[StubBackend]) -> None:
    async with aiohttp.ClientSession() as s:
        for _ in range(100):  # until both workers have the replica ready
            if (await _get(s, pool.url + "/admin/signals"))["replicas_by_state"]["ready"] == 1:
                break
            await asyncio.sleep(0.1)
        # Fresh connections land on both workers (SO_REUSEPORT): 40 requests, 40 answers.
        for _ in range(40):
            async with (
                aiohttp.ClientSession() as fresh,
                fresh.post(pool.url + "/v1/chat/completions", json=BODY) as resp,
            ):
                assert resp.status == 200
                assert (await resp.text()).endswith("data: [DONE]\n\n")
        # An added replica reaches every worker, with one id.
        async with s.post(pool.url + "/admin/replicas", json={"url": stubs[1].url},
                          headers=AUTH) as resp:  # fmt: skip
            assert resp.status == 201
            added = (await resp.json())["id"]
        for _ in range(100):
            listed = (await _get(s, pool.url + "/admin/replicas"))["replicas"]
            if all(r["state"] == "ready" for r in listed) and len(listed) == 2:
                break
            await asyncio.sleep(0.1)
        assert sorted(r["id"] for r in listed) == sorted(["r1", added])
        # Metrics and signals add up over the workers.
        text = await _get(s, pool.url + "/metrics")
        total = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                    if line.startswith("gpufleet_gateway_requests_total"))  # fmt: skip
        assert total == 40
        signals = await _get(s, pool.url + "/admin/signals")
        assert signals["streamed_requests_in_window"] == 40
        assert signals["ttft_s"]["p50"] is not None
        # Every worker served some (the kernel spread the connections).
        per_worker = [await p.call("signals") for p in pool._channels.values()]
        assert all(p["signals"]["streamed_requests_in_window"] > 0 for p in per_worker)
        # Drained, then taken back (a scale-out): every worker routes to it again.
        for op, state in (("drain", "draining"), ("undrain", "ready")):
            async with s.post(pool.url + f"/admin/replicas/{added}/{op}", headers=AUTH) as resp:
                assert resp.status == 200 and (await resp.json())["state"] == state
        views = [await p.call("replicas") for p in pool._channels.values()]
        assert all(r["state"] == "ready" for view in views for r in view)
        # A worker that dies comes back, with the replica added meanwhile.
        victim = pool._procs[0]
        os.kill(victim.pid, signal.SIGKILL)
        await wait_until(lambda: pool._procs[0] is not victim and 0 in pool._channels, 30)
        fresh_view = await pool._channels[0].call("replicas")
        assert sorted(r["id"] for r in fresh_view) == sorted(["r1", added])
        async with s.delete(pool.url + f"/admin/replicas/{added}", headers=AUTH) as resp:
            assert resp.status == 200
        async with s.delete(pool.url + f"/admin/replicas/{added}", headers=AUTH) as resp:
            assert resp.status == 404
        async with s.get(pool.url + "/admin/replicas") as resp:
            assert resp.status == 401  # the admin key is checked whichever worker answers


async def test_workers_share_prefixes_so_a_long_prefix_stays_on_one_replica(
    stubs: list[StubBackend],
) -> None:
    """Issue 13: requests with one long prefix, on fresh connections (so on either worker),
    all go to one replica: each worker learns what the other routed. Without sharing, the
    worker that did not route a document's first request places it by load alone."""
    cfg = validate_config({"replicas": [{"url": b.url} for b in stubs],
                           "policy": "prefix_aware", "health": {"probe_interval_s": 0.1},
                           "scrape_interval_s": 0.1})  # fmt: skip
    p = WorkerPool(cfg, workers=2)
    await p.start("127.0.0.1", 0)
    docs = [f"document {d}: " + " ".join(f"word{d}x{i}" for i in range(600)) for d in range(6)]
    try:
        for _ in range(100):  # until both workers route to both replicas
            views = [await c.call("replicas") for c in p._channels.values()]
            if all(r["state"] == "ready" for v in views for r in v) and len(views) == 2:
                break
            await asyncio.sleep(0.1)

        async def ask(doc: str, question: int) -> None:
            body = {"model": "stub-model", "stream": True,
                    "messages": [{"role": "system", "content": doc},
                                 {"role": "user", "content": f"question {question}"}]}  # fmt: skip
            async with (
                aiohttp.ClientSession() as fresh,
                fresh.post(p.url + "/v1/chat/completions", json=body) as resp,
            ):
                assert resp.status == 200
                await resp.text()

        for doc in docs:
            await ask(doc, 0)
        # Until every first request's routing has reached the other worker (no fixed wait:
        # the batches are sent after 2 ms, but a loaded machine may take longer).
        for _ in range(300):
            learned = [(await c.call("signals"))["peer_decisions_applied"]
                       for c in p._channels.values()]  # fmt: skip
            if sum(learned) >= len(docs):
                break
            await asyncio.sleep(0.05)
        assert sum(learned) == len(docs), learned
        for question in range(1, 6):
            for doc in docs:
                await ask(doc, question)
        per_worker = [await c.call("signals") for c in p._channels.values()]
        assert all(w["signals"]["streamed_requests_in_window"] > 0 for w in per_worker)
        for d in range(6):
            holders = [b.name for b in stubs for raw in b.received if f"word{d}x1 ".encode() in raw]
            assert len(holders) == 6
            assert len(set(holders)) == 1, f"document {d} went to {holders}"
    finally:
        await p.stop()


class _Notified:
    """A worker's control channel as the supervisor uses it, recording notifications."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def notify(self, method: str, **args: Any) -> None:
        assert method == "peer_events"
        self.sent.append(args["events"]["in_flight"])


async def test_supervisor_relays_in_flight_and_drops_a_dead_workers_requests() -> None:
    p = WorkerPool(validate_config({}), workers=3)
    ch = {i: _Notified() for i in range(3)}
    p._channels = ch  # type: ignore[assignment]
    p._peer_events(0, PeerEvents(in_flight={"r1": 2}).to_json())
    p._peer_events(1, PeerEvents(in_flight={"r1": 1, "r2": 1}).to_json())
    assert (ch[0].sent, ch[1].sent, ch[2].sent) == (
        [{"r1": 1, "r2": 1}], [{"r1": 2}], [{"r1": 2}, {"r1": 1, "r2": 1}])  # fmt: skip
    del p._channels[0]  # worker 0 died: its 2 requests on r1 with it
    p._worker_gone(0)
    assert ch[1].sent[-1] == ch[2].sent[-1] == {"r1": -2}
    restarted = _Notified()  # it starts again: told what the others have in flight
    p._ready[0] = asyncio.Event()
    await p._hello(0, restarted)  # type: ignore[arg-type]
    assert restarted.sent == [{"r1": 1, "r2": 1}]


def test_expositions_merge_by_summing_samples() -> None:
    a = (b"# HELP x_total X.\n# TYPE x_total counter\nx_total{a=\"1\"} 2.0\n"
         b"# HELP g_replica_state S.\n# TYPE g_replica_state gauge\n"
         b"g_replica_state{replica=\"r1\",state=\"ready\"} 1.0\n")  # fmt: skip
    b = (b"# HELP x_total X.\n# TYPE x_total counter\nx_total{a=\"1\"} 3.0\nx_total{a=\"2\"} 1.0\n"
         b"# HELP g_replica_state S.\n# TYPE g_replica_state gauge\n"
         b"g_replica_state{replica=\"r1\",state=\"ready\"} 1.0\n")  # fmt: skip
    merged = merge_expositions([a, b]).decode().splitlines()
    assert merged == ["# HELP x_total X.", "# TYPE x_total counter", 'x_total{a="1"} 5.0',
                      'x_total{a="2"} 1.0', "# HELP g_replica_state S.",
                      "# TYPE g_replica_state gauge",
                      'g_replica_state{replica="r1",state="ready"} 1.0']  # fmt: skip
