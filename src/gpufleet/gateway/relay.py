"""Relaying a stream from a replica to its client, from the connections' own callbacks.

Each chunk a replica sends is written to the client inside the upstream connection's
`data_received` (no task switch, no timer per chunk): that is what holds many thousands
of slow streams on one core. Per chunk the relay only:
- holds back an incomplete trailing event, so the client only ever has whole events (a
  stream resumed elsewhere continues after the last whole one);
- stops at an in-band error event from the engine (`data: {"error": ...}`) instead of
  forwarding it, so the failover can resume;
- keeps what was sent (`continuation.Transcript`), counts events, observes the gap since
  the last chunk;
- pauses reading the replica while the client does not keep up.

One `StallWatch` per gateway ends relays whose replica has sent nothing for longer than
the inter-token timeout (skipping rounds in which the gateway itself was late).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from gpufleet.gateway.continuation import Splicer, Transcript, event_boundary
from gpufleet.gateway.http_adapters import Out
from gpufleet.gateway.upstream import UpstreamResponse, UpstreamTimeout

_ERROR_EVENT = b'{"error"'
_DONE = b"[DONE]"


class Broken:
    """Why a stream ended before its [DONE]: `kind` is reset, eof, stall, engine_error or
    client (the client left: nothing to resume and no one to blame)."""

    __slots__ = ("kind", "message")

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        self.message = message

    @property
    def replica_failed(self) -> bool:
        return self.kind != "client"


class StreamRelay:
    __slots__ = ("_pending", "_saw_done", "client_paused", "done", "events", "itl", "last_s",
                 "out", "replica", "splice", "timeout_s", "transcript", "upstream")  # fmt: skip

    def __init__(
        self,
        out: Out,
        upstream: UpstreamResponse,
        transcript: Transcript,
        splice: Splicer | None,
        replica: Any,
        itl: Any,
        timeout_s: float,
    ) -> None:
        self.out = out
        self.upstream = upstream
        self.transcript = transcript
        self.splice = splice  # rewrites a resumed stream's events (None: the first part)
        self.replica = replica
        self.itl = itl  # the inter-token latency histogram
        self.timeout_s = timeout_s
        self.done: asyncio.Future[Broken | None] = asyncio.get_running_loop().create_future()
        self.last_s = time.monotonic()
        self.events = 0
        self.client_paused = False
        self._pending = b""
        self._saw_done = False

    # -- upstream.Sink ------------------------------------------------------------------
    def on_data(self, data: bytes) -> None:
        if self.done.done():
            return
        self.replica.rx_chunks += 1
        now_s = time.monotonic()
        if self.events:  # not the stream's first chunk
            self.itl.observe(now_s - self.last_s)
        self.last_s = now_s
        if self._pending:
            data = self._pending + data
            self._pending = b""
        if not (data.endswith(b"\n\n") or data.endswith(b"\r\n\r\n")):
            cut = event_boundary(data)
            self._pending = data[cut:]
            data = data[:cut]
            if not data:
                return
        broken = None
        at = data.find(_ERROR_EVENT)
        if at >= 0:  # the engine failed in-band: forward what came before its error event
            cut = event_boundary(data[:at])
            broken = Broken("engine_error", data[at : at + 300].decode("utf-8", "replace"))
            data = data[:cut]
        if self.splice is not None and data:
            data = self.splice.rewrite(data)
        if data:
            self._relay(data)
        if broken is not None:
            self._end(broken)

    def _relay(self, data: bytes) -> None:
        self.transcript.add(data)
        self.events += data.count(b"data:")
        if data.endswith(b"[DONE]\n\n") or data.endswith(b"[DONE]\r\n\r\n"):
            self._saw_done = True
        try:
            if not self.out.push(data):
                self.client_paused = True
                self.upstream.pause_reading()
                self.out.drained().add_done_callback(self._client_drained)
        except (ConnectionError, OSError) as exc:
            self._end(Broken("client", f"the client left: {exc}"))

    def _client_drained(self, fut: asyncio.Future[None]) -> None:
        self.client_paused = False
        self.last_s = time.monotonic()  # the replica was waiting on us, not stalled
        if fut.cancelled() or fut.exception() is not None:
            self._end(Broken("client", "the client left"))
        elif not self.done.done():
            self.upstream.resume_reading()

    def on_end(self) -> None:
        if self._saw_done and not self._pending:
            self._end(None)
        else:
            self._end(Broken("eof", "the replica's stream ended without [DONE]"))

    def on_error(self, exc: BaseException) -> None:
        kind = "stall" if isinstance(exc, UpstreamTimeout) else "reset"
        self._end(Broken(kind, f"the replica's stream broke: {exc}"))

    # -- ends ---------------------------------------------------------------------------
    def stalled(self) -> None:
        self._end(Broken("stall", f"the replica sent nothing for {self.timeout_s:g} s"))

    def _end(self, outcome: Broken | None) -> None:
        if not self.done.done():
            self.done.set_result(outcome)


class StallWatch:
    """Ends relays whose replica went silent for longer than their timeout (one task for
    all streams instead of a timer per chunk)."""

    def __init__(self, period_s: float) -> None:
        self.period_s = period_s
        self.active: set[StreamRelay] = set()

    async def run(self) -> None:
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(self.period_s)
            now_s = time.monotonic()
            if now_s - t0 > 1.5 * self.period_s + 0.05:
                continue  # the gateway itself was late: let what arrived meanwhile in first
            for relay in list(self.active):
                if not relay.client_paused and now_s - relay.last_s > relay.timeout_s:
                    relay.stalled()

    async def relay(self, relay: StreamRelay, first: bytes) -> Broken | None:
        """Relay `first` and everything after it; the outcome (None: a clean end)."""
        self.active.add(relay)
        try:
            relay.on_data(first)
            relay.upstream.attach(relay)
            return await relay.done
        finally:
            self.active.discard(relay)
            with contextlib.suppress(Exception):
                relay.upstream.resume_reading()
