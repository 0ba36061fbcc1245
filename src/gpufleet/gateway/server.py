"""The live gateway: OpenAI-compatible HTTP in, one replica chosen by a pure policy, bytes out.

`Gateway` runs standalone (`gpufleet gateway`) or inside another program's event loop
(`gpufleet up`): `await gw.start(host, port)`, `gw.add_replica(url)`, `gw.drain_replica(id)`,
`gw.remove_replica(id)`, `gw.signals()`, `await gw.stop()`.

Hot path: the body is read once and forwarded as the same bytes; streamed chunks are written
to the client as they arrive; nothing is logged per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import logging
import time
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpufleet.errors import UserError
from gpufleet.gateway import probes
from gpufleet.gateway.config import GatewayConfig, load_config
from gpufleet.gateway.fast_http import FastFront, FastRequest, FastResponder
from gpufleet.gateway.metrics import GatewayMetrics
from gpufleet.gateway.policies import build_policy, policy_needs_prefix
from gpufleet.gateway.replicas import Replica, ReplicaSet
from gpufleet.gateway.request_meta import BadRequest, parse_body
from gpufleet.gateway.signals import gateway_signals
from gpufleet.gateway.tenants import Tenant, TenantTable
from gpufleet.gateway.upstream import (
    UpstreamError,
    UpstreamPool,
    UpstreamResponse,
    UpstreamTimeout,
    request_head,
)
from gpufleet.openai_errors import error_json_bytes, sse_error_event
from gpufleet.routing.prefix import request_prefix_hashes
from gpufleet.routing.types import ReplicaState, RequestInfo, RoutingPolicy

log = logging.getLogger("gpufleet.gateway")

# Request headers never forwarded upstream (hop-by-hop, or set by the gateway).
_DROP_HEADERS = frozenset(
    {
        b"host",
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authorization",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"content-length",
        b"expect",
        b"accept-encoding",
    }
)
_JSON = "application/json"
_DONE_TAIL = b"data: [DONE]"
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def error_response(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | int | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    return web.Response(
        body=error_json_bytes(message, status, param=param, code=code),
        status=status,
        content_type=_JSON,
        headers=headers,
    )


class _Failure:
    """A failed attempt before any byte reached the client: retry elsewhere or report.

    `final` failures (timeouts) are not retried: the request may still be running there.
    """

    __slots__ = ("body", "code", "content_type", "final", "headers", "message", "param",
                 "status")  # fmt: skip

    def __init__(
        self,
        status: int,
        message: str,
        *,
        body: bytes | None = None,
        content_type: str = _JSON,
        param: str | None = None,
        code: str | int | None = None,
        headers: dict[str, str] | None = None,
        final: bool = False,
    ) -> None:
        self.status = status
        self.message = message
        self.body = body
        self.content_type = content_type
        self.param = param
        self.code = code
        self.headers = headers
        self.final = final

    def send(self, out: _Out) -> None:
        if self.body is not None:
            out.send(self.status, self.body, self.content_type, self.headers)
        else:
            body = error_json_bytes(self.message, self.status, param=self.param, code=self.code)
            out.send(self.status, body, _JSON, self.headers)


class Gateway:
    def __init__(self, config: GatewayConfig | None = None, *, config_path: str | None = None):
        self.config = config or GatewayConfig()
        self.config_path = config_path
        cfg = self.config
        self.replicas = ReplicaSet(
            cfg.health.eject_after_failures,
            cfg.health.readmit_after_successes,
            on_removed=self._on_replica_removed,
            on_ejected=self._on_replica_ejected,
        )
        self.tenants = TenantTable(cfg.tenants)
        self.policy: RoutingPolicy = build_policy(cfg.policy, cfg.seed, **cfg.policy_options)
        self._tenant_policies: dict[str, RoutingPolicy] = {}
        for t in cfg.tenants:
            if t.policy:
                options = self._tenant_policy_options(t.policy, t.policy_options)
                self._tenant_policies[t.name] = build_policy(t.policy, cfg.seed, **options)
        self._needs_prefix = any(
            policy_needs_prefix(p) for p in (self.policy, *self._tenant_policies.values())
        )
        self.served_models: frozenset[str] = frozenset(cfg.models)
        self.queue_depth = 0
        self.queue_depth_by_model: dict[str, int] = {}
        self.metrics = GatewayMetrics(
            lambda: self.replicas, lambda: self.queue_depth, cfg.signals_window_s
        )
        self._request_ids = itertools.count(1)
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._probing: set[str] = set()
        self._config_mtime: float | None = None
        self._pool: UpstreamPool | None = None
        self._front: FastFront | None = None
        self._server: asyncio.AbstractServer | None = None
        self.port: int | None = None
        self.host = cfg.host
        for rc in cfg.replicas:
            self._add(rc.url, rc.id, rc.pool, rc.models, source="config")
        self.app = self._build_app()

    def _tenant_policy_options(self, policy: str, options: dict[str, Any] | None) -> dict[str, Any]:
        if options is not None:
            return options
        return self.config.policy_options if policy == self.config.policy else {}

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self, host: str | None = None, port: int | None = None) -> int:
        """Listen on host:port (port 0 = any free port) and start probing; returns the port."""
        cfg = self.config
        self.host = host if host is not None else cfg.host
        listen_port = cfg.port if port is None else port
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60.0, ttl_dns_cache=None)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=True)
        self._pool = UpstreamPool(cfg.limits.connect_timeout_s)
        self._runner = web.AppRunner(
            self.app,
            handle_signals=False,
            access_log=None,
            # A client that disconnects cancels its handler, which closes the upstream request.
            handler_cancellation=True,
            max_field_size=max(8190, cfg.limits.max_header_bytes * 2),
            max_line_size=max(8190, cfg.limits.max_header_bytes * 2),
        )
        await self._runner.setup()
        if cfg.fast_front:
            aiohttp_server = self._runner.server
            assert aiohttp_server is not None
            self._front = FastFront(
                self._fast_proxy,
                aiohttp_server,
                max_header_bytes=cfg.limits.max_header_bytes,
                max_body_bytes=cfg.limits.max_body_bytes,
                body_timeout_s=cfg.limits.client_body_timeout_s,
                log_exception=lambda: log.exception("gateway request failed"),
            )
            self._server = await asyncio.get_running_loop().create_server(
                self._front.protocol, self.host, listen_port, backlog=2048, reuse_address=True
            )
            sockets: Any = self._server.sockets
            self._tasks.append(asyncio.create_task(self._front.sweep_idle(), name="gateway-idle"))
        else:
            site = web.TCPSite(self._runner, self.host, listen_port, backlog=2048,
                               reuse_address=True)  # fmt: skip
            await site.start()
            sockets = getattr(site._server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else listen_port
        if self.config_path:
            with contextlib.suppress(OSError):
                self._config_mtime = Path(self.config_path).stat().st_mtime
        self._tasks += [
            asyncio.create_task(self._probe_loop(), name="gateway-probes"),
            asyncio.create_task(self._scrape_loop(), name="gateway-scrapes"),
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
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- replica management (admin API and in-process callers) --------------------------
    def _add(
        self,
        url: str,
        replica_id: str | None,
        pool: str | None,
        models: list[str] | tuple[str, ...],
        source: str,
    ) -> Replica:
        replica = self.replicas.add(url, replica_id, pool, models, source=source)
        self.metrics.bind_replica(replica)
        self.replicas.changed()
        if self._session is not None:
            # Probe at once rather than at the next tick, so it becomes ready sooner.
            task = asyncio.get_running_loop().create_task(self._probe_one(replica))
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
    ) -> dict[str, Any]:
        """Add a replica as `starting`; it becomes `ready` once its /health passes.

        Raises KeyError if the id is taken, UserError if the URL is not http(s).
        """
        from pydantic import ValidationError

        from gpufleet.gateway.config import ReplicaConfig

        try:
            rc = ReplicaConfig(url=url, id=replica_id, pool=pool, models=list(models))
        except ValidationError as exc:
            raise UserError(exc.errors()[0]["msg"], field="url", fix="http://host:port") from None
        return self._add(rc.url, rc.id, rc.pool, rc.models, source="admin").to_json()

    def drain_replica(self, replica_id: str) -> dict[str, Any]:
        """No new requests go to it; requests in flight finish. Raises KeyError if unknown."""
        replica = self.replicas.drain(replica_id)
        log.info("replica %s draining", replica_id)
        return replica.to_json()

    def remove_replica(self, replica_id: str) -> dict[str, Any]:
        """Forget the replica (requests in flight on it still finish). KeyError if unknown."""
        replica = self.replicas.remove(replica_id)
        self.metrics.forget_replica(replica)
        log.info("replica %s removed", replica_id)
        return replica.to_json()

    def list_replicas(self) -> list[dict[str, Any]]:
        return [r.to_json() for r in self.replicas]

    def signals(self) -> dict[str, Any]:
        """What an autoscaler needs, as plain JSON-able data."""
        now_s = time.monotonic()
        return gateway_signals(
            now_s,
            list(self.replicas),
            self.queue_depth,
            self.queue_depth_by_model,
            self.metrics.signals_latency(now_s),
        )

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
                added.append(self._add(url, rc.id, rc.pool, rc.models, source="config").replica_id)
        self.served_models = frozenset(cfg.models)
        self.replicas.changed()
        log.info("config reloaded: +%s -%s", added, removed)
        return {"added": added, "removed": removed}

    def _on_replica_removed(self, replica_id: str) -> None:
        self.policy.on_replica_removed(replica_id)
        for p in self._tenant_policies.values():
            p.on_replica_removed(replica_id)

    def _on_replica_ejected(self, replica: Replica) -> None:
        replica.m_ejections.inc()
        log.warning(
            "replica %s ejected after %d failures", replica.replica_id, replica.consecutive_failures
        )

    # -- background loops ---------------------------------------------------------------
    async def _probe_one(self, replica: Replica) -> None:
        if replica.replica_id in self._probing or self._session is None:
            return
        self._probing.add(replica.replica_id)
        try:
            timeout_s = self.config.health.probe_timeout_s
            ok = await probes.probe_health(self._session, replica.url, timeout_s)
            if replica.state is ReplicaState.DRAINING:
                return
            if not ok:
                if replica.state is ReplicaState.READY:
                    self.replicas.record_failure(replica)
                else:
                    replica.consecutive_successes = 0
                return
            if not self.replicas.probe_passed(replica):
                return
            if not replica.fixed_models:
                cards = await probes.fetch_models(self._session, replica.url, timeout_s)
                if cards is None:
                    return  # healthy but cannot say what it serves yet: try next tick
                replica.model_cards = cards
                replica.models = frozenset(c["id"] for c in cards)
            was = replica.state
            self.replicas.mark_ready(replica)
            log.info("replica %s %s -> ready", replica.replica_id, was)
        finally:
            self._probing.discard(replica.replica_id)

    async def _probe_loop(self) -> None:
        interval_s = self.config.health.probe_interval_s
        while True:
            await asyncio.gather(*(self._probe_one(r) for r in self.replicas))
            await asyncio.sleep(interval_s)

    async def _scrape_one(self, replica: Replica) -> None:
        assert self._session is not None
        text = await probes.scrape_metrics(
            self._session, replica.url, self.config.health.probe_timeout_s
        )
        if text is not None:
            try:
                stats, capacity_tokens = probes.parse_engine_stats(
                    text, time.monotonic(), replica.in_flight
                )
            except ValueError:
                return
            self.replicas.set_stats(replica, stats)
            if capacity_tokens and capacity_tokens != replica.kv_capacity_tokens:
                replica.kv_capacity_tokens = capacity_tokens
                # A prefix index sized to what the replica really holds forgets its evictions.
                for policy in (self.policy, *self._tenant_policies.values()):
                    set_capacity = getattr(policy, "set_capacity_tokens", None)
                    if set_capacity is not None:
                        set_capacity(replica.replica_id, capacity_tokens)

    async def _scrape_loop(self) -> None:
        interval_s = self.config.scrape_interval_s
        while True:
            live = [
                r for r in self.replicas if r.state in (ReplicaState.READY, ReplicaState.DRAINING)
            ]
            await asyncio.gather(*(self._scrape_one(r) for r in live))
            await asyncio.sleep(interval_s)

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

    def reload_logged(self) -> None:
        """reload(), logging (not raising) a bad file; for SIGHUP and the file watcher."""
        try:
            self.reload()
        except UserError as exc:
            log.error("config reload refused, keeping the running replica list: %s", exc)

    # -- HTTP app -----------------------------------------------------------------------
    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.limits.max_body_bytes)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/admin/replicas", self._admin_list)
        app.router.add_post("/admin/replicas", self._admin_add)
        app.router.add_post("/admin/replicas/{replica_id}/drain", self._admin_drain)
        app.router.add_delete("/admin/replicas/{replica_id}", self._admin_delete)
        app.router.add_get("/admin/signals", self._admin_signals)
        app.router.add_post("/admin/reload", self._admin_reload)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        return app

    async def _not_found(self, request: web.Request) -> web.Response:
        known = {r.canonical for r in request.app.router.resources() if hasattr(r, "canonical")}
        if request.path in known:
            return error_response(405, f"method {request.method} not allowed on {request.path}")
        return error_response(404, f"no route {request.method} {request.path}")

    async def _health(self, request: web.Request) -> web.Response:
        ready = sum(1 for r in self.replicas if r.state is ReplicaState.READY)
        body = {"status": "ok", "replicas_ready": ready, "replicas_total": len(self.replicas)}
        return web.json_response(body)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.metrics.registry),
            headers={"Content-Type": CONTENT_TYPE_LATEST},
        )

    async def _models(self, request: web.Request) -> web.Response:
        cards: dict[str, dict[str, Any]] = {}
        for r in self.replicas:
            if r.state is ReplicaState.DEAD:
                continue
            for card in r.model_cards:
                cards.setdefault(card["id"], card)
            for m in r.models:
                cards.setdefault(
                    m, {"id": m, "object": "model", "created": 0, "owned_by": "gpufleet"}
                )
        for m in self.served_models:
            cards.setdefault(m, {"id": m, "object": "model", "created": 0, "owned_by": "gpufleet"})
        return web.json_response({"object": "list", "data": [cards[k] for k in sorted(cards)]})

    # -- admin --------------------------------------------------------------------------
    def _admin_denied(self, request: web.Request) -> web.Response | None:
        key = self.config.admin_key
        if not key:
            return error_response(403, "the admin API is disabled: set admin_key (--admin-key)")
        auth = request.headers.get("Authorization", "")
        given = auth[7:].strip() if auth.startswith("Bearer ") else ""
        if not hmac.compare_digest(given.encode(), key.encode()):
            return error_response(401, "missing or wrong admin key (Authorization: Bearer ...)")
        return None

    async def _admin_list(self, request: web.Request) -> web.Response:
        return self._admin_denied(request) or web.json_response({"replicas": self.list_replicas()})

    async def _admin_signals(self, request: web.Request) -> web.Response:
        return self._admin_denied(request) or web.json_response(self.signals())

    async def _admin_add(self, request: web.Request) -> web.Response:
        denied = self._admin_denied(request)
        if denied:
            return denied
        try:
            body = await request.json()
        except ValueError:
            return error_response(400, "the body is not valid JSON")
        if not isinstance(body, dict) or not isinstance(body.get("url"), str):
            return error_response(400, "'url' is required and must be a string", param="url")
        for name in ("id", "pool"):
            if body.get(name) is not None and not isinstance(body[name], str):
                return error_response(400, f"'{name}' must be a string", param=name)
        models = body.get("models", [])
        if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
            return error_response(400, "'models' must be a list of strings", param="models")
        try:
            out = self.add_replica(body["url"], body.get("id"), body.get("pool"), models)
        except UserError as exc:
            return error_response(400, str(exc), param="url")
        except KeyError:
            return error_response(409, f"replica id {body.get('id')!r} already exists", param="id")
        return web.json_response(out, status=201)

    async def _admin_drain(self, request: web.Request) -> web.Response:
        denied = self._admin_denied(request)
        if denied:
            return denied
        rid = request.match_info["replica_id"]
        try:
            return web.json_response(self.drain_replica(rid))
        except KeyError:
            return error_response(404, f"no replica {rid!r}", param="replica_id")

    async def _admin_delete(self, request: web.Request) -> web.Response:
        denied = self._admin_denied(request)
        if denied:
            return denied
        rid = request.match_info["replica_id"]
        try:
            return web.json_response({"deleted": True, "replica": self.remove_replica(rid)})
        except KeyError:
            return error_response(404, f"no replica {rid!r}", param="replica_id")

    async def _admin_reload(self, request: web.Request) -> web.Response:
        denied = self._admin_denied(request)
        if denied:
            return denied
        try:
            return web.json_response(self.reload())
        except UserError as exc:
            return error_response(400, str(exc))

    # -- the proxy ----------------------------------------------------------------------
    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._aiohttp_proxy(request, "chat", "/v1/chat/completions")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._aiohttp_proxy(request, "completions", "/v1/completions")

    async def _aiohttp_proxy(
        self, request: web.Request, endpoint: str, path: str
    ) -> web.StreamResponse:
        """The hot path for connections aiohttp serves (the fast front hands them over)."""
        t0_s = time.monotonic()
        limits = self.config.limits
        out = _AiohttpOut(request)
        length = request.content_length
        try:
            if length is not None and length > limits.max_body_bytes:
                raise web.HTTPRequestEntityTooLarge(max_size=limits.max_body_bytes,
                                                    actual_size=length)  # fmt: skip
            if request.content.is_eof():  # the whole body came with the headers: no timer
                raw = await request.read()
            else:
                async with asyncio.timeout(limits.client_body_timeout_s):
                    raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            msg = f"the request body exceeds {limits.max_body_bytes} bytes"
            self.metrics.count_request("", "", 413)
            return error_response(413, msg)
        except TimeoutError:
            self.metrics.count_request("", "", 408)
            return error_response(408, "timed out reading the request body")
        await self._proxy(_AiohttpIn(request, raw), out, endpoint, path, t0_s)
        assert out.response is not None
        return out.response

    async def _fast_proxy(
        self, request: FastRequest, out: FastResponder, endpoint: str, path: str
    ) -> None:
        await self._proxy(request, out, endpoint, path, time.monotonic())

    def _reply_error(
        self,
        out: _Out,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        body = error_json_bytes(message, status, param=param, code=code)
        out.send(status, body, _JSON, headers)

    async def _proxy(self, request: _In, out: _Out, endpoint: str, path: str, t0_s: float) -> None:
        """Authenticate, validate, admit, route and forward one completion request."""
        limits = self.config.limits
        header_bytes = 0
        for k, v in request.raw_headers:
            header_bytes += len(k) + len(v) + 4
        if header_bytes > limits.max_header_bytes:
            self.metrics.count_request("", "", 431)
            return self._reply_error(
                out, 431, f"request headers exceed {limits.max_header_bytes} bytes"
            )
        auth = request.header(b"authorization")
        tenant = self.tenants.resolve(auth.decode("latin-1") if auth is not None else None)
        if tenant is None:
            self.metrics.count_request("", "", 401)
            return self._reply_error(
                out, 401, "missing or unknown API key (Authorization: Bearer ...)",
                code="invalid_api_key",
            )  # fmt: skip
        try:
            meta = parse_body(request.body, endpoint)
        except BadRequest as exc:
            self.metrics.count_request("", tenant.name, exc.status)
            return self._reply_error(out, exc.status, str(exc), param=exc.param)
        model = meta.model
        if (
            model not in self.replicas.known
            and model not in self.served_models
            and not self._discovering()
        ):
            self.metrics.count_request(model, tenant.name, 404)
            return self._reply_error(
                out, 404, f"the model '{model}' does not exist", param="model",
                code="model_not_found",
            )  # fmt: skip
        retry_after_s = tenant.admit(t0_s)
        if retry_after_s:
            self.metrics.count_request(model, tenant.name, 429)
            return self._reply_error(
                out, 429, f"rate limit reached for tenant {tenant.name!r}",
                headers={"Retry-After": str(retry_after_s)},
            )  # fmt: skip
        try:
            await self._route(request, out, meta.body, meta.user, model, tenant, endpoint,
                              path, t0_s)  # fmt: skip
        finally:
            tenant.release()
            self.metrics.count_request(model, tenant.name, out.status)

    def _discovering(self) -> bool:
        """Whether some replica's models are not known yet (it may serve the model asked for).

        With `models:` configured, that list is the truth: unknown models are 404 at once.
        """
        if self.served_models:
            return False
        return any(not r.models and r.state is not ReplicaState.DRAINING for r in self.replicas)

    async def _wait_for_replicas(
        self, model: str, pool: str | None, deadline_s: float
    ) -> list[Replica] | _Failure:
        """Eligible replicas, waiting in the bounded queue while there are none (scale from 0)."""
        queue = self.config.queue
        while True:
            candidates = self.replicas.eligible(model, pool)
            if candidates:
                return candidates
            if (
                model not in self.replicas.known
                and model not in self.served_models
                and not self._discovering()
            ):
                return _Failure(404, f"the model '{model}' does not exist",
                                param="model", code="model_not_found")  # fmt: skip
            remaining_s = deadline_s - time.monotonic()
            if self.queue_depth >= queue.max_size or remaining_s <= 0:
                why = "the queue is full" if remaining_s > 0 else "timed out in the queue"
                return _Failure(503, f"no replica ready for model '{model}' ({why})",
                                headers={"Retry-After": str(queue.retry_after_s)})  # fmt: skip
            changed = self.replicas.wait_changed()
            self.queue_depth += 1
            self.queue_depth_by_model[model] = self.queue_depth_by_model.get(model, 0) + 1
            try:
                await asyncio.wait_for(changed.wait(), remaining_s)
            except TimeoutError:
                pass
            finally:
                self.queue_depth -= 1
                left = self.queue_depth_by_model[model] - 1
                if left:
                    self.queue_depth_by_model[model] = left
                else:
                    del self.queue_depth_by_model[model]

    async def _route(
        self,
        request: _In,
        out: _Out,
        body: dict[str, Any],
        user: str | None,
        model: str,
        tenant: Tenant,
        endpoint: str,
        path: str,
        t0_s: float,
    ) -> None:
        policy = (
            self._tenant_policies.get(tenant.name, self.policy)
            if self._tenant_policies
            else self.policy
        )
        hashes: tuple[int, ...] = ()
        if self._needs_prefix and policy_needs_prefix(policy):
            hashes = request_prefix_hashes(body, endpoint)
        session = request.header(b"x-session-id")
        info = RequestInfo(
            request_id=f"gw-{next(self._request_ids)}",
            model=model,
            tenant=tenant.name,
            session_key=session.decode("latin-1") if session is not None else user,
            prefix_hashes=hashes,
        )
        headers = self._forward_headers(request.raw_headers)
        max_attempts = self.config.limits.max_attempts
        deadline_s = t0_s + self.config.queue.timeout_s
        tried: tuple[Replica, ...] = ()
        failure: _Failure | None = None
        while True:
            candidates = self.replicas.eligible(model, tenant.pool, tried)
            if not candidates:
                if tried and self.replicas.eligible(model, tenant.pool):
                    break  # every ready replica already failed this request
                waited = await self._wait_for_replicas(model, tenant.pool, deadline_s)
                if isinstance(waited, _Failure):
                    return (failure or waited).send(out)
                candidates = [r for r in waited if r not in tried] or waited
            chosen = policy.choose(info, candidates)
            replica: Replica = chosen if isinstance(chosen, Replica) else candidates[0]
            result = await self._attempt(
                request.body, out, headers, replica, policy, info, path, model, tenant, t0_s
            )
            if result is None:
                return
            failure = result
            if result.final:
                break
            tried = (*tried, replica)
            if len(tried) >= max_attempts:
                break
            replica.m_retries.inc()
        assert failure is not None
        failure.send(out)

    def _forward_headers(self, raw_headers: Any) -> bytes:
        """The client's headers as raw bytes, minus hop-by-hop ones (and the gateway key)."""
        strip_auth = self.tenants.enabled
        parts = []
        has_type = False
        for k, v in raw_headers:
            lk = k.lower()
            if lk in _DROP_HEADERS or (strip_auth and lk == b"authorization"):
                continue
            if lk == b"content-type":
                has_type = True
            parts.append(b"%s: %s\r\n" % (k, v))
        if not has_type:
            parts.append(b"Content-Type: application/json\r\n")
        return b"".join(parts)

    def _read_timeout_s(self, t0_s: float) -> float:
        limits = self.config.limits
        if limits.total_timeout_s is None:
            return limits.read_timeout_s
        left_s = t0_s + limits.total_timeout_s - time.monotonic()
        if left_s <= 0:
            raise UpstreamTimeout("the request ran past limits.total_timeout_s")
        return min(limits.read_timeout_s, left_s)

    async def _open(self, replica: Replica, data: bytes, t0_s: float) -> UpstreamResponse:
        """Send and wait for the response head. A kept-alive connection the replica had
        already closed is retried once on a fresh one, without blaming the replica."""
        assert self._pool is not None
        up = await self._pool.send(replica.addr, data)
        try:
            await up.headers(self._read_timeout_s(t0_s))
            return up
        except UpstreamError as exc:
            up.release()
            if isinstance(exc, UpstreamTimeout) or not up.reused or up.got_bytes:
                raise
        except BaseException:  # cancelled (client gone): reset the upstream connection
            up.release()
            raise
        up = await self._pool.fresh(replica.addr, data)
        try:
            await up.headers(self._read_timeout_s(t0_s))
        except BaseException:
            up.release()
            raise
        return up

    async def _attempt(
        self,
        raw: bytes,
        out: _Out,
        headers: bytes,
        replica: Replica,
        policy: RoutingPolicy,
        info: RequestInfo,
        path: str,
        model: str,
        tenant: Tenant,
        t0_s: float,
    ) -> _Failure | None:
        """One try on one replica: None once a response went out, or a _Failure before."""
        replica.in_flight += 1
        replica.m_requests.inc()
        policy.on_started(info, replica)
        ok = False
        data = request_head(b"POST", replica.host_header, path.encode(), len(raw)) + headers
        data += b"\r\n" + raw
        try:
            try:
                upstream = await self._open(replica, data, t0_s)
            except UpstreamTimeout:
                replica.m_errors.inc()
                return _Failure(504, f"replica {replica.replica_id} did not answer in time",
                                final=True)  # fmt: skip
            except UpstreamError as exc:
                return self._failed(replica, 502, f"replica {replica.replica_id} failed: {exc}")
            try:
                status = upstream.status
                ctype = upstream.content_type.decode("latin-1") or _JSON
                if status == 200 and ctype.startswith("text/event-stream"):
                    result, ok = await self._stream(out, upstream, replica, policy, info,
                                                    model, tenant, t0_s)  # fmt: skip
                    return result
                try:
                    body = await upstream.read_all(self._read_timeout_s(t0_s))
                except UpstreamTimeout:
                    replica.m_errors.inc()
                    return _Failure(504, f"replica {replica.replica_id} timed out", final=True)
                except UpstreamError as exc:
                    return self._failed(replica, 502, f"replica {replica.replica_id} broke: {exc}")
                if status >= 500:
                    return self._failed(replica, status, "", body, ctype)
                ok = status < 400
                self.replicas.record_success(replica)
                self.metrics.latency(model, tenant.name)[3].observe(time.monotonic() - t0_s)
                out.send(status, body, ctype)
                return None
            finally:
                # Reuses a cleanly finished connection; otherwise resets it, which is how a
                # gone client (its handler cancelled) closes the upstream request at once.
                upstream.release()
        finally:
            replica.in_flight -= 1
            policy.on_finished(info, replica, ok)

    def _failed(
        self,
        replica: Replica,
        status: int,
        message: str,
        body: bytes | None = None,
        ctype: str = _JSON,
    ) -> _Failure:
        replica.m_errors.inc()
        self.replicas.record_failure(replica)
        return _Failure(status, message, body=body, content_type=ctype)

    async def _stream(
        self,
        out: _Out,
        upstream: UpstreamResponse,
        replica: Replica,
        policy: RoutingPolicy,
        info: RequestInfo,
        model: str,
        tenant: Tenant,
        t0_s: float,
    ) -> tuple[_Failure | None, bool]:
        """Forward SSE chunks as they arrive. Returns (failure before any byte, clean end)."""
        try:
            first = await upstream.read_chunk(self._read_timeout_s(t0_s))
        except UpstreamTimeout:
            replica.m_errors.inc()
            return _Failure(504, f"replica {replica.replica_id} timed out", final=True), False
        except UpstreamError as exc:
            return self._failed(replica, 502, f"replica {replica.replica_id} broke: {exc}"), False
        if not first:
            return self._failed(replica, 502, f"replica {replica.replica_id} sent no data"), False
        ttft_s = time.monotonic() - t0_s
        policy.on_first_token(info, replica)
        replica.streaming += 1
        try:
            clean = await self._stream_rest(out, upstream, replica, first, model, tenant,
                                            t0_s, ttft_s)  # fmt: skip
        finally:
            replica.streaming -= 1
        return None, clean

    async def _stream_rest(
        self,
        out: _Out,
        upstream: UpstreamResponse,
        replica: Replica,
        first: bytes,
        model: str,
        tenant: Tenant,
        t0_s: float,
        ttft_s: float,
    ) -> bool:
        await out.start_stream(200, "text/event-stream")
        itl = self.metrics.latency(model, tenant.name)[2]
        chunk = first
        tail = first
        events = 0
        last_s = t0_s + ttft_s
        broken: str | None = None
        while True:
            events += chunk.count(b"data:")
            await out.write(chunk)  # a gone client raises here; release() resets upstream
            try:
                chunk = await upstream.read_chunk(self._read_timeout_s(t0_s))
            except UpstreamTimeout:
                broken = "the replica stopped sending (read timeout)"
                break
            except UpstreamError as exc:
                broken = f"the replica's stream broke: {exc}"
                break
            if not chunk:
                if not tail.rstrip().endswith(_DONE_TAIL):
                    broken = "the replica's stream ended without [DONE]"
                break
            now_s = time.monotonic()
            itl.observe(now_s - last_s)
            last_s = now_s
            tail = chunk if len(chunk) >= 16 else tail[-16:] + chunk
        now_s = time.monotonic()
        if broken is not None:
            replica.m_errors.inc()
            self.replicas.record_failure(replica)
            sep = b"" if tail.endswith(b"\n\n") else b"\n\n"
            await out.write(sep + sse_error_event(f"upstream error: {broken}", 502))
        else:
            self.replicas.record_success(replica)
            # Events minus the [DONE] marker approximate the tokens streamed.
            self.metrics.observe_stream(model, tenant.name, ttft_s, now_s - t0_s,
                                        max(1, events - 1), now_s)  # fmt: skip
        await out.end()
        return broken is None


class _In(Protocol):
    """A completion request with its body read (fast front or aiohttp)."""

    @property
    def body(self) -> bytes: ...

    @property
    def raw_headers(self) -> Any: ...

    def header(self, lname: bytes) -> bytes | None: ...


class _Out(Protocol):
    """Where the response goes: `send` a whole one, or `start_stream`, `write`..., `end`."""

    status: int

    def send(
        self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None: ...

    async def start_stream(self, status: int, content_type: str) -> None: ...

    async def write(self, chunk: bytes) -> None: ...

    async def end(self) -> None: ...


class _AiohttpIn:
    __slots__ = ("body", "raw_headers")

    def __init__(self, request: web.Request, body: bytes) -> None:
        self.raw_headers = request.raw_headers
        self.body = body

    def header(self, lname: bytes) -> bytes | None:
        for k, v in self.raw_headers:
            if k.lower() == lname:
                return bytes(v)
        return None


class _AiohttpOut:
    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response: web.StreamResponse | None = None
        self.status = 0

    def send(
        self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        self.status = status
        self.response = web.Response(
            body=body, status=status, headers={"Content-Type": content_type, **(headers or {})}
        )

    async def start_stream(self, status: int, content_type: str) -> None:
        self.status = status
        self.response = web.StreamResponse(
            status=status, headers={"Content-Type": content_type, "Cache-Control": "no-cache"}
        )
        await self.response.prepare(self.request)

    async def write(self, chunk: bytes) -> None:
        assert self.response is not None
        await self.response.write(chunk)

    async def end(self) -> None:
        assert self.response is not None
        await self.response.write_eof()


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
