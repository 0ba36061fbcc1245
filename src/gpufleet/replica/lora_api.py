"""The dynamic-LoRA endpoints on the simulated replica (see `gpufleet.replica.lora`).

- vLLM: `POST /v1/load_lora_adapter` / `/v1/unload_lora_adapter`, only with
  `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`; 200 and a text line, or an OpenAI error.
- SGLang (`--engine sglang`): `POST /load_lora_adapter` / `/unload_lora_adapter`, always
  routed; `{"success", "error_message", "loaded_adapters"}` with 200, or 400 on failure
  (SGLang's LoadLoRAAdapterReqOutput).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gpufleet.replica.errors import RequestError
from gpufleet.replica.http import error_response, json_response, read_json
from gpufleet.replica.lora import NOT_ENABLED, adapter_from_path

if TYPE_CHECKING:
    from gpufleet.replica.app import ReplicaServer


class LoraApi:
    """vLLM's answers."""

    load_path = "/v1/load_lora_adapter"
    unload_path = "/v1/unload_lora_adapter"

    def __init__(self, server: ReplicaServer) -> None:
        self.server = server

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post(self.load_path, self.load)
        app.router.add_post(self.unload_path, self.unload)

    async def load(self, request: web.Request) -> web.StreamResponse:
        try:
            name = await self._load(request)
        except RequestError as e:
            return self.failed(e)
        except _EngineDead:
            return error_response("the engine is dead", 503)
        return self.done(f"Success: LoRA adapter '{name}' added successfully.")

    async def unload(self, request: web.Request) -> web.StreamResponse:
        try:
            name = await self._unload(request)
        except RequestError as e:
            return self.failed(e)
        return self.done(f"Success: LoRA adapter '{name}' removed successfully.")

    def done(self, message: str) -> web.Response:
        return web.Response(text=message, content_type="text/plain")

    def failed(self, e: RequestError) -> web.Response:
        return error_response(e.message, e.status, e.param)

    async def _load(self, request: web.Request) -> str:
        server = self.server
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
            raise _EngineDead
        try:
            wait_s = runner.add_lora(adapter)
        except ValueError as e:  # rank over --max-lora-rank
            raise RequestError(f"Loading lora {name} failed: {e}") from None
        await asyncio.sleep(wait_s)  # answered once the engine has loaded it
        return name

    async def _unload(self, request: web.Request) -> str:
        slots = self.server.engine.lora
        body = await read_json(request)
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        name = body.get("lora_name")
        if not isinstance(name, str) or not name:
            raise RequestError("either 'lora_name' and 'lora_int_id' needs to be provided.")
        if slots is None or name not in slots.registered:
            raise RequestError(f"The lora adapter '{name}' cannot be found.", status=404)
        slots.remove(name)
        return name


class SglangLoraApi(LoraApi):
    """SGLang's routes and answers: always a LoadLoRAAdapterReqOutput-shaped JSON object."""

    load_path = "/load_lora_adapter"
    unload_path = "/unload_lora_adapter"

    def done(self, message: str) -> web.Response:
        return json_response(self._output(True, None))

    def failed(self, e: RequestError) -> web.Response:
        return json_response(self._output(False, e.message), status=400)

    def _output(self, success: bool, error: str | None) -> dict[str, Any]:
        slots = self.server.engine.lora
        loaded = {a.name: a.path for a in slots.registered.values()} if slots else {}
        return {"success": success, "error_message": error, "loaded_adapters": loaded}


class _EngineDead(Exception):
    pass
