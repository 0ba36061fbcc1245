"""A lean OpenAI-compatible backend that holds many slow streams for little CPU.

Every streamed answer sends one vLLM-shaped token event every `interval_s` (2 tokens/s by
default) for `max_tokens` tokens, then usage (when asked) and `[DONE]`. One timer task
serves all streams (they are bucketed by their next due tick), so 10,000 concurrent
streams cost a fraction of a core: what is measured in front of it is the proxy. Also
answers /health, /v1/models and /metrics, so gateways and routers take it as a replica.

    python -m gpufleet.bench.slow_stub --port 8001 [--interval-ms 500] [--model stub-model]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from collections import defaultdict

import httptools

_TICK_S = 0.01


class _Stream:
    __slots__ = ("chat", "conn", "left", "sent", "usage")

    def __init__(self, conn: _Conn, tokens: int, chat: bool, usage: bool) -> None:
        self.conn = conn
        self.left = tokens
        self.sent = 0
        self.chat = chat
        self.usage = usage


class SlowStub:
    def __init__(self, model: str = "stub-model", interval_s: float = 0.5) -> None:
        self.model = model
        self.interval_s = interval_s
        self.due: defaultdict[int, list[_Stream]] = defaultdict(list)  # tick -> streams
        self.tick = 0
        self.active = 0
        self.served = 0
        m = json.dumps(model)
        self._chat_event = ('data: {"id":"chatcmpl-stub","object":"chat.completion.chunk",'
                            f'"created":0,"model":{m},"choices":[{{"index":0,"delta":'
                            '{"content":" w"},"finish_reason":%s}]}\n\n')  # fmt: skip
        self._text_event = ('data: {"id":"cmpl-stub","object":"text_completion","created":0,'
                            f'"model":{m},"choices":[{{"index":0,"text":" w",'
                            '"finish_reason":%s}]}\n\n')  # fmt: skip
        self.models_body = json.dumps({"object": "list", "data": [
            {"id": model, "object": "model", "created": 0, "owned_by": "stub"}]}).encode()  # fmt: skip

    def every_s(self) -> int:
        return max(1, round(self.interval_s / _TICK_S))

    def start_stream(self, stream: _Stream) -> None:
        self.active += 1
        stream.conn.write_chunk(self._event(stream))  # the first token at once
        self.due[self.tick + self.every_s()].append(stream)

    def _event(self, stream: _Stream) -> bytes:
        stream.left -= 1
        stream.sent += 1
        finish = '"length"' if stream.left <= 0 else "null"
        data = (self._chat_event if stream.chat else self._text_event) % finish
        if stream.left <= 0:
            if stream.usage:
                data += ('data: {"id":"stub","object":"chat.completion.chunk","created":0,'
                         f'"model":"{self.model}","choices":[],"usage":{{"prompt_tokens":1,'
                         f'"completion_tokens":{stream.sent},'
                         f'"total_tokens":{stream.sent + 1}}}}}\n\n')  # fmt: skip
            data += "data: [DONE]\n\n"
        return data.encode()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        while True:
            self.tick += 1
            await asyncio.sleep(max(0.0, start + self.tick * _TICK_S - loop.time()))
            streams = self.due.pop(self.tick, None)
            if not streams:
                continue
            later = self.tick + self.every_s()
            for s in streams:
                if s.conn.closed:
                    self.active -= 1
                    continue
                s.conn.write_chunk(self._event(s))
                if s.left > 0:
                    self.due[later].append(s)
                else:
                    s.conn.end_stream()
                    self.active -= 1
                    self.served += 1


class _Conn(asyncio.Protocol):
    def __init__(self, stub: SlowStub) -> None:
        self.stub = stub
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._url = b""
        self._body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.closed = True
            if self.transport is not None:
                self.transport.close()

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        url, body = self._url, b"".join(self._body)
        self._url, self._body = b"", []
        stub = self.stub
        if url == b"/v1/models":
            return self._send(200, stub.models_body, b"application/json")
        if url == b"/metrics":
            return self._send(200, b"vllm:num_requests_running %d\n" % stub.active, b"text/plain")
        if not url.endswith(b"completions"):
            return self._send(200, b"", b"text/plain")
        try:
            req = json.loads(body)
            tokens = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
        except (ValueError, TypeError, AttributeError):
            return self._send(400, b'{"error":{"message":"bad request","type":"BadRequestError",'
                                   b'"param":null,"code":400}}', b"application/json")  # fmt: skip
        usage = bool((req.get("stream_options") or {}).get("include_usage"))
        stream = _Stream(self, max(1, tokens), url.endswith(b"chat/completions"), usage)
        assert self.transport is not None
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
        stub.start_stream(stream)

    def _send(self, status: int, body: bytes, ctype: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(b"HTTP/1.1 %d X\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
                                 % (status, ctype, len(body), body))  # fmt: skip

    def write_chunk(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(b"%x\r\n%s\r\n" % (len(data), data))

    def end_stream(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(b"0\r\n\r\n")


async def serve(stub: SlowStub, host: str, port: int, backlog: int = 4096) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Conn(stub), host, port, backlog=backlog)
    print(f"slow stub listening on http://{host}:{server.sockets[0].getsockname()[1]}",
          flush=True)  # fmt: skip
    await stub.run()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8001)
    ap.add_argument("--interval-ms", type=float, default=500.0, help="between tokens")
    ap.add_argument("--model", default="stub-model")
    args = ap.parse_args()
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(SlowStub(args.model, args.interval_ms / 1000), args.host, args.port))


if __name__ == "__main__":
    main()
