"""Loading a LoRA adapter onto a replica through its engine's dynamic-LoRA API (the I/O; the
books are the fleet core's: `FleetState.adapter_missing / adapter_registered / _refused`).

- vLLM: `POST /v1/load_lora_adapter {"lora_name", "lora_path"}` answers 200 with a text
  line, or an OpenAI-style error (400 "has already been loaded", 404 "No adapter found");
  the route exists only when the server runs with `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`.
- SGLang: `POST /load_lora_adapter` with the same two fields answers
  `{"success": ..., "error_message": ...}` (200 or 400); requests then name the adapter as
  `model: "<base>:<adapter>"`.

A replica's API is found by trying vLLM's route, then SGLang's; one that has neither (a
404 on both) does not load adapters at runtime, and the core offers it only the adapters
it already holds. Loads of one adapter onto one replica are shared by every request that
needs it meanwhile; a load that failed is not retried on that replica for
`FAILED_LOAD_HOLD_S` (requests go elsewhere).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from gpufleet.fleet_state import AdapterSpec, FleetState
from gpufleet.gateway.replicas import Replica

log = logging.getLogger("gpufleet.gateway")
FAILED_LOAD_HOLD_S = 10.0


@dataclass(frozen=True, slots=True)
class LoraApi:
    engine: str
    load_path: str
    unload_path: str


VLLM_LORA_API = LoraApi("vllm", "/v1/load_lora_adapter", "/v1/unload_lora_adapter")
SGLANG_LORA_API = LoraApi("sglang", "/load_lora_adapter", "/unload_lora_adapter")
LORA_APIS = {api.engine: api for api in (VLLM_LORA_API, SGLANG_LORA_API)}
NO_RUNTIME_LORA = (
    "does not load LoRA adapters at runtime (404 on /v1/load_lora_adapter and "
    "/load_lora_adapter; vLLM needs --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)"
)


@dataclass(frozen=True, slots=True)
class LoadResult:
    ok: bool
    status: int = 200  # what the client gets if the load decides its request's fate
    message: str = ""


def request_body_for(replica: Replica, body: bytes, base_model: str, adapter: str) -> bytes:
    """The body to forward: SGLang names an adapter `<base>:<adapter>`; vLLM by its name."""
    if replica.lora_api != SGLANG_LORA_API.engine:
        return body
    data = json.loads(body)
    data["model"] = f"{base_model}:{adapter}"
    return json.dumps(data).encode()


class AdapterLoader:
    def __init__(
        self,
        fleet: FleetState[Replica],
        session: Callable[[], aiohttp.ClientSession | None],
        timeout_s: float,
    ) -> None:
        self.fleet = fleet
        self._session = session
        self.timeout_s = timeout_s
        self._loading: dict[tuple[str, str], asyncio.Task[LoadResult]] = {}
        self._failed: dict[tuple[str, str], tuple[float, LoadResult]] = {}

    async def ensure(self, replica: Replica, spec: AdapterSpec) -> LoadResult:
        """Load `spec` onto `replica` unless it is there; shared by concurrent callers."""
        if spec.name in replica.models:
            return LoadResult(True)
        key = (replica.replica_id, spec.name)
        failed = self._failed.get(key)
        if failed is not None:
            if time.monotonic() < failed[0]:
                return failed[1]
            del self._failed[key]
        task = self._loading.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._load(replica, spec))
            self._loading[key] = task
            task.add_done_callback(lambda _: self._loading.pop(key, None))
        # shield: a client that leaves must not cancel a load other requests wait for
        result = await asyncio.shield(task)
        if not result.ok:
            self._failed[key] = (time.monotonic() + FAILED_LOAD_HOLD_S, result)
        return result

    async def _load(self, replica: Replica, spec: AdapterSpec) -> LoadResult:
        known = LORA_APIS.get(replica.lora_api or "")
        apis = [known] if known else [VLLM_LORA_API, SGLANG_LORA_API]
        payload = {"lora_name": spec.name, "lora_path": spec.path}
        route_missing = 0
        for api in apis:
            try:
                status, body = await self._post(replica.url + api.load_path, payload)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                return LoadResult(False, 502, f"loading LoRA adapter {spec.name!r} on replica "
                                  f"{replica.replica_id} failed: {exc!r}")  # fmt: skip
            message = _message(body)
            if status == 200 and _succeeded(body):
                return self._registered(replica, spec, api)
            if "already" in message.lower() and "load" in message.lower():
                return self._registered(replica, spec, api)  # another gateway was first
            if status == 404 and not _about(message, spec, api):
                route_missing += 1  # no such route here: try the other engine's
                continue
            if "not enabled" in message.lower() or "enable-lora" in message.lower():
                self.fleet.adapter_refused(replica, message)
            log.warning("replica %s could not load LoRA adapter %s from %s: %s %s",
                        replica.replica_id, spec.name, spec.path, status, message)  # fmt: skip
            return LoadResult(False, 502, f"replica {replica.replica_id} could not load the "
                              f"LoRA adapter {spec.name!r} from {spec.path!r}: {message}")  # fmt: skip
        if route_missing == len(apis):
            self.fleet.adapter_refused(replica, NO_RUNTIME_LORA)
            log.warning("replica %s %s", replica.replica_id, NO_RUNTIME_LORA)
        return LoadResult(False, 502, f"replica {replica.replica_id} {NO_RUNTIME_LORA}")

    def _registered(self, replica: Replica, spec: AdapterSpec, api: LoraApi) -> LoadResult:
        replica.lora_api = api.engine
        self.fleet.adapter_registered(replica, spec.name)
        log.info("LoRA adapter %s loaded on replica %s", spec.name, replica.replica_id)
        return LoadResult(True)

    async def _post(self, url: str, payload: dict[str, str]) -> tuple[int, str]:
        session = self._session()
        if session is None:
            raise aiohttp.ClientError("the gateway is not started")
        async with session.post(
            url, json=payload, timeout=aiohttp.ClientTimeout(total=self.timeout_s)
        ) as resp:
            return resp.status, await resp.text()


def _parsed(body: str) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def _succeeded(body: str) -> bool:
    """vLLM answers plain text; SGLang a JSON object with `success`."""
    data = _parsed(body)
    return not (isinstance(data, dict) and data.get("success") is False)


def _message(body: str) -> str:
    data = _parsed(body)
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        for key in ("message", "error_message", "detail"):
            if isinstance(data.get(key), str):
                return str(data[key])
    return body.strip()[:500]


def _about(message: str, spec: AdapterSpec, api: LoraApi) -> bool:
    """Whether a 404 is about the adapter (its path not found), not a missing route: a
    route-missing answer may name the route (`Not Found: POST /v1/load_lora_adapter`),
    whose own name says "adapter", so the route is taken out before looking."""
    text = message.replace(api.load_path, "")
    return spec.name in text or spec.path in text or "adapter" in text.lower()
