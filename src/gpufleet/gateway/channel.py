"""Calls between a gateway's supervisor and its workers: JSON lines over a Unix socket.

Either side may call the other (`await channel.call("method", **args)`, or `notify`
without waiting for an answer) and answer calls with its `handlers`; a reply carries the call's id and its `result`, or an `error` that
the caller raises as `ChannelError`. Bytes travel as base64 (`pack_bytes`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger("gpufleet.gateway")
LINE_LIMIT = 256 << 20  # a worker's /metrics or latency samples fit in one line
CallHandler = Callable[..., Awaitable[Any]]


class ChannelError(Exception):
    """The other side failed to answer a call (or the channel closed); `kind` is the
    name of the exception it raised ("" when there was none)."""

    def __init__(self, message: str, kind: str = "") -> None:
        super().__init__(message)
        self.kind = kind


def pack_bytes(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unpack_bytes(text: str) -> bytes:
    return base64.b64decode(text)


class Channel:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        handlers: dict[str, CallHandler],
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.handlers = handlers
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.closed = False

    async def call(self, method: str, /, timeout_s: float = 30.0, **args: Any) -> Any:
        if self.closed:
            raise ChannelError("the channel is closed")
        call_id = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = fut
        self._send({"id": call_id, "method": method, "args": args})
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            raise ChannelError(f"{method}: no answer in {timeout_s:g} s") from None
        finally:
            self._pending.pop(call_id, None)

    def notify(self, method: str, /, **args: Any) -> None:
        """A call that gets no answer (the other side's handler result is dropped)."""
        if not self.closed:
            self._send({"method": method, "args": args})

    def _send(self, message: dict[str, Any]) -> None:
        self.writer.write(json.dumps(message).encode() + b"\n")

    async def serve(self) -> None:
        """Read calls and replies until the other side closes."""
        try:
            while True:
                line = await self.reader.readline()
                if not line:
                    break
                message = json.loads(line)
                if "method" in message:
                    task = asyncio.get_running_loop().create_task(self._answer(message))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                    continue
                fut = self._pending.get(message.get("id"))
                if fut is None or fut.done():
                    continue
                if "error" in message:
                    fut.set_exception(ChannelError(message["error"], message.get("kind", "")))
                else:
                    fut.set_result(message.get("result"))
        except (ConnectionError, ValueError, asyncio.IncompleteReadError) as exc:
            log.warning("control channel broke: %s", exc)
        finally:
            self.close()

    async def _answer(self, message: dict[str, Any]) -> None:
        handler = self.handlers.get(message["method"])
        reply: dict[str, Any] = {"id": message.get("id")}
        try:
            if handler is None:
                raise ChannelError(f"no such call: {message['method']}")
            reply["result"] = await handler(**(message.get("args") or {}))
        except Exception as exc:  # the caller gets it as ChannelError
            reply["error"] = str(exc.args[0]) if exc.args else type(exc).__name__
            reply["kind"] = type(exc).__name__
        if not self.closed and "id" in message:  # (a notification: no answer)
            self._send(reply)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ChannelError("the channel closed"))
        with contextlib.suppress(Exception):
            self.writer.close()
