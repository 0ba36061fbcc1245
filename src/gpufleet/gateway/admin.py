"""The gateway's routes besides the completions: /v1/models, /health, /metrics, the admin API.

Served by the one HTTP front (`fast_http`) through its `Router`; every handler takes the
front's request and returns a `Reply`. /v1/models asks for a tenant key when tenant keys
are configured (as the completion endpoints do); /health and /metrics never do; /admin/*
asks for the admin key.
"""

from __future__ import annotations

import hmac
import inspect
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST

from gpufleet.errors import UserError
from gpufleet.gateway.routes import Reply, Router, RouteRequest, error_reply, json_reply
from gpufleet.gateway.tenants import bearer_token
from gpufleet.routing.types import ReplicaState

if TYPE_CHECKING:
    from gpufleet.gateway.server import Gateway
    from gpufleet.gateway.workers import WorkerPool


def build_router(api: AdminApi) -> Router:
    router = Router()

    async def completions_elsewhere(request: RouteRequest) -> Reply:  # pragma: no cover
        raise AssertionError("the front sends POST completions to the proxy")

    for path in ("/v1/chat/completions", "/v1/completions"):
        router.add("POST", path, completions_elsewhere)  # so GET gets 405, not 404
    router.add("GET", "/v1/models", api.models)
    router.add("GET", "/health", api.health)
    router.add("GET", "/metrics", api.metrics)
    router.add("GET", "/admin/replicas", api.admin(api.list))
    router.add("POST", "/admin/replicas", api.admin(api.add))
    router.add("POST", "/admin/replicas/{replica_id}/drain", api.admin(api.drain))
    router.add("POST", "/admin/replicas/{replica_id}/undrain", api.admin(api.undrain))
    router.add("DELETE", "/admin/replicas/{replica_id}", api.admin(api.delete))
    router.add("GET", "/admin/signals", api.admin(api.signals))
    router.add("POST", "/admin/reload", api.admin(api.reload))
    return router


def _card(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": 0, "owned_by": "gpufleet"}


def _authorization(request: RouteRequest) -> str | None:
    raw = request.header(b"authorization")
    return None if raw is None else raw.decode("latin-1")


Handler = Callable[[RouteRequest], Awaitable[Reply]]


class AdminApi:
    def __init__(self, gw: Gateway | WorkerPool) -> None:
        self.gw: Any = gw

    # -- public endpoints ---------------------------------------------------------------
    async def health(self, request: RouteRequest) -> Reply:
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
        return json_reply(body)

    async def metrics(self, request: RouteRequest) -> Reply:
        return Reply(200, await _maybe(self.gw.metrics_exposition()), CONTENT_TYPE_LATEST)

    async def models(self, request: RouteRequest) -> Reply:
        if self.gw.tenants.resolve(_authorization(request)) is None:
            return error_reply(401, "missing or unknown API key (Authorization: Bearer ...)",
                               code="invalid_api_key")  # fmt: skip
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
        return json_reply({"object": "list", "data": [cards[k] for k in sorted(cards)]})

    # -- admin --------------------------------------------------------------------------
    def admin(self, handler: Handler) -> Handler:
        """`handler` behind the admin key (403 while no key is set, 401 on a wrong one)."""

        async def guarded(request: RouteRequest) -> Reply:
            key = self.gw.config.admin_key
            if not key:
                return error_reply(403, "the admin API is disabled: set admin_key (--admin-key)")
            given = bearer_token(_authorization(request)) or ""
            if not hmac.compare_digest(given.encode(), key.encode()):
                return error_reply(401, "missing or wrong admin key (Authorization: Bearer ...)")
            return await handler(request)

        return guarded

    async def list(self, request: RouteRequest) -> Reply:
        return json_reply({"replicas": await _maybe(self.gw.list_replicas())})

    async def signals(self, request: RouteRequest) -> Reply:
        return json_reply((await _maybe(self.gw.signals())).to_json())

    async def add(self, request: RouteRequest) -> Reply:
        try:
            body = json.loads(request.body)
        except (ValueError, RecursionError):
            return error_reply(400, "the body is not valid JSON")
        if not isinstance(body, dict) or not isinstance(body.get("url"), str):
            return error_reply(400, "'url' is required and must be a string", param="url")
        for name in ("id", "pool", "engine"):
            if body.get(name) is not None and not isinstance(body[name], str):
                return error_reply(400, f"'{name}' must be a string", param=name)
        models = body.get("models", [])
        if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
            return error_reply(400, "'models' must be a list of strings", param="models")
        try:
            out = await _maybe(
                self.gw.add_replica(
                    body["url"], body.get("id"), body.get("pool"), models, body.get("engine")
                )
            )
        except UserError as exc:
            return error_reply(400, str(exc), param=exc.field or "url")
        except KeyError:
            return error_reply(409, f"replica id {body.get('id')!r} already exists", param="id")
        return json_reply(out, status=201)

    async def drain(self, request: RouteRequest) -> Reply:
        return await self._on_replica(request, self.gw.drain_replica)

    async def undrain(self, request: RouteRequest) -> Reply:
        """Back from draining (404 when unknown or not draining: nothing to take back)."""
        return await self._on_replica(request, self.gw.undrain_replica)

    async def delete(self, request: RouteRequest) -> Reply:
        async def remove(rid: str) -> dict[str, Any]:
            return {"deleted": True, "replica": await _maybe(self.gw.remove_replica(rid))}

        return await self._on_replica(request, remove)

    async def _on_replica(self, request: RouteRequest, act: Callable[[str], Any]) -> Reply:
        rid = request.params["replica_id"]
        try:
            return json_reply(await _maybe(act(rid)))
        except KeyError:
            return error_reply(404, f"no replica {rid!r}", param="replica_id")

    async def reload(self, request: RouteRequest) -> Reply:
        try:
            return json_reply(await _maybe(self.gw.reload()))
        except UserError as exc:
            return error_reply(400, str(exc))


async def _maybe(value: Any) -> Any:
    """The value, awaited if it is awaitable: the admin API serves a `Gateway` (whose
    calls are plain) and a `WorkerPool` (whose calls ask every worker)."""
    return await value if inspect.isawaitable(value) else value
