"""vLLM's dynamic-LoRA endpoints on the simulated replica (see `gpufleet.replica.lora`)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from aiohttp import web

from gpufleet.replica.errors import RequestError
from gpufleet.replica.http import error_response, read_json
from gpufleet.replica.lora import NOT_ENABLED, adapter_from_path

if TYPE_CHECKING:
    from gpufleet.replica.app import ReplicaServer


class LoraApi:
    def __init__(self, server: ReplicaServer) -> None:
        self.server = server

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/load_lora_adapter", self.load)
        app.router.add_post("/v1/unload_lora_adapter", self.unload)

    async def load(self, request: web.Request) -> web.StreamResponse:
        server = self.server
        try:
            body = await read_json(request)
            if not isinstance(body, dict):
                raise RequestError("the request body must be a JSON object")
            name, path = body.get("lora_name"), body.get("lora_path")
            if not isinstance(name, str) or not isinstance(path, str) or not name or not path:
                raise RequestError("Both 'lora_name' and 'lora_path' must be provided.")
            slots = server.engine.lora
            if slots is None:
                raise RequestError(NOT_ENABLED)
            if name in slots.registered or name in server.config.served_model_names:
                raise RequestError(f"The lora adapter '{name}' has already been loaded.")
            adapter = adapter_from_path(name, path, slots.config.max_lora_rank)
            runner = server.runner
            if runner is None or server.dead():
                return error_response("the engine is dead", 503)
            try:
                wait_s = runner.add_lora(adapter)
            except ValueError as e:  # rank over --max-lora-rank
                raise RequestError(f"Loading lora {name} failed: {e}") from None
        except RequestError as e:
            return error_response(e.message, e.status, e.param)
        await asyncio.sleep(wait_s)  # answered once the engine has loaded it
        return web.Response(
            text=f"Success: LoRA adapter '{name}' added successfully.", content_type="text/plain"
        )

    async def unload(self, request: web.Request) -> web.StreamResponse:
        slots = self.server.engine.lora
        try:
            body = await read_json(request)
            if not isinstance(body, dict):
                raise RequestError("the request body must be a JSON object")
            name = body.get("lora_name")
            if not isinstance(name, str) or not name:
                raise RequestError("either 'lora_name' and 'lora_int_id' needs to be provided.")
            if slots is None or name not in slots.registered:
                raise RequestError(f"The lora adapter '{name}' cannot be found.", status=404)
            slots.remove(name)
        except RequestError as e:
            return error_response(e.message, e.status, e.param)
        return web.Response(
            text=f"Success: LoRA adapter '{name}' removed successfully.", content_type="text/plain"
        )
