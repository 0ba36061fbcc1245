"""A replica that cannot serve is reported, and requests fail fast with the reason: a real
`gpufleet gateway` process, a port nothing listens on, and a plain OpenAI-compatible server
without /health (probed through /v1/models)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

CLI = [sys.executable, "-c", "from gpufleet.cli import main; main()"]


pytestmark = pytest.mark.process  # starts processes and servers on loopback


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def gateway(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[str, Any]]:
    replicas = request.param
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(
        json.dumps(
            {
                "port": 0,
                "admin_key": "k",
                "replicas": [{"url": u} for u in replicas],
                "health": {"probe_interval_s": 0.2, "probe_timeout_s": 1.0},
            }
        )
    )
    log = tmp_path / "gateway.log"
    with log.open("w") as err:
        proc = subprocess.Popen([*CLI, "gateway", "--config", str(cfg)], stdout=subprocess.PIPE,
                                stderr=err, text=True)  # fmt: skip
        try:
            assert proc.stdout is not None
            url = json.loads(proc.stdout.readline())["url"]
            yield url, log
        finally:
            proc.terminate()
            proc.wait(timeout=10)


DEAD = f"http://127.0.0.1:{_free_port()}"


@pytest.mark.parametrize("gateway", [[DEAD]], indirect=True)
async def test_unreachable_replica_is_reported_and_requests_fail_fast(
    gateway: tuple[str, Path],
) -> None:
    url, log = gateway
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with aiohttp.ClientSession() as s:
        started = time.monotonic()
        async with s.post(url + "/v1/chat/completions", json=body) as r:
            status, err = r.status, (await r.json())["error"]
        waited_s = time.monotonic() - started
        async with s.get(url + "/health") as r:
            health = await r.json()
        async with s.get(url + "/admin/replicas", headers={"Authorization": "Bearer k"}) as r:
            listed = (await r.json())["replicas"]
    # 503 with the reason, after a few failed probes, not after the 60 s queue timeout
    assert status == 503 and err["code"] == 503, err
    assert "can become ready" in err["message"] and "unreachable" in err["message"]
    assert waited_s < 15
    assert health["status"] == "degraded" and health["replicas_ready"] == 0
    (entry,) = health["replicas"].values()
    assert entry["url"] == DEAD and entry["reason"].startswith("unreachable")
    assert listed[0]["reason"].startswith("unreachable") and listed[0]["probe"] == "/health"
    text = log.read_text()
    assert f"({DEAD}) starting: unreachable" in text  # the state and its reason, logged


async def _plain_openai_server() -> tuple[web.AppRunner, str]:
    """An OpenAI-compatible server with no /health (as many are)."""

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "plain", "object": "model"}]})

    async def chat(request: web.Request) -> web.Response:
        return web.json_response({
            "id": "c1", "object": "chat.completion", "created": 0, "model": "plain",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "hello"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        })  # fmt: skip

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]


async def test_server_without_health_is_probed_through_models(tmp_path: Path) -> None:
    runner, plain = await _plain_openai_server()
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(json.dumps({"port": 0, "replicas": [{"url": plain}],
                               "health": {"probe_interval_s": 0.2}}))  # fmt: skip
    proc = await asyncio.create_subprocess_exec(*CLI, "gateway", "--config", str(cfg),
                                                stdout=asyncio.subprocess.PIPE)  # fmt: skip
    try:
        assert proc.stdout is not None
        url = json.loads(await proc.stdout.readline())["url"]
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        out = await client.chat.completions.create(
            model="plain", messages=[{"role": "user", "content": "hi"}]
        )  # waits in the gateway's queue until /v1/models has made the replica ready
        assert out.choices[0].message.content == "hello"
        await client.close()
    finally:
        proc.terminate()
        await proc.wait()
        await runner.cleanup()
