"""Every gateway pod at once: the registry the Kubernetes actuator tells, and its signal source.

Gateways stand side by side behind one Service and keep only soft state, so each must be
told about each replica. The pods are the peers Service's EndpointSlice endpoints; each is
reached through its admin API (`AdminApiGateway`). `reconcile` makes every gateway hold the
ready replicas and drain the draining ones, which also refills a gateway that restarted.
`read_signals` merges what the gateways saw: counts add up, latency takes the worst.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Any

import aiohttp

from gpufleet.autoscale.gateway_link import AdminApiGateway
from gpufleet.fleet_state import GatewaySignals
from gpufleet.k8s.api import KubeApi

log = logging.getLogger("gpufleet.k8s")

# When two gateways disagree on a replica's state: our own drain wins, then any gateway
# that can reach it, then the rest.
_STATE_ORDER = {"draining": 0, "ready": 1, "starting": 2, "dead": 3}


class GatewayPeers:
    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        service: str,
        port: int,
        admin_key: str,
        model: str | None = None,
    ) -> None:
        """model: the group's model, when the gateways serve several groups (each with its
        own controller): replicas are added as serving it, and only its replicas removed."""
        self.api = api
        self.model = model
        self.namespace = namespace
        self.service = service
        self.port = port
        self.admin_key = admin_key
        self.gateways: dict[str, AdminApiGateway] = {}  # base URL → admin client

    async def refresh(self) -> None:
        """Follow the gateway pods that come and go."""
        urls = set()
        for eps in await self.api.endpoint_slices(self.namespace, self.service):
            port = next((p["port"] for p in eps.get("ports") or [] if p.get("port")), self.port)
            for ep in eps.get("endpoints") or []:
                if (ep.get("conditions") or {}).get("terminating"):
                    continue
                for address in ep.get("addresses") or []:
                    host = f"[{address}]" if ":" in address else address
                    urls.add(f"http://{host}:{port}")
        for url in set(self.gateways) - urls:
            await self.gateways.pop(url).close()
        for url in urls - set(self.gateways):
            self.gateways[url] = AdminApiGateway(url, self.admin_key)

    async def _each(self, method: str, *args: Any) -> list[Any]:
        """Call every gateway; one that fails is logged and skipped (it is told again on
        the next reconcile)."""

        async def one(url: str, gw: AdminApiGateway) -> Any:
            try:
                return await getattr(gw, method)(*args)
            except KeyError:
                return KeyError
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                log.warning("gateway %s: %s %s failed: %s", url, method, args[:1], e)
                return None

        return await asyncio.gather(*(one(u, g) for u, g in self.gateways.items()))

    # -- FleetRegistry ----------------------------------------------------------------
    async def add(self, replica_id: str, url: str) -> None:
        await self.reconcile({replica_id: url}, set(), remove_others=False)

    async def drain(self, replica_id: str) -> None:
        await self._each("drain", replica_id)

    async def undrain(self, replica_id: str) -> None:
        await self._each("undrain", replica_id)

    async def remove(self, replica_id: str) -> None:
        await self._each("remove", replica_id)

    async def in_flight(self, replica_id: str) -> int | None:
        counts = [c for c in await self._each("in_flight", replica_id) if isinstance(c, int)]
        return sum(counts) if counts else None

    # -- the whole picture ------------------------------------------------------------
    async def reconcile(
        self, ready: dict[str, str], draining: set[str], *, remove_others: bool = True
    ) -> None:
        """Every gateway: add the ready replicas it lacks, drain the draining ones it
        serves, and (remove_others) forget replicas the controller added that are gone.
        Replicas from a gateway's own config file are left alone."""

        async def one(gw: AdminApiGateway) -> None:
            try:
                listed = await gw.list_replicas()
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                log.warning("gateway %s unreachable: %s", gw.base_url, e)
                return
            known = {r["id"]: r for r in listed}
            for rid, url in ready.items():
                if rid not in known:
                    with contextlib.suppress(aiohttp.ClientResponseError):  # 409: just added
                        await gw.add(rid, url, [self.model] if self.model else None)
            for rid in draining:
                if rid in known and known[rid]["state"] != "draining":
                    with contextlib.suppress(KeyError):
                        await gw.drain(rid)
            if remove_others:
                for rid, r in known.items():
                    if not self._ours(r):
                        continue  # another group's replica: its own controller tends it
                    if r.get("source") == "admin" and rid not in ready and rid not in draining:
                        with contextlib.suppress(KeyError):
                            await gw.remove(rid)

        await asyncio.gather(*(one(gw) for gw in self.gateways.values()))

    def _ours(self, listed: dict[str, Any]) -> bool:
        return self.model is None or self.model in (listed.get("models") or ())

    async def read_signals(self) -> GatewaySignals:
        seen = [s.to_json() for s in await self._each("read_signals")
                if isinstance(s, GatewaySignals)]  # fmt: skip
        return GatewaySignals.from_json(merge_signals(seen))

    async def close(self) -> None:
        for gw in self.gateways.values():
            await gw.close()
        self.gateways.clear()


def _worst(values: Iterable[Any]) -> Any:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def merge_signals(gateways: list[dict[str, Any]]) -> dict[str, Any]:
    """Several gateways' /admin/signals as one: queue depths and in-flight counts add up
    (each gateway holds its own requests); engine stats are the same scrape seen twice
    (the freshest wins); TTFT/TPOT percentiles take the worst gateway (users behind it
    see that)."""
    out: dict[str, Any] = {
        "queue_depth": sum(int(g.get("queue_depth") or 0) for g in gateways),
        "in_flight_total": sum(int(g.get("in_flight_total") or 0) for g in gateways),
        "window_s": _worst(g.get("window_s") for g in gateways) or 0.0,
        "gateways": len(gateways),
    }
    by_model: dict[str, int] = {}
    for g in gateways:
        for model, n in (g.get("queue_depth_by_model") or {}).items():
            by_model[model] = by_model.get(model, 0) + int(n)
    out["queue_depth_by_model"] = by_model
    for key in ("ttft_s", "tpot_s"):
        parts = [g[key] for g in gateways if g.get(key) and g[key].get("p90") is not None]
        out[key] = (
            {q: _worst(p.get(q) for p in parts) for q in ("p50", "p90", "p99")} if parts else None
        )
    replicas: dict[str, dict[str, Any]] = {}
    for g in gateways:
        for r in g.get("replicas") or []:
            have = replicas.get(r["id"])
            if have is None:
                replicas[r["id"]] = dict(r)
                continue
            have["in_flight"] = int(have.get("in_flight") or 0) + int(r.get("in_flight") or 0)
            if _STATE_ORDER.get(str(r.get("state")), 9) < _STATE_ORDER.get(
                str(have.get("state")), 9
            ):
                have["state"] = r["state"]
            age, mine = r.get("stats_age_s"), have.get("stats_age_s")
            if age is not None and (mine is None or age < mine):
                for k in ("num_running", "num_waiting", "kv_cache_usage", "stats_age_s"):
                    have[k] = r.get(k)
    out["replicas"] = list(replicas.values())
    by_state: dict[str, int] = {}
    for r in replicas.values():
        by_state[str(r.get("state"))] = by_state.get(str(r.get("state")), 0) + 1
    out["replicas_by_state"] = by_state
    out["streamed_requests_in_window"] = sum(
        int(g.get("streamed_requests_in_window") or 0) for g in gateways
    )
    # Admissions are counts (each gateway admits its own requests): they add up.
    for key in ("admitted_total", "admitted_in_window"):
        out[key] = sum(int(g.get(key) or 0) for g in gateways)
    for key in ("admitted_total_by_model", "admitted_in_window_by_model"):
        counts: dict[str, int] = {}
        for g in gateways:
            for model, n in (g.get(key) or {}).items():
                counts[model] = counts.get(model, 0) + int(n)
        out[key] = counts
    out["time_s"] = max((float(g.get("time_s") or 0.0) for g in gateways), default=0.0)
    return out
