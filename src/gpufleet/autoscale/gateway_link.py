"""The controller's and actuator's view of the gateway: signals in, replica changes out.

Two ways to reach it: the in-process `Gateway` object (`gpufleet up`) or its admin API
over HTTP (a gateway run elsewhere). Both speak the JSON of `Gateway.signals()`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import aiohttp

from gpufleet.autoscale.actuator import ManagedReplica
from gpufleet.autoscale.signals import FleetSignals, Percentiles, ReplicaSignals
from gpufleet.routing.types import ReplicaState


class GatewayLike(Protocol):
    """The in-process gateway's replica management (gpufleet.gateway.Gateway)."""

    def add_replica(self, url: str, replica_id: str | None = None) -> dict[str, Any]: ...
    def drain_replica(self, replica_id: str) -> dict[str, Any]: ...
    def remove_replica(self, replica_id: str) -> dict[str, Any]: ...
    def signals(self) -> dict[str, Any]: ...


class InProcessGateway:
    """FleetRegistry and signal source over a `Gateway` in this event loop."""

    def __init__(self, gateway: GatewayLike) -> None:
        self.gateway = gateway

    async def add(self, replica_id: str, url: str) -> None:
        self.gateway.add_replica(url, replica_id=replica_id)

    async def drain(self, replica_id: str) -> None:
        self.gateway.drain_replica(replica_id)

    async def remove(self, replica_id: str) -> None:
        self.gateway.remove_replica(replica_id)

    async def in_flight(self, replica_id: str) -> int | None:
        for r in self.gateway.signals().get("replicas", []):
            if r.get("id") == replica_id:
                return int(r.get("in_flight") or 0)
        return None

    async def read_signals(self) -> dict[str, Any]:
        return self.gateway.signals()


class AdminApiGateway:
    """FleetRegistry and signal source over the gateway's admin API."""

    def __init__(self, base_url: str, admin_key: str, timeout_s: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {admin_key}"}
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self.headers, timeout=self.timeout)
        return self._session

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        async with self._http().request(method, self.base_url + path, json=body) as resp:
            if resp.status == 404:
                raise KeyError(path)
            resp.raise_for_status()
            return await resp.json()

    async def add(self, replica_id: str, url: str) -> None:
        await self._call("POST", "/admin/replicas", {"url": url, "id": replica_id})

    async def drain(self, replica_id: str) -> None:
        await self._call("POST", f"/admin/replicas/{replica_id}/drain")

    async def remove(self, replica_id: str) -> None:
        await self._call("DELETE", f"/admin/replicas/{replica_id}")

    async def in_flight(self, replica_id: str) -> int | None:
        for r in (await self.read_signals()).get("replicas", []):
            if r.get("id") == replica_id:
                return int(r.get("in_flight") or 0)
        return None

    async def read_signals(self) -> dict[str, Any]:
        data: dict[str, Any] = await self._call("GET", "/admin/signals")
        return data

    async def list_replicas(self) -> list[dict[str, Any]]:
        data = await self._call("GET", "/admin/replicas")
        return list(data.get("replicas", []))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _percentiles(raw: Mapping[str, Any] | None) -> Percentiles | None:
    if not raw or raw.get("p90") is None:
        return None
    p90 = float(raw["p90"])
    p50, p99 = raw.get("p50"), raw.get("p99")
    return Percentiles(p90 if p50 is None else float(p50), p90, p90 if p99 is None else float(p99))


def _state(raw: object) -> ReplicaState:
    try:
        return ReplicaState(str(raw))
    except ValueError:
        return ReplicaState.DEAD


def fleet_signals(
    gateway: Mapping[str, Any],
    managed: Iterable[ManagedReplica],
    cold_start_s: float | None = None,
) -> FleetSignals:
    """Merge the gateway's signals with the actuator's own list.

    The actuator is the truth for replicas it is starting (the gateway does not know them
    until /health passes) or draining; the gateway is the truth for load and for health
    (a replica it ejected counts as dead until it passes probes again).
    """
    managed_by_id = {m.replica_id: m for m in managed}
    seen: set[str] = set()
    replicas: list[ReplicaSignals] = []
    for r in gateway.get("replicas", []):
        rid = str(r.get("id"))
        seen.add(rid)
        state = _state(r.get("state"))
        m = managed_by_id.get(rid)
        if m is not None and m.state in (ReplicaState.DRAINING, ReplicaState.DEAD):
            state = m.state
        replicas.append(
            ReplicaSignals(
                rid,
                state,
                running=int(r.get("num_running") or 0),
                waiting=int(r.get("num_waiting") or 0),
                kv_usage=float(r.get("kv_cache_usage") or 0.0),
                in_flight=int(r.get("in_flight") or 0),
                expected_ready_s=m.expected_ready_s if m is not None else None,
            )
        )
    for m in managed_by_id.values():
        if m.replica_id in seen or m.state == ReplicaState.DEAD:
            continue
        # Not registered yet: starting (or ready an instant before registration).
        state = ReplicaState.STARTING if m.state == ReplicaState.READY else m.state
        replicas.append(ReplicaSignals(m.replica_id, state, expected_ready_s=m.expected_ready_s))
    return FleetSignals(
        replicas=tuple(replicas),
        queue_depth=int(gateway.get("queue_depth") or 0),
        in_flight=int(gateway.get("in_flight_total") or 0),
        ttft_s=_percentiles(gateway.get("ttft_s")),
        tpot_s=_percentiles(gateway.get("tpot_s")),
        window_s=float(gateway.get("window_s") or 0.0),
        cold_start_s=cold_start_s,
    )
