"""The gateway's aiohttp app: /v1/models, /health, /metrics and the admin API.

The two completion endpoints are here too, for connections the lean front handed over.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpufleet.errors import UserError
from gpufleet.gateway.http_adapters import aiohttp_completions, error_response
from gpufleet.routing.types import ReplicaState

if TYPE_CHECKING:
    from gpufleet.gateway.server import Gateway


def build_app(gw: Gateway) -> web.Application:
    cfg = gw.config
    app = web.Application(client_max_size=cfg.limits.max_body_bytes)
    chat, completions = aiohttp_completions(
        gw.proxy.handle, cfg.limits, lambda code: gw.metrics.count_request("", "", code),
        gw.clock,
    )  # fmt: skip
    admin = AdminApi(gw)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", admin.models)
    app.router.add_get("/health", admin.health)
    app.router.add_get("/metrics", admin.metrics)
    app.router.add_get("/admin/replicas", admin.list)
    app.router.add_post("/admin/replicas", admin.add)
    app.router.add_post("/admin/replicas/{replica_id}/drain", admin.drain)
    app.router.add_delete("/admin/replicas/{replica_id}", admin.delete)
    app.router.add_get("/admin/signals", admin.signals)
    app.router.add_post("/admin/reload", admin.reload)
    app.router.add_route("*", "/{tail:.*}", not_found)
    return app


async def not_found(request: web.Request) -> web.Response:
    known = {r.canonical for r in request.app.router.resources() if hasattr(r, "canonical")}
    if request.path in known:
        return error_response(405, f"method {request.method} not allowed on {request.path}")
    return error_response(404, f"no route {request.method} {request.path}")


def _card(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": 0, "owned_by": "gpufleet"}


class AdminApi:
    def __init__(self, gw: Gateway) -> None:
        self.gw = gw

    # -- public endpoints ---------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        table = self.gw.fleet.table
        ready = table.count(ReplicaState.READY)
        body = {
            # the gateway itself is up (it answers and queues); degraded: nothing to route to
            "status": "ok" if ready else "degraded",
            "replicas_ready": ready,
            "replicas_total": len(table),
            "replicas": {
                r.replica_id: {"url": r.url, "state": str(r.state), "reason": r.down_reason or None}
                for r in table
            },
        }
        return web.json_response(body)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.gw.metrics.registry),
            headers={"Content-Type": CONTENT_TYPE_LATEST},
        )

    async def models(self, request: web.Request) -> web.Response:
        cards: dict[str, dict[str, Any]] = {}
        for r in self.gw.replicas:
            if r.state is ReplicaState.DEAD:
                continue
            for card in r.model_cards:
                cards.setdefault(card["id"], card)
            for m in r.models:
                cards.setdefault(m, _card(m))
        for m in self.gw.fleet.served_models:
            cards.setdefault(m, _card(m))
        adapters = self.gw.fleet.adapters
        for spec in adapters:  # LoRA adapters as vLLM lists them: parent = the base model
            cards.setdefault(spec.name, adapters.card(spec))
        return web.json_response({"object": "list", "data": [cards[k] for k in sorted(cards)]})

    # -- admin --------------------------------------------------------------------------
    def _denied(self, request: web.Request) -> web.Response | None:
        key = self.gw.config.admin_key
        if not key:
            return error_response(403, "the admin API is disabled: set admin_key (--admin-key)")
        auth = request.headers.get("Authorization", "")
        given = auth[7:].strip() if auth.startswith("Bearer ") else ""
        if not hmac.compare_digest(given.encode(), key.encode()):
            return error_response(401, "missing or wrong admin key (Authorization: Bearer ...)")
        return None

    async def list(self, request: web.Request) -> web.Response:
        return self._denied(request) or web.json_response({"replicas": self.gw.list_replicas()})

    async def signals(self, request: web.Request) -> web.Response:
        return self._denied(request) or web.json_response(self.gw.signals().to_json())

    async def add(self, request: web.Request) -> web.Response:
        denied = self._denied(request)
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
            out = self.gw.add_replica(body["url"], body.get("id"), body.get("pool"), models)
        except UserError as exc:
            return error_response(400, str(exc), param="url")
        except KeyError:
            return error_response(409, f"replica id {body.get('id')!r} already exists", param="id")
        return web.json_response(out, status=201)

    async def drain(self, request: web.Request) -> web.Response:
        return self._on_replica(request, self.gw.drain_replica)

    async def delete(self, request: web.Request) -> web.Response:
        return self._on_replica(
            request, lambda rid: {"deleted": True, "replica": self.gw.remove_replica(rid)}
        )

    def _on_replica(
        self, request: web.Request, act: Callable[[str], dict[str, Any]]
    ) -> web.Response:
        denied = self._denied(request)
        if denied:
            return denied
        rid = request.match_info["replica_id"]
        try:
            return web.json_response(act(rid))
        except KeyError:
            return error_response(404, f"no replica {rid!r}", param="replica_id")

    async def reload(self, request: web.Request) -> web.Response:
        denied = self._denied(request)
        if denied:
            return denied
        try:
            return web.json_response(self.gw.reload())
        except UserError as exc:
            return error_response(400, str(exc))
