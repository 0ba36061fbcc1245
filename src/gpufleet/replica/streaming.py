"""Server-sent events for `stream: true`, in vLLM's chunk shapes.

Two paths: plain words (one choice, no logprobs, no script) use pre-serialized chunk
templates and, on HTTP/1.1, write each step's chunk straight from the engine runner to the
socket; everything else (n > 1, logprobs, JSON, tool calls, token ids) builds each chunk as
a dict, choice by choice, as vLLM's serving code does.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from bisect import bisect_left
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gpufleet.replica.output import ChoiceOutput, dumps
from gpufleet.replica.protocol import GenerationParams
from gpufleet.replica.runner import RequestStream
from gpufleet.replica.sse import ChunkTemplates, error_event, escape
from gpufleet.replica.stops import StopScanner

if TYPE_CHECKING:
    from gpufleet.replica.generate import Generator

# per stream: unsent bytes past this go through aiohttp's flow control instead
_MAX_UNSENT_BYTES = 1 << 20


async def _open(request: web.Request) -> tuple[web.StreamResponse, bool]:
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
    )
    chunked = request.version >= (1, 1)  # HTTP/1.0: no chunks, the close ends the body
    if chunked:
        resp.enable_chunked_encoding()
    await resp.prepare(request)
    return resp, chunked


async def stream(
    gen: Generator,
    request: web.Request,
    params: GenerationParams,
    choices: list[ChoiceOutput],
    request_id: str,
) -> web.StreamResponse:
    if params.plain:
        return await _stream_plain(gen, request, params, choices[0].stream, request_id)
    return await _stream_general(gen, request, params, choices, request_id)


async def _stream_general(
    gen: Generator,
    request: web.Request,
    params: GenerationParams,
    choices: list[ChoiceOutput],
    request_id: str,
) -> web.StreamResponse:
    resp, _ = await _open(request)
    chat = params.kind == "chat"
    created = int(time.time())
    head = {
        "id": request_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": params.model,
    }
    req0 = choices[0].req
    continuous = params.continuous_usage_stats

    def chunk(choice_items: list[dict[str, Any]], **extra: Any) -> bytes:
        data = {**head, "choices": choice_items, **extra}
        if continuous:
            data["usage"] = gen.usage(req0.num_prompt_tokens, sum(c.stream.sent for c in choices),
                                      req0.num_prefix_hit_tokens)  # fmt: skip
        return b"data: " + dumps(data) + b"\n\n"

    first = b""
    for c in choices:
        if chat:
            item: dict[str, Any] = {"index": c.index, "delta": {"role": "assistant", "content": ""},
                                    "logprobs": None, "finish_reason": None}  # fmt: skip
            extra = {"prompt_token_ids": params.prompt_token_ids} if params.return_token_ids else {}
            first += chunk([item], **extra)
            if params.echo_prompt:
                first += chunk([{"index": c.index, "delta": {"content": params.echo_prompt},
                                 "logprobs": None, "finish_reason": None}])  # fmt: skip
        elif params.echo_prompt is not None or params.return_token_ids:
            item = {"index": c.index, "text": params.echo_prompt or "", "logprobs": None,
                    "finish_reason": None, "stop_reason": None}  # fmt: skip
            if params.return_token_ids:
                item["prompt_token_ids"] = params.prompt_token_ids
            first += chunk([item])
    if first:
        await resp.write(first)

    wake = asyncio.Event()

    def on_tokens(_: RequestStream) -> None:
        wake.set()

    for c in choices:
        c.stream.on_tokens = on_tokens
    echo_len = len(params.echo_prompt or "") if not chat else 0
    while not all(c.done for c in choices):
        pending = [c for c in choices if not c.done and (
            c.stream.available > c.stream.sent or c.stream.ended)]  # fmt: skip
        if not pending:
            wake.clear()
            # the runner wakes us per step; the timeout only re-checks a dead engine
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), 1.0)
            if gen._engine_failed():
                await resp.write(error_event("the engine died", 500))
                return resp
            continue
        out = b""
        for c in pending:
            offset0 = echo_len + len(c.text)
            text = gen.advance(c)
            positions = c.take_reported()
            if not text and not positions and not c.done:
                continue
            item = {"index": c.index}
            if chat:
                delta = c.chat_delta(text)
                if delta is None:
                    if not c.done:
                        continue
                    delta = {} if c.tool is not None else {"content": ""}
                item["delta"] = delta
                item["logprobs"] = c.chat_logprobs(positions)
            else:
                item["text"] = text
                item["logprobs"] = c.completion_logprobs(positions, offset0)
            item["finish_reason"] = c.api_finish_reason
            item["stop_reason"] = c.stop_reason
            if params.return_token_ids:
                item["token_ids"] = c.token_ids_of(positions)
            out += chunk([item])
            if c.done:
                gen.observe_finished(c.stream, c.stream.sent)
        if out:
            await resp.write(out)
    tail = b""
    if params.include_usage:
        usage = gen.usage(req0.num_prompt_tokens, sum(c.stream.sent for c in choices),
                          req0.num_prefix_hit_tokens)  # fmt: skip
        tail += b"data: " + dumps({**head, "choices": [], "usage": usage}) + b"\n\n"
    await resp.write(tail + b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def _stream_plain(
    gen: Generator,
    request: web.Request,
    params: GenerationParams,
    stream: RequestStream,
    request_id: str,
) -> web.StreamResponse:
    req = stream.req
    resp, chunked = await _open(request)
    chat = params.kind == "chat"
    continuous = params.continuous_usage_stats
    t = ChunkTemplates(
        chat=chat,
        request_id=request_id,
        created=int(time.time()),
        model=params.model,
        prompt_tokens=req.num_prompt_tokens,
        continuous_usage=continuous,
    )
    first = t.role_chunk() if chat else b""
    if params.echo_prompt is not None:
        first += t.text_chunk(escape(params.echo_prompt), 0)
    state: dict[str, Any] = {"first": first, "finish": None, "stop": None}
    scanner = StopScanner(params.stop, params.include_stop_str_in_output)

    # The common chunk (one token, no stop strings, no per-chunk usage), pre-split.
    plain = not params.stop and not continuous
    token_open, token_close = t.token_open, t.token_close
    token_bytes = gen.token_bytes
    all_ids = req.all_token_ids
    base = req.num_prompt_tokens
    observe = gen.observe_tokens

    def take_text() -> tuple[str, int]:
        """Text of the tokens whose time has come and were not sent yet, and their count."""
        start = base + stream.sent
        ids = all_ids[start : base + stream.available]
        stream.sent += len(ids)
        return b"".join([token_bytes[i] for i in ids]).decode(), len(ids)

    def produce() -> bytes:
        """The bytes of the next chunk (tokens whose time has come), or b"" (sync)."""
        sent = stream.sent
        if plain and stream.available == sent + 1 and not stream.ended and sent:
            stream.sent = sent + 1
            observe(stream, 1)
            return token_open + token_bytes[all_ids[base + sent]] + token_close
        if state["finish"] is not None:
            return b""
        out: bytes = state["first"]
        state["first"] = b""
        if stream.available > stream.sent or stream.ended:
            text, n = take_text()
            if n:
                observe(stream, n)
            final = stream.ended and stream.sent >= stream.available
            if params.stop:
                text = scanner.feed(text, final)
                if scanner.matched is not None:
                    state["finish"], state["stop"] = "stop", scanner.matched
            if final and state["finish"] is None:
                state["finish"] = str(req.finish_reason)
            if not text and state["finish"] is None:
                return out  # everything new is held back (it may start a stop string)
            body = text.encode() if not params.stop else escape(text)
        else:
            return out
        return out + t.text_chunk(body, stream.sent, state["finish"], state["stop"])

    transport = request.transport
    if chunked and not params.stop and transport is not None:
        # Fast path: the runner writes each step's chunk straight to the socket (HTTP
        # chunked framing done here), so a token costs no task switch; this handler
        # only wakes at the end to write the usage chunk and [DONE].
        runner = gen.server.runner
        assert runner is not None
        itl = gen.server.metrics.itl
        itl_bounds, itl_counts = itl.bounds, itl.counts

        def push(_: RequestStream) -> None:
            if transport.is_closing():
                return
            if transport.get_write_buffer_size() > _MAX_UNSENT_BYTES:
                # A slow reader: hand back to the handler, whose writes wait for drain.
                stream.on_tokens = None
                stream.wake()
                return
            sent = stream.sent
            last_s = stream.last_token_wall_s
            if plain and stream.available == sent + 1 and last_s is not None and not stream.ended:
                # the hot path, one token mid-stream, inlined: ITL, chunk, write
                now = runner.step_wall_s
                itl_counts[bisect_left(itl_bounds, now - last_s)] += 1
                itl.sum += now - last_s
                stream.last_token_wall_s = now
                stream.sent = sent + 1
                data = token_open + token_bytes[all_ids[base + sent]] + token_close
                transport.write(b"%x\r\n%b\r\n" % (len(data), data))
                return
            data = produce()
            if data:
                transport.write(b"%x\r\n%b\r\n" % (len(data), data))

        stream.on_tokens = push
    while state["finish"] is None:
        await stream.wait()
        if gen._engine_failed():
            await resp.write(error_event("the engine died", 500))
            return resp
        data = produce()
        if data:
            await resp.write(data)
    gen.observe_finished(stream, stream.sent)
    tail = b""
    if params.include_usage:
        tail += t.usage_chunk(gen.usage(req.num_prompt_tokens, stream.sent,
                                        req.num_prefix_hit_tokens))  # fmt: skip
    tail += b"data: [DONE]\n\n"
    await resp.write(tail)
    await resp.write_eof()
    return resp
