"""One worker process of `gpufleet gateway --workers N` (started by `workers.WorkerPool`).

A whole `Gateway` on the shared port (SO_REUSEPORT), plus its control channel to the
supervisor: it answers the supervisor's calls (replica changes, its signals, replicas
and metrics) and forwards to it every request that is not a completion, /v1/models or
/health, so that the admin API and /metrics answer the same on every worker. It exits
when the supervisor goes away.

    python -m gpufleet.gateway.worker --index I --control SOCK --config-file JSON
        --host H --port P [--config-path YAML]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import time
from pathlib import Path
from typing import Any

from gpufleet.fleet_state import PeerEvents
from gpufleet.gateway.channel import LINE_LIMIT, Channel, pack_bytes
from gpufleet.gateway.config import GatewayConfig
from gpufleet.gateway.routes import Reply, RouteRequest
from gpufleet.gateway.server import Gateway
from gpufleet.gateway.workers import forwarded_reply

log = logging.getLogger("gpufleet.gateway")
_LOCAL = ("/v1/models", "/health")  # answered by the worker itself
# How long routing events wait to be sent to peer workers: short against a request's
# time on a replica (peers' view lags by about this), long enough to batch a burst.
PEER_BATCH_S = 0.002


def handlers(gw: Gateway) -> dict[str, Any]:
    """What the supervisor may ask of this worker."""

    async def add_replica(url: str, replica_id: str, pool: str | None, models: list[str],
                          engine: str | None = None) -> dict[str, Any]:  # fmt: skip
        return gw.add_replica(url, replica_id, pool, models, engine)

    async def drain_replica(replica_id: str) -> dict[str, Any]:
        return gw.drain_replica(replica_id)

    async def undrain_replica(replica_id: str) -> dict[str, Any]:
        return gw.undrain_replica(replica_id)

    async def remove_replica(replica_id: str) -> dict[str, Any]:
        return gw.remove_replica(replica_id)

    async def reload() -> dict[str, Any]:
        return gw.reload()

    async def new_id() -> str:
        return gw.replicas.new_id()

    async def replicas() -> list[dict[str, Any]]:
        return gw.list_replicas()

    async def signals() -> dict[str, Any]:
        return {"signals": gw.signals().to_json(), "latency": gw.fleet.latency.to_json(),
                "peer_decisions_applied": gw.fleet.peer_decisions_applied}  # fmt: skip

    async def metrics() -> str:
        return pack_bytes(gw.metrics_exposition())

    async def peer_events(events: dict[str, Any]) -> None:
        gw.fleet.apply_peer_events(PeerEvents.from_json(events))

    return {"add_replica": add_replica, "drain_replica": drain_replica,
            "undrain_replica": undrain_replica,
            "remove_replica": remove_replica, "reload": reload, "new_id": new_id,
            "replicas": replicas, "signals": signals, "metrics": metrics,
            "peer_events": peer_events}  # fmt: skip


def share_routing(gw: Gateway, channel: Channel) -> None:
    """Send what this worker routes to the supervisor (for the other workers) in batches:
    the first event of a batch schedules its send `PEER_BATCH_S` later, so a burst of
    requests costs one message, and a quiet worker sends none."""
    loop = asyncio.get_running_loop()
    outbox = gw.fleet.share_with_peers()

    def send() -> None:
        batch = outbox.take()
        if batch:
            channel.notify("peer_events", events=batch.to_json())

    def schedule() -> None:
        loop.call_later(PEER_BATCH_S, send)

    outbox.on_first = schedule


def forward_to(channel: Channel) -> Any:
    """A route handler that asks the supervisor to answer the request."""

    async def forward(request: RouteRequest) -> Reply:
        auth = request.header(b"authorization")
        headers = {"authorization": auth.decode("latin-1")} if auth is not None else {}
        path = getattr(request, "path", b"/").split(b"?", 1)[0].decode("latin-1")
        answer = await channel.call("route", method=request.method.decode("latin-1"),
                                    path=path, body=pack_bytes(request.body), headers=headers)  # fmt: skip
        return forwarded_reply(answer)

    return forward


async def run(args: argparse.Namespace) -> None:
    config = GatewayConfig.model_validate_json(Path(args.config_file).read_text())
    gw = Gateway(config, config_path=args.config_path)
    reader, writer = await asyncio.open_unix_connection(args.control, limit=LINE_LIMIT)
    channel = Channel(reader, writer, handlers(gw))
    gw.router.fallback = forward_to(channel)
    if args.peers:
        share_routing(gw, channel)
    for path in (
        "/admin/replicas",
        "/admin/replicas/{replica_id}/drain",
        "/admin/replicas/{replica_id}/undrain",
        "/admin/replicas/{replica_id}",
        "/admin/signals",
        "/admin/reload",
        "/metrics",
    ):
        gw.router.remove(path)  # fmt: skip
    serving = asyncio.create_task(channel.serve())
    await gw.start(args.host, args.port, reuse_port=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await channel.call("hello", index=args.index)
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        t0 = time.monotonic()
        await gw.stop()
        channel.close()
        log.debug("worker %d stopped in %.2f s", args.index, time.monotonic() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--index", type=int, required=True)
    ap.add_argument("--control", required=True)
    ap.add_argument("--config-file", required=True)
    ap.add_argument("--config-path", default=None)
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--log-level", default="WARNING")
    ap.add_argument("--peers", action="store_true", help="share routing with other workers")
    args = ap.parse_args()
    logging.basicConfig(level=args.log_level.upper(),
                        format=f"%(asctime)s %(levelname)s [worker {args.index}] %(message)s")  # fmt: skip
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
