"""`gpufleet gateway --workers N`: N gateway processes on one port, one supervisor.

Each worker is a whole `Gateway` (its own event loop, connections, routing state, probes
and outlier detection) listening on the same port with SO_REUSEPORT, so the kernel spreads
client connections over them and the gateway uses N cores. What a worker keeps for itself
is soft state, as for gateways side by side (docs/design.md): in-flight counts and the
prefix index each cover the requests that worker routed.

The supervisor (this module's `WorkerPool`, in the process that started them) keeps the
fleet coherent:
- the admin API, /metrics and routes added with `add_route` are answered here: a worker
  forwards such a request over its control channel, so the answer is the same whichever
  worker the connection landed on;
- replica changes (add, drain, remove, reload) go to every worker, and are replayed to a
  worker that restarts after a crash;
- /admin/signals (what the autoscaler reads) and /metrics merge every worker's view:
  counts add up, latency percentiles are over all workers' samples;
- what each worker routes (prompt blocks per replica, in-flight changes) reaches the
  other workers within a few milliseconds (`fleet_state.peers`), so their prefix indexes
  and load counts cover the whole gateway's traffic. A worker that dies takes its
  in-flight requests with it (the others' counts drop them); one that starts again
  learns the others' in-flight counts, and its prefix index fills up from new traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from gpufleet.errors import UserError
from gpufleet.fleet_state import GatewaySignals, LatencyWindows, PeerEvents, merge_signals
from gpufleet.gateway.admin import AdminApi, build_router
from gpufleet.gateway.channel import LINE_LIMIT, Channel, ChannelError, pack_bytes, unpack_bytes
from gpufleet.gateway.config import GatewayConfig, load_config
from gpufleet.gateway.routes import Reply, RouteHandler, error_reply

log = logging.getLogger("gpufleet.gateway")
_RESTART_DELAY_S = 1.0


class ForwardedRequest:
    """A request a worker forwarded, as route handlers read it."""

    __slots__ = ("body", "headers", "method", "params")

    def __init__(self, method: str, body: bytes, headers: dict[str, str]) -> None:
        self.method = method.encode()
        self.body = body
        self.headers = {k.lower(): v for k, v in headers.items()}
        self.params: dict[str, str] = {}

    def header(self, lname: bytes) -> bytes | None:
        value = self.headers.get(lname.decode("latin-1"))
        return None if value is None else value.encode("latin-1")


class SupervisorMetrics:
    """Collectors of the supervisor's process (e.g. `gpufleet up`'s autoscaler), exposed
    on /metrics after the workers' merged samples."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()


class WorkerPool:
    def __init__(
        self,
        config: GatewayConfig,
        *,
        config_path: str | None = None,
        workers: int = 2,
        log_level: str = "WARNING",
    ) -> None:
        self.config = config
        self.log_level = log_level
        self.config_path = config_path
        self.workers = workers
        self.host = config.host
        self.port: int | None = None
        self._admin = AdminApi(self)
        self.router = build_router(self._admin)
        self.metrics = SupervisorMetrics()
        self._channels: dict[int, Channel] = {}
        self._procs: dict[int, asyncio.subprocess.Process] = {}
        self._ops: list[tuple[str, dict[str, Any]]] = []  # replayed to restarted workers
        self._in_flight: dict[int, dict[str, int]] = {}  # per worker, per replica id
        self._ready: dict[int, asyncio.Event] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._port_guard: socket.socket | None = None
        self._server: asyncio.AbstractServer | None = None

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self, host: str | None = None, port: int | None = None) -> int:
        """Start the workers on host:port (0: any free port); returns the port once every
        worker listens."""
        self.host = host if host is not None else self.config.host
        want = self.config.port if port is None else port
        # Hold the port (bound, not listening) so that every worker binds the same one.
        guard = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        guard.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        guard.bind((self.host, want))
        self._port_guard = guard
        self.port = guard.getsockname()[1]
        self._tmp = tempfile.TemporaryDirectory(prefix="gpufleet-gw-")
        control = str(Path(self._tmp.name) / "control.sock")
        config_file = Path(self._tmp.name) / "config.json"
        config_file.write_text(self.config.model_dump_json())
        self._server = await asyncio.start_unix_server(self._accept, control, limit=LINE_LIMIT)
        for i in range(self.workers):
            self._ready[i] = asyncio.Event()
            self._tasks.append(asyncio.create_task(self._keep(i, control, config_file)))
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in self._ready.values())), 60)
        return self.port

    async def _keep(self, index: int, control: str, config_file: Path) -> None:
        """Run worker `index`; start it again if it dies (unless stopping)."""
        argv = [sys.executable, "-m", "gpufleet.gateway.worker", "--index", str(index),
                "--control", control, "--config-file", str(config_file),
                "--host", self.host, "--port", str(self.port),
                "--log-level", self.log_level]  # fmt: skip
        if self.config_path:
            argv += ["--config-path", self.config_path]
        if self.workers > 1:
            argv.append("--peers")
        while not self._stopping:
            proc = await asyncio.create_subprocess_exec(*argv, start_new_session=True)
            self._procs[index] = proc
            code = await proc.wait()
            self._channels.pop(index, None)
            if self._stopping:
                return
            self._worker_gone(index)
            log.error("gateway worker %d exited (%s); starting it again", index, code)
            await asyncio.sleep(_RESTART_DELAY_S)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        channel = Channel(reader, writer, {})
        sender: list[int] = []  # its index, once it said hello

        async def hello(index: int) -> None:
            sender.append(index)
            await self._hello(index, channel)

        async def peer_events(events: dict[str, Any]) -> None:
            if sender:
                self._peer_events(sender[0], events)

        channel.handlers = {"hello": hello, "route": self._route, "peer_events": peer_events}
        await channel.serve()

    async def _hello(self, index: int, channel: Channel) -> None:
        """A worker is up: bring it up to date with the admin changes so far."""
        self._channels[index] = channel
        for op, args in list(self._ops):
            with contextlib.suppress(ChannelError):  # (a change made meanwhile: done)
                await channel.call(op, **args)
        others: dict[str, int] = {}  # the other workers' requests in flight now
        for i, counts in self._in_flight.items():
            for rid, n in counts.items():
                if i != index and n:
                    others[rid] = others.get(rid, 0) + n
        if others:
            channel.notify("peer_events", events=PeerEvents(in_flight=others).to_json())
        self._ready[index].set()

    def _peer_events(self, index: int, raw: dict[str, Any]) -> None:
        """Worker `index` routed these: pass them on to the other workers as they came,
        and keep its net in-flight counts (for workers that start later)."""
        counts = self._in_flight.setdefault(index, {})
        for rid, delta in (raw.get("in_flight") or {}).items():
            counts[rid] = counts.get(rid, 0) + int(delta)
        for i, channel in list(self._channels.items()):
            if i != index:
                channel.notify("peer_events", events=raw)

    def _worker_gone(self, index: int) -> None:
        """Worker `index` died, and its requests with it: the others stop counting them."""
        gone = {k: -v for k, v in self._in_flight.get(index, {}).items() if v}
        if gone:
            self._peer_events(index, PeerEvents(in_flight=gone).to_json())
        self._in_flight.pop(index, None)

    async def stop(self) -> None:
        self._stopping = True
        for proc in self._procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        for proc in self._procs.values():
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        for task in self._tasks:
            task.cancel()
        for channel in self._channels.values():
            channel.close()
        if self._server is not None:
            self._server.close()
        if self._port_guard is not None:
            self._port_guard.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def add_route(self, method: str, path: str, handler: RouteHandler, admin: bool = True) -> None:
        """As `Gateway.add_route`: served here for every worker."""
        self.router.add(method, path, self._admin.admin(handler) if admin else handler)

    # -- forwarded requests -------------------------------------------------------------
    async def _route(
        self, method: str, path: str, body: str, headers: dict[str, str]
    ) -> dict[str, Any]:
        request = ForwardedRequest(method, unpack_bytes(body), headers)
        handler, params, reply = self.router.match(request.method, path.encode())
        if handler is not None:
            request.params = params
            try:
                reply = await handler(request)
            except Exception:
                log.exception("gateway admin request failed")
                reply = error_reply(500, "internal gateway error")
        assert reply is not None
        return {"status": reply.status, "body": pack_bytes(reply.body),
                "content_type": reply.content_type, "headers": reply.headers}  # fmt: skip

    # -- every worker -------------------------------------------------------------------
    async def _all(self, op: str, **args: Any) -> list[Any]:
        channels = list(self._channels.values())
        results = await asyncio.gather(*(c.call(op, **args) for c in channels),
                                       return_exceptions=True)  # fmt: skip
        for r in results:
            if isinstance(r, ChannelError) and r.kind == "KeyError":
                raise KeyError(str(r))
            if isinstance(r, ChannelError) and r.kind == "UserError":
                raise UserError(str(r))
        return [r for r in results if not isinstance(r, BaseException)]

    async def _change(self, op: str, **args: Any) -> dict[str, Any]:
        """A replica change on every worker (and on workers started later)."""
        results = await self._all(op, **args)
        self._ops.append((op, args))
        return dict(results[0]) if results else {}

    async def add_replica(self, url: str, replica_id: str | None = None, pool: str | None = None,
                          models: list[str] | tuple[str, ...] = (),
                          engine: str | None = None) -> dict[str, Any]:  # fmt: skip
        if replica_id is None:  # one id for every worker: the first picks it
            first = next(iter(self._channels.values()))
            replica_id = await first.call("new_id")
        return await self._change("add_replica", url=url, replica_id=replica_id, pool=pool,
                                  models=list(models), engine=engine)  # fmt: skip

    async def drain_replica(self, replica_id: str) -> dict[str, Any]:
        return await self._change("drain_replica", replica_id=replica_id)

    async def undrain_replica(self, replica_id: str) -> dict[str, Any]:
        return await self._change("undrain_replica", replica_id=replica_id)

    async def remove_replica(self, replica_id: str) -> dict[str, Any]:
        return await self._change("remove_replica", replica_id=replica_id)

    async def reload(self) -> dict[str, Any]:
        if not self.config_path:
            raise UserError("no config file to reload", field="--config", fix="start with one")
        load_config(self.config_path)  # refuse a bad file here, with its message
        return (await self._all("reload"))[0]

    async def list_replicas(self) -> list[dict[str, Any]]:
        views = await self._all("replicas")
        if not views:
            return []
        totals: dict[str, dict[str, int]] = {}
        for view in views:
            for r in view:
                t = totals.setdefault(r["id"], {"in_flight": 0, "streaming": 0})
                t["in_flight"] += r["in_flight"]
                t["streaming"] += r["streaming"]
        return [{**r, **totals[r["id"]]} for r in views[0]]

    async def signals(self) -> GatewaySignals:
        parts = await self._all("signals")
        windows = LatencyWindows(self.config.signals_window_s)
        for part in parts:
            windows.merge_json(part["latency"])
        snapshots = [GatewaySignals.from_json(p["signals"]) for p in parts]
        return merge_signals(time.monotonic(), snapshots, windows)

    async def metrics_exposition(self) -> bytes:
        texts = await self._all("metrics")
        merged = merge_expositions([unpack_bytes(t) for t in texts])
        return merged + generate_latest(self.metrics.registry)


def merge_expositions(texts: list[bytes]) -> bytes:
    """Prometheus text expositions of the workers as one: every sample summed over the
    workers (counts, histogram buckets and sums, in-flight gauges), the replica-state
    gauge as the most any worker says."""
    families: dict[str, tuple[list[str], dict[str, float]]] = {}
    for text in texts:
        family = ""
        for line in text.decode().splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                family = line.split(" ", 3)[2]
                comments, _ = families.setdefault(family, ([], {}))
                if line not in comments:
                    comments.append(line)
                continue
            if not line or line.startswith("#"):
                continue
            key, _, value = line.rpartition(" ")
            samples = families.setdefault(family, ([], {}))[1]
            number = float(value)
            if family.endswith("_replica_state"):
                samples[key] = max(samples.get(key, 0.0), number)
            else:
                samples[key] = samples.get(key, 0.0) + number
    out = []
    for comments, samples in families.values():
        out += comments
        out += [f"{k} {v!r}" for k, v in samples.items()]
    return ("\n".join(out) + "\n").encode()


def run_pool(pool: WorkerPool, host: str | None, port: int | None) -> None:
    """Run the workers until SIGINT/SIGTERM, reloading them on SIGHUP (the CLI's loop)."""
    import json
    import signal

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if pool.config_path:
            loop.add_signal_handler(signal.SIGHUP, _later(pool.reload))
        await pool.start(host, port)
        print(json.dumps({"event": "listening", "url": pool.url, "workers": pool.workers}),
              flush=True)  # fmt: skip
        try:
            await stop.wait()
        finally:
            await pool.stop()

    asyncio.run(main())


def _later(coro: Callable[[], Coroutine[Any, Any, Any]]) -> Callable[[], None]:
    """A signal handler that runs `coro` (logging, not raising, what it raises)."""
    tasks: set[asyncio.Task[Any]] = set()

    def done(task: asyncio.Task[Any]) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("config reload refused: %s", task.exception())

    def fire() -> None:
        task = asyncio.get_running_loop().create_task(coro())
        tasks.add(task)
        task.add_done_callback(done)

    return fire


def forwarded_reply(answer: dict[str, Any]) -> Reply:
    """A worker's view of the supervisor's answer to a forwarded request."""
    return Reply(answer["status"], unpack_bytes(answer["body"]), answer["content_type"],
                 answer.get("headers"))  # fmt: skip
