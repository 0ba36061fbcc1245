"""Probes against real servers on loopback: healthy, without /health, failing, unreachable."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gpufleet.gateway.probe_reasons import probe

pytestmark = pytest.mark.process  # starts processes and servers on loopback


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def _answer(status: int = 200, body: Any = None) -> Any:
    async def handler(request: web.Request) -> web.Response:
        if body is None:
            return web.Response(status=status)
        return web.json_response(body, status=status)

    return handler


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def test_plain_openai_server_is_probed_through_models(session: aiohttp.ClientSession) -> None:
    app = web.Application()
    cards = {"object": "list", "data": [{"id": "m", "object": "model"}]}
    app.router.add_get("/v1/models", _answer(body=cards))
    runner, url = await _serve(app)
    try:
        p = await probe(session, url, 2.0)
        assert p.ok and p.uses_models_probe and p.model_cards == cards["data"]
        assert "no /health" in p.reason
        again = await probe(session, url, 2.0, models_probe=True)
        assert again.ok
    finally:
        await runner.cleanup()


async def test_failures_say_why(session: aiohttp.ClientSession) -> None:
    app = web.Application()
    app.router.add_get("/health", _answer(503))
    runner, url = await _serve(app)
    try:
        p = await probe(session, url, 2.0)
        assert not p.ok and p.reason == "GET /health answered 503"
    finally:
        await runner.cleanup()
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    p = await probe(session, f"http://127.0.0.1:{free}", 2.0)
    assert not p.ok and p.reason.startswith("unreachable: nothing accepts connections")
    empty = web.Application()
    empty.router.add_get("/v1/models", _answer(body={"data": []}))
    runner, url = await _serve(empty)
    try:
        p = await probe(session, url, 2.0)
        assert not p.ok and p.reason == "no /health, and GET /v1/models lists no model"
    finally:
        await runner.cleanup()
