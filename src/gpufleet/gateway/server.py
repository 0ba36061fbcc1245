"""The live gateway: OpenAI-compatible HTTP in, one replica chosen by a pure policy, bytes out.

`Gateway` runs standalone (`gpufleet gateway`) or inside another program's event loop
(`gpufleet up`): `await gw.start(host, port)`, `gw.add_replica(url)`, `gw.drain_replica(id)`,
`gw.remove_replica(id)`, `gw.signals()`, `await gw.stop()`.

It is a driver over the pure fleet core (`gpufleet.fleet_state`: replica table, admission
queue, scraped stats, policy notifications, signals), adding sockets and the real clock.
Its parts: `proxy` (a completion request from admission to its last byte), `admission`
(waiting for a replica), `health` (probes and scrapes), `admin` (/v1/models, /health,
/metrics and the admin API as routes), `fast_http` (the one HTTP front: every request on
every connection is parsed and answered there).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client import generate_latest

from gpufleet.errors import UserError
from gpufleet.fleet_state import AdmissionQueue, EngineIdentity, FleetState, GatewaySignals
from gpufleet.gateway.admin import AdminApi, build_router
from gpufleet.gateway.admission import TableChanges
from gpufleet.gateway.config import GatewayConfig, ReplicaConfig, load_config
from gpufleet.gateway.engine_probe import NO_METRICS_ENGINE, no_load_note
from gpufleet.gateway.fast_http import FastFront
from gpufleet.gateway.health import HealthChecks
from gpufleet.gateway.lora_loader import AdapterLoader
from gpufleet.gateway.metrics import GatewayMetrics
from gpufleet.gateway.proxy import Proxy
from gpufleet.gateway.replicas import Replica
from gpufleet.gateway.routes import RouteHandler
from gpufleet.gateway.tenants import TenantTable
from gpufleet.gateway.upstream import UpstreamPool
from gpufleet.routing import make_policy
from gpufleet.routing.types import RoutingPolicy

log = logging.getLogger("gpufleet.gateway")


def build_fleet(cfg: GatewayConfig) -> FleetState[Replica]:
    """The fleet core as the gateway configures it (policies, served models, queue)."""
    tenant_policies: dict[str, RoutingPolicy] = {}
    for t in cfg.tenants:
        if t.policy:
            options = t.policy_options
            if options is None:  # the gateway's options, for the same policy only
                options = cfg.policy_options if t.policy == cfg.policy else {}
            tenant_policies[t.name] = make_policy(t.policy, seed=cfg.seed, **options)
    q = cfg.queue
    default, own = q.limits()
    return FleetState[Replica](
        make_policy(cfg.policy, seed=cfg.seed, **cfg.policy_options),
        tenant_policies=tenant_policies,
        served_models=cfg.models,
        queue=AdmissionQueue(default.max_size, default.timeout_s, default.retry_after_s, own),
        eject_after_failures=cfg.health.eject_after_failures,
        readmit_after_successes=cfg.health.readmit_after_successes,
        signals_window_s=cfg.signals_window_s,
        slow_start_s=cfg.slow_start_s,
        outlier=cfg.outlier.core(),
        adapters=cfg.adapter_specs(),
    )


class Gateway:
    def __init__(self, config: GatewayConfig | None = None, *, config_path: str | None = None):
        self.config = config or GatewayConfig()
        self.config_path = config_path
        cfg = self.config
        self.clock = time.monotonic
        self.fleet = build_fleet(cfg)
        self.replicas = self.fleet.table
        self.replicas.on_ejected.append(self._on_ejected)
        self.tenants = TenantTable(cfg.tenants)
        self.metrics = GatewayMetrics(
            lambda: self.replicas,
            lambda: len(self.fleet.queue),
            self.fleet.latency,
            # every served model, 0 when none waits (a scaler reads 0, not "no data")
            lambda: {**dict.fromkeys(cfg.models, 0), **self.fleet.queue.depth_by_model},
        )
        self._session: aiohttp.ClientSession | None = None
        self._pool: UpstreamPool | None = None
        self.loader = AdapterLoader(self.fleet, lambda: self._session, cfg.limits.read_timeout_s)
        self.proxy = Proxy(cfg, self.fleet, self.tenants, self.metrics, TableChanges(self.fleet),
                           lambda: self._pool, self.loader)  # fmt: skip
        self.health = HealthChecks(cfg, self.fleet, lambda: self._session)
        self._tasks: list[asyncio.Task[None]] = []
        self._config_mtime: float | None = None
        self._front: FastFront | None = None
        self._server: asyncio.AbstractServer | None = None
        self.port: int | None = None
        self.host = cfg.host
        for rc in cfg.replicas:
            self._add(rc, source="config")
        self._admin = AdminApi(self)
        self.router = build_router(self._admin)

    # -- lifecycle ----------------------------------------------------------------------
    async def start(
        self, host: str | None = None, port: int | None = None, reuse_port: bool = False
    ) -> int:
        """Listen on host:port (port 0 = any free port) and start probing; returns the port.
        `reuse_port`: share the port with other processes (the workers of one gateway)."""
        cfg = self.config
        self.host = host if host is not None else cfg.host
        listen_port = cfg.port if port is None else port
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60.0, ttl_dns_cache=None)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=True)
        self._pool = UpstreamPool(cfg.limits.connect_timeout_s)
        self._front = FastFront(
            self.proxy.handle,
            self.router,
            max_header_bytes=cfg.limits.max_header_bytes,
            max_body_bytes=cfg.limits.max_body_bytes,
            body_timeout_s=cfg.limits.client_body_timeout_s,
            log_exception=lambda: log.exception("gateway request failed"),
        )
        self._server = await asyncio.get_running_loop().create_server(
            self._front.protocol, self.host, listen_port, backlog=4096, reuse_address=True,
            reuse_port=reuse_port or None,
        )  # fmt: skip
        sockets = self._server.sockets
        self.port = sockets[0].getsockname()[1] if sockets else listen_port
        if self.config_path:
            with contextlib.suppress(OSError):
                self._config_mtime = Path(self.config_path).stat().st_mtime
        self._tasks += [
            asyncio.create_task(self._front.sweep_idle(), name="gateway-idle"),
            asyncio.create_task(self.health.probe_loop(), name="gateway-probes"),
            asyncio.create_task(self.health.tick_loop(), name="gateway-outliers"),
            asyncio.create_task(self.proxy.watch.run(), name="gateway-stalls"),
            asyncio.create_task(self.health.scrape_loop(), name="gateway-scrapes"),
        ]
        if self.config_path and cfg.reload_interval_s > 0:
            self._tasks.append(asyncio.create_task(self._watch_loop(), name="gateway-reload"))
        log.info("gateway listening on http://%s:%s", self.host, self.port)
        return self.port

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if self._server is not None:
            self._server.close()
            if self._front is not None:
                self._front.close_all()
            await self._server.wait_closed()
            self._server = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def add_route(self, method: str, path: str, handler: RouteHandler, admin: bool = True) -> None:
        """Serve `method path` with `handler(request) -> Reply` (`gateway.routes`), behind
        the admin key unless `admin` is False. Raises ValueError if the route exists."""
        self.router.add(method, path, self._admin.admin(handler) if admin else handler)

    # -- replica management (admin API and in-process callers) --------------------------
    def _add(self, rc: ReplicaConfig, source: str) -> Replica:
        rid = rc.id or self.replicas.new_id()
        engine = rc.engine or self.config.engine
        replica = Replica.create(rid, rc.url, rc.pool, rc.models, source=source, engine=engine)
        if rid in self.replicas.by_id:
            raise KeyError(rid)
        self.metrics.bind_replica(replica)
        self.replicas.add(replica)
        if engine == NO_METRICS_ENGINE:
            self.fleet.route_by_in_flight(replica, no_load_note(EngineIdentity(engine, "config")))
            log.info("replica %s (%s): %s; routing it by in-flight counts alone",
                     rid, rc.url, replica.load_note)  # fmt: skip
        if self._session is not None:
            # Probe at once rather than at the next tick, so it becomes ready sooner.
            task = asyncio.get_running_loop().create_task(self.health.probe_one(replica))
            self._tasks.append(task)
            task.add_done_callback(self._forget_task)
        return replica

    def _forget_task(self, task: asyncio.Task[None]) -> None:
        with contextlib.suppress(ValueError):
            self._tasks.remove(task)

    def add_replica(
        self,
        url: str,
        replica_id: str | None = None,
        pool: str | None = None,
        models: list[str] | tuple[str, ...] = (),
        engine: str | None = None,
    ) -> dict[str, Any]:
        """Add a replica as `starting`; it becomes `ready` once its /health passes.

        Raises KeyError if the id is taken, UserError if the URL is not http(s) or the
        engine is not one of auto, vllm, sglang, tgi, trtllm, openai.
        """
        from pydantic import ValidationError

        try:
            fields = {"url": url, "id": replica_id, "pool": pool, "models": list(models)}
            rc = ReplicaConfig.model_validate({**fields, "engine": engine})
        except ValidationError as exc:
            err = exc.errors()[0]
            name = str(err["loc"][0]) if err["loc"] else "url"
            fix = "http://host:port" if name == "url" else "auto, vllm, sglang, tgi, trtllm, openai"
            raise UserError(err["msg"], field=name, fix=fix) from None
        return self._add(rc, source="admin").to_json()

    def drain_replica(self, replica_id: str) -> dict[str, Any]:
        """No new requests go to it; requests in flight finish. Raises KeyError if unknown."""
        replica = self.replicas.drain(replica_id)
        log.info("replica %s draining", replica_id)
        return replica.to_json()

    def undrain_replica(self, replica_id: str) -> dict[str, Any]:
        """A draining replica takes requests again (a scale-out took it back). Raises
        KeyError if unknown or not draining."""
        try:
            replica = self.replicas.undrain(replica_id)
        except ValueError:
            raise KeyError(replica_id) from None
        log.info("replica %s back from draining", replica_id)
        return replica.to_json()

    def remove_replica(self, replica_id: str) -> dict[str, Any]:
        """Forget the replica (requests in flight on it still finish). KeyError if unknown."""
        replica = self.replicas.remove(replica_id)
        self.metrics.forget_replica(replica)
        log.info("replica %s removed", replica_id)
        return replica.to_json()

    def list_replicas(self) -> list[dict[str, Any]]:
        return [r.to_json() for r in self.replicas]

    def metrics_exposition(self) -> bytes:
        """/metrics as Prometheus text."""
        return generate_latest(self.metrics.registry)

    def signals(self) -> GatewaySignals:
        """What an autoscaler needs, now (`to_json()` for the admin API)."""
        return self.fleet.signals(time.monotonic())

    def reload(self) -> dict[str, Any]:
        """Re-read the config file's replica list (and served models); admin ones stay.

        Raises UserError when the file is invalid; the running set is then unchanged.
        """
        if not self.config_path:
            raise UserError("no config file to reload", field="--config", fix="start with one")
        cfg = load_config(self.config_path)
        wanted = {rc.url: rc for rc in cfg.replicas}
        added, removed = [], []
        for r in list(self.replicas):
            if r.source == "config" and r.url not in wanted:
                self.metrics.forget_replica(self.replicas.remove(r.replica_id))
                removed.append(r.replica_id)
        for url, rc in wanted.items():
            if self.replicas.find_by_url(url) is None:
                added.append(self._add(rc, source="config").replica_id)
        self.fleet.served_models = frozenset(cfg.models)
        self.fleet.queue.set_limits(*cfg.queue.limits())
        for spec in cfg.adapter_specs():  # new and changed adapters (removed ones stay known)
            self.fleet.adapters.declare(spec)
        self.replicas.changed()
        log.info("config reloaded: +%s -%s", added, removed)
        return {"added": added, "removed": removed}

    def reload_logged(self) -> None:
        """reload(), logging (not raising) a bad file; for SIGHUP and the file watcher."""
        try:
            self.reload()
        except UserError as exc:
            log.error("config reload refused, keeping the running replica list: %s", exc)

    async def _watch_loop(self) -> None:
        assert self.config_path
        while True:
            await asyncio.sleep(self.config.reload_interval_s)
            try:
                mtime = Path(self.config_path).stat().st_mtime
            except OSError:
                continue
            if mtime != self._config_mtime:
                self._config_mtime = mtime
                self.reload_logged()

    def _on_ejected(self, replica: Replica) -> None:
        replica.m_ejections.inc()
        if replica.ejected_until_s is not None:
            log.warning("replica %s ejected for %.0f s after %d failed requests",
                        replica.replica_id, replica.ejected_until_s - time.monotonic(),
                        replica.consecutive_failures)  # fmt: skip
        else:
            log.warning("replica %s out: %d failed health probes", replica.replica_id,
                        replica.failed_probes)  # fmt: skip


def run_gateway(gateway: Gateway, host: str | None, port: int | None) -> None:
    """Run until SIGINT/SIGTERM, reloading on SIGHUP (the CLI's loop)."""
    import signal

    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a core dependency on Linux
        pass

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if gateway.config_path:
            loop.add_signal_handler(signal.SIGHUP, gateway.reload_logged)
        await gateway.start(host, port)
        print(json.dumps({"event": "listening", "url": gateway.url}), flush=True)
        try:
            await stop.wait()
        finally:
            await gateway.stop()

    asyncio.run(main())
