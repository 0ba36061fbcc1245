"""A small OpenAI-compatible streaming server with fixed, known latencies — a stand-in
target for testing the load generator (not an engine: no batching, no KV cache).

Each request streams `max_tokens` words: the first after `ttft_s`, then one every
`itl_s` plus `itl_per_active_s` for every other request in flight (so latency grows
with load). Faults can be injected to exercise the client's error handling.

    python -m gpufleet.bench.stub --port 8000 --ttft-ms 50 --itl-ms 10
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gpufleet.openai_errors import error_json_bytes
from gpufleet.tokenizer import apply_chat_template, default_tokenizer


@dataclass
class StubBehaviour:
    ttft_s: float = 0.0
    itl_s: float = 0.0
    itl_per_active_s: float = 0.0
    include_usage: bool = True  # honour stream_options.include_usage
    chat_role_chunk: bool = True  # chat: first event is a role-only delta with empty content
    fail_every: int = 0  # every Nth request answers 429
    malformed_every: int = 0  # every Nth request sends a chunk that is not JSON
    disconnect_every: int = 0  # every Nth request drops the connection mid-stream
    model: str = "stub-model"


class StubServer:
    def __init__(self, behaviour: StubBehaviour | None = None):
        self.b = behaviour or StubBehaviour()
        self.requests = 0
        self.active = 0
        self.generated_tokens = 0
        self.prompt_tokens = 0
        tok = default_tokenizer()
        self._words = [tok.token_text(i) for i in range(tok.first_word_id, tok.first_word_id + 500)]

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": self.b.model, "object": "model", "root": self.b.model}],
            }
        )

    async def metrics(self, request: web.Request) -> web.Response:
        text = (
            "# TYPE vllm:request_success counter\n"
            f'vllm:request_success_total{{model_name="{self.b.model}"}} {self.requests}\n'
            "# TYPE vllm:generation_tokens counter\n"
            f'vllm:generation_tokens_total{{model_name="{self.b.model}"}} {self.generated_tokens}\n'
            "# TYPE vllm:prompt_tokens counter\n"
            f'vllm:prompt_tokens_total{{model_name="{self.b.model}"}} {self.prompt_tokens}\n'
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="{self.b.model}"}} {self.active}\n'
        )
        return web.Response(text=text, content_type="text/plain")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body: Any = await request.json()
            if not isinstance(body, dict):
                raise ValueError
        except ValueError:
            return _error(400, "body must be a JSON object")
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 16
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return _error(400, "max_tokens must be a positive integer", param="max_tokens")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list):
                return _error(400, "messages must be a list", param="messages")
            prompt_tokens = len(apply_chat_template(messages).split())
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                return _error(400, "prompt must be a string", param="prompt")
            prompt_tokens = len(prompt.split())
        self.requests += 1
        n = self.requests
        if self.b.fail_every and n % self.b.fail_every == 0:
            return _error(429, "stub: injected rate limit")
        usage = (
            bool((body.get("stream_options") or {}).get("include_usage")) and self.b.include_usage
        )
        self.active += 1
        try:
            return await self._stream(request, chat, n, max_tokens, prompt_tokens, usage)
        except ConnectionResetError:  # the client went away (e.g. after a malformed chunk)
            return web.Response(status=499)
        finally:
            self.active -= 1

    async def _stream(
        self,
        request: web.Request,
        chat: bool,
        n: int,
        max_tokens: int,
        prompt_tokens: int,
        usage: bool,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        rid = f"cmpl-{n}"
        obj = "chat.completion.chunk" if chat else "text_completion"
        created = int(time.time())

        def event(choices: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> bytes:
            payload: dict[str, Any] = {
                "id": rid,
                "object": obj,
                "created": created,
                "model": self.b.model,
                "choices": choices,
            }
            if extra:
                payload.update(extra)
            return b"data: " + json.dumps(payload).encode() + b"\n\n"

        if self.b.ttft_s:
            await asyncio.sleep(self.b.ttft_s)
        if chat and self.b.chat_role_chunk:
            await resp.write(event([{"index": 0, "delta": {"role": "assistant", "content": ""}}]))
        for i in range(max_tokens):
            if i > 0:
                gap = self.b.itl_s + self.b.itl_per_active_s * max(0, self.active - 1)
                if gap:
                    await asyncio.sleep(gap)
            if self.b.malformed_every and n % self.b.malformed_every == 0 and i == max_tokens // 2:
                await resp.write(b"data: {not json\n\n")
                continue
            if (
                self.b.disconnect_every
                and n % self.b.disconnect_every == 0
                and i == max_tokens // 2
            ):
                if request.transport is not None:
                    request.transport.close()  # mid-stream, before the terminating chunk
                return resp
            word = self._words[(n + i) % len(self._words)]
            last = i == max_tokens - 1
            if chat:
                choice: dict[str, Any] = {"index": 0, "delta": {"content": word}}
            else:
                choice = {"index": 0, "text": word}
            choice["finish_reason"] = "length" if last else None
            await resp.write(event([choice]))
            self.generated_tokens += 1
        self.prompt_tokens += prompt_tokens
        if usage:
            u = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": max_tokens,
                "total_tokens": prompt_tokens + max_tokens,
            }
            await resp.write(event([], {"usage": u}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=error_json_bytes(message, status, param=param),
        content_type="application/json",
    )


async def serve(server: StubServer, host: str, port: int) -> None:
    """Serve until cancelled; prints the bound port (so --port 0 works for tests)."""
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    print(f"stub listening on http://{host}:{bound}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    ap.add_argument("--ttft-ms", type=float, default=0.0)
    ap.add_argument("--itl-ms", type=float, default=0.0)
    ap.add_argument("--itl-per-active-ms", type=float, default=0.0)
    ap.add_argument("--fail-every", type=int, default=0, help="every Nth request answers 429")
    ap.add_argument(
        "--malformed-every", type=int, default=0, help="every Nth stream has a bad chunk"
    )
    ap.add_argument("--disconnect-every", type=int, default=0, help="every Nth stream is cut")
    ap.add_argument("--no-usage", action="store_true", help="never send the usage event")
    ap.add_argument("--model", default="stub-model")
    args = ap.parse_args()
    behaviour = StubBehaviour(
        ttft_s=args.ttft_ms / 1000,
        itl_s=args.itl_ms / 1000,
        itl_per_active_s=args.itl_per_active_ms / 1000,
        include_usage=not args.no_usage,
        fail_every=args.fail_every,
        malformed_every=args.malformed_every,
        disconnect_every=args.disconnect_every,
        model=args.model,
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(StubServer(behaviour), args.host, args.port))


if __name__ == "__main__":
    main()
