"""`KubernetesActuator`: the `Actuator` interface over a Deployment (or LeaderWorkerSet).

- Scale: through the workload's scale subresource, read-modify-write with its
  resourceVersion; a 409 Conflict (someone else wrote in between) is re-read and retried.
- Discover: the group Service's EndpointSlices (label kubernetes.io/service-name) give each
  pod's address and readiness; the pods (label gpufleet.io/group) give their age and marks.
  A ready endpoint is registered with every gateway; one that terminates is removed.
- Drain: mark the pod (`controller.kubernetes.io/pod-deletion-cost` = the lowest value, and
  `gpufleet.io/draining-since`), drain it at the gateways, wait until no request is in
  flight (gateways and the engine's /metrics) or the deadline, then lower the replica
  count by one: the ReplicaSet removes the lowest-cost pod, the drained one. (It ranks
  not-ready pods before the deletion cost: the default policy never scales in while a
  replica is starting, so the drained pod is the one.) A LeaderWorkerSet's leaders are a
  StatefulSet, which always removes the highest ordinal: there the drain goes to that one.
- Adopt: nothing is remembered between syncs that the cluster does not hold. After a
  restart, `sync()` reads the pods back: ready ones are ready, marked ones resume their
  drain against the same deadline, and pods beyond spec.replicas (the ReplicaSet has not
  removed them yet) are already leaving, so no replica is drained or removed twice.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import aiohttp

from gpufleet.autoscale.actuator import FleetRegistry, ManagedReplica
from gpufleet.autoscale.draining import requests_left
from gpufleet.k8s.api import Conflict, KubeApi, Obj
from gpufleet.k8s.controller_config import ControllerConfig
from gpufleet.k8s.objects import DELETION_COST, DRAINING_SINCE, GROUP_LABEL, ROLE_LABEL
from gpufleet.routing.types import ReplicaState

log = logging.getLogger("gpufleet.k8s")

LOWEST_DELETION_COST = str(-(2**31))
SCALE_RETRIES = 5


class Registry(FleetRegistry, Protocol):
    async def reconcile(self, ready: dict[str, str], draining: set[str]) -> None:
        """Make every gateway hold exactly these replicas (ids → URLs), draining ones drained."""
        ...


def _epoch(timestamp: str | None) -> float | None:
    if not timestamp:
        return None
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


@dataclass(slots=True)
class _Pod:
    replica: ManagedReplica
    draining_since_s: float | None = None
    deletion_cost: int = 0
    created_s: float = 0.0
    drain_task: asyncio.Task[None] | None = None


@dataclass(slots=True)
class _View:
    """One sync's reading of the cluster."""

    spec_replicas: int
    live: dict[str, Obj] = field(default_factory=dict)  # pods not terminating, by name
    endpoints: dict[str, Obj] = field(default_factory=dict)  # EndpointSlice endpoints, by pod


class KubernetesActuator:
    def __init__(
        self,
        api: KubeApi,
        config: ControllerConfig,
        registry: Registry,
        *,
        clock: Callable[[], float] = time.time,
        poll_s: float = 1.0,
    ) -> None:
        self.api = api
        self.cfg = config
        self.registry = registry
        self.clock = clock  # wall-clock seconds: pods' timestamps are wall-clock too
        self.poll_s = poll_s
        self._pods: dict[str, _Pod] = {}
        self._pending: list[ManagedReplica] = []  # counted in spec.replicas, no pod yet
        self._leaving: set[str] = set()  # beyond spec.replicas: the ReplicaSet removes them
        self._cold_starts_s: deque[float] = deque(maxlen=8)
        self._session: aiohttp.ClientSession | None = None
        self.scale_conflicts = 0  # 409s met (and retried) on the scale subresource

    # -- Actuator ---------------------------------------------------------------------
    async def start(self, n: int) -> list[ManagedReplica]:
        if n <= 0:
            return []
        await self._scale_by(n)
        now = self.clock()
        new = [self._placeholder(now) for _ in range(n)]
        self._pending += new
        return new

    async def undrain(self, replica_id: str) -> bool:
        """Never: the workload controller chose the pod and the scale subresource already
        counts it gone, so a scale-out here starts a new pod while a drained one finishes."""
        return False

    async def drain(self, replica_id: str) -> None:
        victim = self._victim(replica_id)
        if victim is None:
            return
        if victim.state == ReplicaState.STARTING:
            await self.stop(victim.replica_id)  # serves nothing yet: nothing to drain
            return
        pod = self._pods[victim.replica_id]
        now = self.clock()
        await self._mark(victim.replica_id, now)
        pod.draining_since_s = now
        victim.state = ReplicaState.DRAINING
        with contextlib.suppress(KeyError):
            await self.registry.drain(victim.replica_id)
        self._start_drain(pod)

    def _victim(self, replica_id: str) -> ManagedReplica | None:
        """The replica a scale-in by one will actually remove, given that one was asked for.

        The workload controller decides which pod goes, not us: a placeholder (a pod not
        created yet) or a not-ready pod goes before any ready one, whatever its deletion
        cost; a StatefulSet (LeaderWorkerSet leaders) removes its highest ordinal. Drain
        that one, so that the drained pod is the one removed.
        """
        asked = next((r for r in self.list() if r.replica_id == replica_id), None)
        if asked is None or asked.state in (ReplicaState.DRAINING, ReplicaState.DEAD):
            return None
        if self._pending:
            return asked if asked in self._pending else self._pending[-1]
        if self._ordered:
            return self._highest_ordinal() or asked
        starting = [
            p.replica for p in self._pods.values() if p.replica.state == ReplicaState.STARTING
        ]
        if starting and asked not in starting:
            log.info("scale-in removes a starting pod first: %s instead of %s",
                     starting[-1].replica_id, replica_id)  # fmt: skip
            return starting[-1]
        return asked

    async def stop(self, replica_id: str) -> None:
        pending = [r for r in self._pending if r.replica_id == replica_id]
        if pending:
            await self._scale_by(-1)
            self._pending.remove(pending[0])
            return
        pod = self._pods.get(replica_id)
        if pod is None:
            return
        if pod.drain_task is not None and pod.drain_task is not asyncio.current_task():
            pod.drain_task.cancel()
        if pod.draining_since_s is None:
            await self._mark(replica_id, self.clock())
        with contextlib.suppress(KeyError):
            await self.registry.remove(replica_id)
        await self._scale_by(-1)
        pod.replica.state = ReplicaState.DEAD
        self._leaving.add(replica_id)
        self._pods.pop(replica_id, None)

    def list(self) -> builtins.list[ManagedReplica]:
        return [p.replica for p in self._pods.values()] + list(self._pending)

    def observed_cold_start_s(self) -> float | None:
        if not self._cold_starts_s:
            return None
        return sum(self._cold_starts_s) / len(self._cold_starts_s)

    async def close(self) -> None:
        """Stop waiting on drains (a new leader resumes them); the pods stay as they are."""
        for pod in self._pods.values():
            if pod.drain_task is not None:
                pod.drain_task.cancel()
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- reading the cluster ----------------------------------------------------------
    async def sync(self) -> None:
        """Read the workload, its pods and EndpointSlices; adopt what is there; tell the
        gateways which replicas are ready and which are draining."""
        view = await self._read()
        now = self.clock()
        # Pods beyond spec.replicas are being removed by the ReplicaSet, the cheapest first.
        surplus = len(view.live) - view.spec_replicas
        ranked = sorted(view.live, key=lambda n: self._removal_rank(view.live[n], self._ordered))
        self._leaving = set(ranked[: max(0, surplus)])
        for name in list(self._pods):
            if name not in view.live or name in self._leaving:
                await self._forget(name)
        for name, obj in view.live.items():
            if name not in self._leaving:
                self._observe(name, obj, view.endpoints.get(name), now)
        missing = max(0, view.spec_replicas - len(view.live))
        self._pending = self._pending[:missing]
        while len(self._pending) < missing:
            self._pending.append(self._placeholder(now))
        await self.registry.reconcile(
            {
                n: p.replica.url
                for n, p in self._pods.items()
                if p.replica.state == ReplicaState.READY
            },
            {n for n, p in self._pods.items() if p.replica.state == ReplicaState.DRAINING},
        )

    async def _read(self) -> _View:
        scale = await self.api.get_scale(self.cfg.namespace, self.cfg.target)
        view = _View(int(scale.get("spec", {}).get("replicas") or 0))
        selector = f"{GROUP_LABEL}={self.cfg.group}"
        if self.cfg.target.kind == "LeaderWorkerSet":
            selector += f",{ROLE_LABEL}=leader"  # a replica's address is its leader's
        for pod in await self.api.pods(self.cfg.namespace, selector):
            if not pod["metadata"].get("deletionTimestamp"):
                view.live[pod["metadata"]["name"]] = pod
        for eps in await self.api.endpoint_slices(self.cfg.namespace, self.cfg.group):
            for ep in eps.get("endpoints") or []:
                ref = ep.get("targetRef") or {}
                if ref.get("kind") == "Pod" and ep.get("addresses"):
                    view.endpoints[ref["name"]] = ep
        return view

    def _observe(self, name: str, obj: Obj, endpoint: Obj | None, now: float) -> None:
        annotations = obj["metadata"].get("annotations") or {}
        conditions = (endpoint or {}).get("conditions") or {}
        ready = bool(conditions.get("ready")) and not conditions.get("terminating")
        url = f"http://{endpoint['addresses'][0]}:{self.cfg.engine_port}" if endpoint else ""
        created = _epoch(obj["metadata"].get("creationTimestamp")) or now
        pod = self._pods.get(name)
        seen_starting = pod is not None and pod.replica.state == ReplicaState.STARTING
        if pod is None:
            replica = ManagedReplica(
                name, url, ReplicaState.STARTING, started_at_s=created,
                expected_ready_s=created + self._expected_startup(),
            )  # fmt: skip
            pod = self._pods[name] = _Pod(replica, created_s=created)
        pod.replica.url = url or pod.replica.url
        pod.deletion_cost = int(annotations.get(DELETION_COST, "0"))
        since = annotations.get(DRAINING_SINCE)
        if since is not None and pod.draining_since_s is None:
            pod.draining_since_s = float(since)  # adopted mid-drain
        if pod.draining_since_s is not None:
            pod.replica.state = ReplicaState.DRAINING
            if pod.drain_task is None:
                self._start_drain(pod)
        elif ready and pod.replica.state == ReplicaState.STARTING:
            pod.replica.state = ReplicaState.READY
            pod.replica.ready_at_s = now
            if seen_starting:  # seen come up (an adopted ready pod says nothing)
                self._cold_starts_s.append(now - pod.created_s)
            log.info("%s ready after %.0f s", name, now - pod.created_s)
        elif not ready and pod.replica.state == ReplicaState.READY:
            pod.replica.state = ReplicaState.STARTING  # failing readiness: not serving

    async def _forget(self, name: str) -> None:
        pod = self._pods.pop(name)
        if pod.drain_task is not None:
            pod.drain_task.cancel()
        pod.replica.state = ReplicaState.DEAD
        with contextlib.suppress(KeyError):
            await self.registry.remove(name)

    # -- changing the cluster ---------------------------------------------------------
    async def _scale_by(self, delta: int) -> int:
        """spec.replicas += delta through the scale subresource; returns the new value."""
        ns, target = self.cfg.namespace, self.cfg.target
        for _ in range(SCALE_RETRIES):
            scale = await self.api.get_scale(ns, target)
            current = int(scale.get("spec", {}).get("replicas") or 0)
            wanted = max(0, current + delta)
            body = {
                "apiVersion": "autoscaling/v1",
                "kind": "Scale",
                "metadata": {
                    "name": target.name,
                    "namespace": ns,
                    "resourceVersion": scale["metadata"]["resourceVersion"],
                },
                "spec": {"replicas": wanted},
            }
            try:
                await self.api.replace_scale(ns, target, body)
            except Conflict:
                self.scale_conflicts += 1
                continue  # written by someone else since we read it: read again
            log.info("%s %s: replicas %d → %d", target.kind, target.name, current, wanted)
            return wanted
        raise RuntimeError(f"scale of {target.name}: {SCALE_RETRIES} conflicts in a row")

    async def _mark(self, name: str, since_s: float) -> None:
        patch = {"metadata": {"annotations": {DELETION_COST: LOWEST_DELETION_COST,
                                              DRAINING_SINCE: f"{since_s:.3f}"}}}  # fmt: skip
        await self.api.patch_pod(self.cfg.namespace, name, patch)

    def _start_drain(self, pod: _Pod) -> None:
        pod.drain_task = asyncio.get_running_loop().create_task(self._finish_drain(pod))

    async def _finish_drain(self, pod: _Pod) -> None:
        rid = pod.replica.replica_id
        deadline = (pod.draining_since_s or self.clock()) + self.cfg.drain_deadline_s
        with contextlib.suppress(KeyError):
            await self.registry.drain(rid)  # again, for a gateway that restarted meanwhile
        left = await self._requests_left(pod)
        while left > 0 and self.clock() < deadline:
            await asyncio.sleep(self.poll_s)
            left = await self._requests_left(pod)
        if left:
            pod.replica.cut_requests += left
            log.warning("%s: drain deadline passed with %d requests in flight", rid, left)
        await self.stop(rid)

    async def _requests_left(self, pod: _Pod) -> int:
        if not pod.replica.url:
            return await self.registry.in_flight(pod.replica.replica_id) or 0
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0))
        return await requests_left(self.registry, self._session, pod.replica)

    # -- small helpers ----------------------------------------------------------------
    def _expected_startup(self) -> float:
        return self.observed_cold_start_s() or self.cfg.expected_startup_s

    def _placeholder(self, now: float) -> ManagedReplica:
        taken = {r.replica_id for r in self._pending}
        i = next(
            i for i in range(1, len(taken) + 2) if f"{self.cfg.group}-pending-{i}" not in taken
        )
        return ManagedReplica(
            f"{self.cfg.group}-pending-{i}", "", ReplicaState.STARTING, started_at_s=now,
            expected_ready_s=now + self._expected_startup(),
        )  # fmt: skip

    def _highest_ordinal(self) -> ManagedReplica | None:
        """A StatefulSet removes its highest ordinal first (`name-<ordinal>`); pods
        already draining are on their way out."""

        def ordinal(r: ManagedReplica) -> int:
            tail = r.replica_id.rsplit("-", 1)[-1]
            return int(tail) if tail.isdigit() else -1

        live = [p.replica for p in self._pods.values()
                if p.replica.state in (ReplicaState.READY, ReplicaState.STARTING)]  # fmt: skip
        return max(live, key=ordinal, default=None)

    @property
    def _ordered(self) -> bool:
        return self.cfg.target.ordered_scale_in

    @staticmethod
    def _removal_rank(pod: Obj, ordered: bool = False) -> tuple[Any, ...]:
        """The workload controller's order of removal: a StatefulSet's highest ordinal
        first; a ReplicaSet's (pkg/controller/controller_utils.go ActivePodsWithRanks,
        reduced to what a drain decides) not ready first, then the lowest
        pod-deletion-cost, then the newest."""
        name = pod["metadata"]["name"]
        if ordered:
            tail = name.rsplit("-", 1)[-1]
            return (-(int(tail) if tail.isdigit() else -1),)
        conditions = pod.get("status", {}).get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        annotations = pod["metadata"].get("annotations") or {}
        created = _epoch(pod["metadata"].get("creationTimestamp")) or 0.0
        return (ready, int(annotations.get(DELETION_COST, "0")), -created)
