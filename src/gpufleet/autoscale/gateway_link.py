"""The controller's and actuator's view of the gateway: signals in, replica changes out.

Two ways to reach it: the in-process `Gateway` object (`gpufleet up`) or its admin API
over HTTP (a gateway run elsewhere). Both give the fleet core's typed `GatewaySignals`
(the admin API as its JSON, parsed back into the same snapshot).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any, Protocol

import aiohttp

from gpufleet.autoscale.actuator import ManagedReplica
from gpufleet.autoscale.signals import FleetSignals, Percentiles, ReplicaSignals
from gpufleet.fleet_state import GatewaySignals, LatencyPercentiles
from gpufleet.routing.types import ReplicaState


class GatewayLike(Protocol):
    """The in-process gateway's replica management (gpufleet.gateway.Gateway; its
    `WorkerPool`, whose calls are coroutines, when it runs with several workers)."""

    def add_replica(
        self,
        url: str,
        replica_id: str | None = None,
        pool: str | None = None,
        models: list[str] | tuple[str, ...] = (),
        engine: str | None = None,
    ) -> Any: ...
    def drain_replica(self, replica_id: str) -> Any: ...
    def undrain_replica(self, replica_id: str) -> Any: ...
    def remove_replica(self, replica_id: str) -> Any: ...
    def signals(self) -> Any: ...


async def _done(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class InProcessGateway:
    """FleetRegistry and signal source over a `Gateway` (or `WorkerPool`) in this loop.

    With a `model`, it is one model group's: the replicas it adds serve that model (and
    run `engine`), and its signals are that model's alone (`GatewaySignals.for_model`)."""

    def __init__(
        self, gateway: GatewayLike, model: str | None = None, engine: str | None = None
    ) -> None:
        self.gateway = gateway
        self.model = model
        self.engine = engine
        self._ids: set[str] = set()  # the replicas this group added

    async def add(self, replica_id: str, url: str) -> None:
        if self.model is None:
            await _done(self.gateway.add_replica(url, replica_id=replica_id))
        else:
            await _done(
                self.gateway.add_replica(
                    url, replica_id=replica_id, models=[self.model], engine=self.engine
                )
            )
        self._ids.add(replica_id)

    async def drain(self, replica_id: str) -> None:
        await _done(self.gateway.drain_replica(replica_id))

    async def undrain(self, replica_id: str) -> None:
        await _done(self.gateway.undrain_replica(replica_id))

    async def remove(self, replica_id: str) -> None:
        self._ids.discard(replica_id)
        await _done(self.gateway.remove_replica(replica_id))

    async def in_flight(self, replica_id: str) -> int | None:
        r = (await self.read_signals()).replica(replica_id)
        return None if r is None else r.in_flight

    async def read_signals(self) -> GatewaySignals:
        signals: GatewaySignals = await _done(self.gateway.signals())
        return signals if self.model is None else signals.for_model(self.model, self._ids)


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

    async def add(self, replica_id: str, url: str, models: list[str] | None = None) -> None:
        body: dict[str, Any] = {"url": url, "id": replica_id}
        if models:
            body["models"] = models  # what it serves, before the gateway reads /v1/models
        await self._call("POST", "/admin/replicas", body)

    async def drain(self, replica_id: str) -> None:
        await self._call("POST", f"/admin/replicas/{replica_id}/drain")

    async def undrain(self, replica_id: str) -> None:
        await self._call("POST", f"/admin/replicas/{replica_id}/undrain")

    async def remove(self, replica_id: str) -> None:
        await self._call("DELETE", f"/admin/replicas/{replica_id}")

    async def in_flight(self, replica_id: str) -> int | None:
        r = (await self.read_signals()).replica(replica_id)
        return None if r is None else r.in_flight

    async def read_signals(self) -> GatewaySignals:
        data = await self._call("GET", "/admin/signals")
        if not isinstance(data, dict):
            raise ValueError("the gateway's /admin/signals did not answer a JSON object")
        return GatewaySignals.from_json(data)

    async def list_replicas(self) -> list[dict[str, Any]]:
        data = await self._call("GET", "/admin/replicas")
        return list(data.get("replicas", []))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _percentiles(p: LatencyPercentiles) -> Percentiles | None:
    if p.p90_s is None:
        return None
    p90 = p.p90_s
    return Percentiles(p90 if p.p50_s is None else p.p50_s, p90,
                       p90 if p.p99_s is None else p.p99_s)  # fmt: skip


def fleet_signals(
    gateway: GatewaySignals,
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
    for r in gateway.replicas:
        rid = r.replica_id
        seen.add(rid)
        state = r.state
        m = managed_by_id.get(rid)
        if m is not None and m.state in (ReplicaState.DRAINING, ReplicaState.DEAD):
            state = m.state
        replicas.append(
            ReplicaSignals(
                rid,
                state,
                running=r.num_running or 0,
                waiting=r.num_waiting or 0,
                kv_usage=r.kv_cache_usage or 0.0,
                in_flight=r.in_flight,
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
        queue_depth=gateway.queue_depth,
        in_flight=gateway.in_flight_total,
        ttft_s=_percentiles(gateway.ttft_s),
        tpot_s=_percentiles(gateway.tpot_s),
        window_s=gateway.window_s,
        cold_start_s=cold_start_s,
        admitted_total=gateway.admitted_total,
        latency_requests=gateway.streamed_requests_in_window,
        tokens_per_request=gateway.tokens_per_request,
        prompt_tokens_per_request=gateway.prompt_tokens_per_request,
    )
