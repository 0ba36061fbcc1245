"""The few Kubernetes API calls the controller makes, through the official client.

Objects travel as plain JSON dicts (`_preload_content=False`), so the code depends on the
API's documented JSON, not on one generation of the client's model classes. The client is
synchronous; each call runs in a worker thread so the controller's event loop keeps going.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from gpufleet.k8s import require_client
from gpufleet.k8s.controller_config import ScaleTarget

Obj = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"HTTP {status} {reason}: {message}")
        self.status = status
        self.reason = reason


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    """409: a resourceVersion precondition failed, or the object already exists."""


def _error(exc: Exception) -> ApiError:
    status = int(getattr(exc, "status", 0) or 0)
    reason, message = str(getattr(exc, "reason", "")), str(exc)
    try:
        body = json.loads(getattr(exc, "body", None) or "{}")
        reason, message = body.get("reason", reason), body.get("message", message)
    except (TypeError, ValueError):
        pass
    cls = NotFound if status == 404 else Conflict if status == 409 else ApiError
    return cls(status, reason, message)


class KubeApi:
    def __init__(self, api_client: Any) -> None:
        k = require_client()
        self.api_client = api_client
        self.core = k.client.CoreV1Api(api_client)
        self.custom = k.client.CustomObjectsApi(api_client)
        self.discovery = k.client.DiscoveryV1Api(api_client)
        self.coordination = k.client.CoordinationV1Api(api_client)
        self._api_exception: type[Exception] = k.client.exceptions.ApiException

    @classmethod
    def from_environment(cls) -> KubeApi:
        """In a pod: its service account; elsewhere: the kubeconfig (as kubectl)."""
        k = require_client()
        try:
            k.config.load_incluster_config()
        except k.config.ConfigException:
            k.config.load_kube_config()
        return cls(k.client.ApiClient())

    @classmethod
    def for_host(cls, host: str) -> KubeApi:
        k = require_client()
        configuration = k.client.Configuration(host=host)
        return cls(k.client.ApiClient(configuration))

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Obj:
        def run() -> Obj:
            try:
                resp = fn(*args, _preload_content=False, **kwargs)
            except self._api_exception as exc:
                raise _error(exc) from None
            data: Obj = json.loads(resp.data or b"{}")
            return data

        return await asyncio.to_thread(run)

    # -- the scale subresource -------------------------------------------------------
    async def get_scale(self, namespace: str, t: ScaleTarget) -> Obj:
        return await self._call(
            self.custom.get_namespaced_custom_object_scale, t.group, t.version, namespace,
            t.plural, t.name,
        )  # fmt: skip

    async def replace_scale(self, namespace: str, t: ScaleTarget, scale: Obj) -> Obj:
        """PUT with the read resourceVersion: Conflict if someone changed it since."""
        return await self._call(
            self.custom.replace_namespaced_custom_object_scale, t.group, t.version, namespace,
            t.plural, t.name, scale,
        )  # fmt: skip

    # -- discovery, pods -------------------------------------------------------------
    async def endpoint_slices(self, namespace: str, service: str) -> list[Obj]:
        data = await self._call(
            self.discovery.list_namespaced_endpoint_slice,
            namespace,
            label_selector=f"kubernetes.io/service-name={service}",
        )
        items: list[Obj] = data.get("items") or []
        return items

    async def pods(self, namespace: str, selector: str) -> list[Obj]:
        data = await self._call(self.core.list_namespaced_pod, namespace, label_selector=selector)
        items: list[Obj] = data.get("items") or []
        return items

    async def patch_pod(self, namespace: str, name: str, patch: Obj) -> Obj:
        return await self._call(
            self.core.patch_namespaced_pod, name, namespace, patch, _content_type=MERGE_PATCH
        )

    # -- leases ----------------------------------------------------------------------
    async def read_lease(self, namespace: str, name: str) -> Obj:
        return await self._call(self.coordination.read_namespaced_lease, name, namespace)

    async def create_lease(self, namespace: str, lease: Obj) -> Obj:
        return await self._call(self.coordination.create_namespaced_lease, namespace, lease)

    async def replace_lease(self, namespace: str, name: str, lease: Obj) -> Obj:
        return await self._call(self.coordination.replace_namespaced_lease, name, namespace, lease)
