"""A small OpenAI-ish backend for gateway tests, served in-process on 127.0.0.1.

Used where a test needs to control the replica exactly (record the bytes it received,
fail with a 5xx, break a stream mid-way, notice a client disconnect). The integration
tests against real `gpufleet replica` processes live in test_replica_integration.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from aiohttp import web


class StubBackend:
    def __init__(self, name: str, models: tuple[str, ...] = ("stub-model",)) -> None:
        self.name = name
        self.models = models
        self.received: list[bytes] = []
        self.received_headers: list[dict[str, str]] = []
        self.peer_ports: list[int] = []  # the client port of each request (connection reuse)
        self.fail_status: int | None = None  # answer every completion with this status
        self.break_after_chunks: int | None = None  # drop the connection mid-stream
        self.hold: asyncio.Event | None = None  # completions wait for this before answering
        self.gate: asyncio.Event | None = None  # streams pause after their first chunk
        self.disconnected = asyncio.Event()  # set when a held request's client went away
        self.healthy = True
        self.chunks = 5
        self.chunk_delay_s = 0.0
        self.num_running = 0
        self.on_metrics: Callable[[], None] | None = None  # called on each GET /metrics
        self.metrics_hits = 0
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> StubBackend:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_post("/v1/completions", self._complete)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def _models(self, request: web.Request) -> web.Response:
        data = [{"id": m, "object": "model", "created": 1, "owned_by": self.name}
                for m in self.models]  # fmt: skip
        return web.json_response({"object": "list", "data": data})

    async def _metrics(self, request: web.Request) -> web.Response:
        self.metrics_hits += 1
        if self.on_metrics is not None:
            self.on_metrics()
        text = (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="m"}} {self.num_running}\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            'vllm:num_requests_waiting{model_name="m"} 2\n'
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            'vllm:kv_cache_usage_perc{model_name="m"} 0.25\n'
        )
        return web.Response(text=text, content_type="text/plain")

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.received.append(raw)
        self.received_headers.append(dict(request.headers))
        assert request.transport is not None
        self.peer_ports.append(request.transport.get_extra_info("peername")[1])
        if self.fail_status is not None:
            return web.json_response(
                {"error": {"message": "stub failure", "type": "x", "param": None, "code": 1}},
                status=self.fail_status,
            )
        if self.hold is not None:
            try:
                await self.hold.wait()
            except asyncio.CancelledError:
                self.disconnected.set()
                raise
        body = json.loads(raw)
        chat = request.path.endswith("chat/completions")
        if not body.get("stream"):
            if self.chunk_delay_s:
                await asyncio.sleep(self.chunk_delay_s * self.chunks)
            return web.json_response(self._full(body, chat))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for i in range(self.chunks):
                if self.break_after_chunks is not None and i == self.break_after_chunks:
                    assert request.transport is not None
                    request.transport.close()  # the replica "dies" mid-stream
                    return resp
                await resp.write(f"data: {json.dumps(self._chunk(body, chat, i))}\n\n".encode())
                if i == 0 and self.gate is not None:
                    await self.gate.wait()
                if self.hold is not None or self.chunk_delay_s:
                    await asyncio.sleep(self.chunk_delay_s or 0.01)
            if (body.get("stream_options") or {}).get("include_usage"):  # as vLLM: last
                usage = {"prompt_tokens": 7, "completion_tokens": self.chunks,
                         "total_tokens": 7 + self.chunks}  # fmt: skip
                event = {"id": f"cmpl-{self.name}", "choices": [], "usage": usage}
                await resp.write(f"data: {json.dumps(event)}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
        except asyncio.CancelledError:
            self.disconnected.set()
            raise
        return resp

    def _full(self, body: dict[str, Any], chat: bool) -> dict[str, Any]:
        text = " ".join(f"w{i}" for i in range(self.chunks))
        choice: dict[str, Any] = (
            {"index": 0, "message": {"role": "assistant", "content": text},
             "finish_reason": "stop"}
            if chat
            else {"index": 0, "text": text, "finish_reason": "stop"}
        )  # fmt: skip
        return {
            "id": f"cmpl-{self.name}",
            "object": "chat.completion" if chat else "text_completion",
            "created": 1,
            "model": body["model"],
            "choices": [choice],
            "usage": {"prompt_tokens": 1, "completion_tokens": self.chunks, "total_tokens": 6},
            "served_by": self.name,
        }

    def _chunk(self, body: dict[str, Any], chat: bool, i: int) -> dict[str, Any]:
        choice: dict[str, Any] = (
            {"index": 0, "delta": {"content": f" w{i}"}, "finish_reason": None}
            if chat
            else {"index": 0, "text": f" w{i}", "finish_reason": None}
        )
        return {
            "id": f"cmpl-{self.name}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": 1,
            "model": body["model"],
            "choices": [choice],
        }
