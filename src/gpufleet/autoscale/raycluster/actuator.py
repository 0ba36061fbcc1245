"""`RayActuator`: the `Actuator` interface over a Ray cluster.

Each replica is one detached placement group shaped by its layout (`ReplicaShape`) and one
detached `ReplicaHost` actor pinned to bundle 0, both named "{fleet}/{replica_id}.{gen}"
in the fleet's namespace, so that a restarted controller reads the fleet back from Ray
(`adopt`). Lifecycle as the local backend: starting (placement pending, then loading) →
/health passes → registered with the gateway → draining (in-flight requests finish, up to
the deadline) → actor and placement group removed. A replica whose process exits, whose
actor dies or whose node goes away (its /health stops answering) is ejected from the
gateway and replaced by a new generation in a new placement group.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import ray
from ray.util.placement_group import (
    get_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from gpufleet.autoscale.actuator import FleetRegistry, ManagedReplica
from gpufleet.autoscale.lifecycle import ActuatorBase, Entry
from gpufleet.autoscale.local import check_template
from gpufleet.autoscale.raycluster.host import ReplicaHost
from gpufleet.autoscale.raycluster.shape import (
    ReplicaShape,
    parse_replica_name,
    replica_index,
    replica_name,
    shortage,
)
from gpufleet.routing.types import ReplicaState

log = logging.getLogger("gpufleet.autoscale")

_Host = ray.remote(ReplicaHost)


@dataclass(slots=True)
class _Slot(Entry):
    generation: int = 0
    pg: Any = None
    actor: Any = None
    info: dict[str, Any] = field(default_factory=dict)
    pending_since_s: float | None = None
    replacing: bool = False


class RayActuator(ActuatorBase[_Slot]):
    def __init__(
        self,
        command: str,
        *,
        shape: ReplicaShape,
        fleet: str,
        namespace: str,
        values: Mapping[str, object] | None = None,
        registry: FleetRegistry | None = None,
        expected_startup_s: float = 30.0,
        health_timeout_s: float = 600.0,
        drain_deadline_s: float = 60.0,
        stop_grace_s: float = 10.0,
        restart_crashed: bool = True,
        log_dir: Path | None = None,
        probe_interval_s: float = 1.0,
        probe_failures: int = 3,
        clock: Callable[[], float] = time.monotonic,
        id_prefix: str = "replica",
    ) -> None:
        check_template(command)
        super().__init__(
            registry=registry,
            expected_startup_s=expected_startup_s,
            health_timeout_s=health_timeout_s,
            drain_deadline_s=drain_deadline_s,
            stop_grace_s=stop_grace_s,
            restart_crashed=restart_crashed,
            clock=clock,
            id_prefix=id_prefix,
        )
        self.command = command
        self.shape = shape
        self.fleet = fleet
        self.namespace = namespace
        self.values: dict[str, object] = {"tp": shape.tp, "pp": shape.pp, **(values or {})}
        self.log_dir = log_dir
        self.probe_interval_s = probe_interval_s
        self.probe_failures = probe_failures
        self.id_prefix = id_prefix

    # -- Actuator ---------------------------------------------------------------------
    async def start(self, n: int) -> builtins.list[ManagedReplica]:
        started = []
        for _ in range(n):
            slot = _Slot(self._new_replica())
            self._entries[slot.replica.replica_id] = slot
            self._background(slot, self._launch(slot))
            started.append(slot.replica)
        return started

    async def _halt(self, slot: _Slot) -> None:
        await self._release(slot, graceful=True)

    def pending_reason(self) -> str | None:
        """Replicas whose placement group waits for resources, for how long, and what is short
        (the controller appends it to its decision's reason)."""
        now = self.clock()
        pending = [s for s in self._entries.values() if s.pending_since_s is not None]
        if not pending:
            return None
        waits = ", ".join(
            f"{s.replica.replica_id} for {now - (s.pending_since_s or now):.0f} s" for s in pending
        )
        ray_state = _scheduling_state(pending[0].pg)
        return (
            f"placement pending ({waits}): each needs {self.shape.describe()}; "
            f"{shortage(self.shape, _free_by_node())}"
            + (
                f"; Ray: {ray_state}, shown as demand to the cluster autoscaler"
                if ray_state
                else ""
            )
        )

    def placement(self, replica_id: str) -> dict[str, Any]:
        """Where a replica runs: its host's info and the node of each bundle (stage)."""
        slot = self._entries[replica_id]
        nodes: dict[int, str] = {}
        if slot.pg is not None:
            with contextlib.suppress(Exception):
                nodes = dict(placement_group_table(slot.pg).get("bundles_to_node_id", {}))
        return {**slot.info, "bundle_nodes": [nodes.get(i, "") for i in range(self.shape.pp)]}

    # -- adoption ---------------------------------------------------------------------
    async def adopt(self) -> builtins.list[ManagedReplica]:
        """Take over the replicas a previous controller of this fleet left running, from
        Ray's named actors; remove dead ones and placement groups no live actor uses."""
        found: dict[str, tuple[int, Any, dict[str, Any]]] = {}
        info: dict[str, Any]
        stale: builtins.list[tuple[str, Any]] = []
        for entry in ray.util.list_named_actors(all_namespaces=True):
            parsed = parse_replica_name(self.fleet, entry["name"])
            if entry.get("namespace") != self.namespace or parsed is None:
                continue
            rid, gen = parsed
            try:
                handle = ray.get_actor(entry["name"], namespace=self.namespace)
                info = await asyncio.wait_for(handle.describe.remote(), 10.0)
            except (ValueError, TimeoutError, ray.exceptions.RayError):
                stale.append((entry["name"], None))
                continue
            if not info.get("running") or (rid in found and found[rid][0] > gen):
                stale.append((entry["name"], handle))
                continue
            if rid in found:
                stale.append((replica_name(self.fleet, rid, found[rid][0]), found[rid][1]))
            found[rid] = (gen, handle, info)
        keep = {replica_name(self.fleet, rid, gen) for rid, (gen, _, _) in found.items()}
        for name, handle in stale:
            if handle is not None:
                with contextlib.suppress(Exception):
                    ray.kill(handle, no_restart=True)
            log.warning("removing %s: its replica is no longer running", name)
        for pg_info in placement_group_table().values():
            name = pg_info.get("name") or ""
            if pg_info.get("state") == "REMOVED" or parse_replica_name(self.fleet, name) is None:
                continue
            if name not in keep:
                log.warning("removing placement group %s: no live replica uses it", name)
                with contextlib.suppress(Exception):
                    remove_placement_group(get_placement_group(name))
        adopted: builtins.list[ManagedReplica] = []
        now = self.clock()
        for rid, (gen, handle, info) in sorted(found.items()):
            replica = ManagedReplica(rid, info["url"], ReplicaState.STARTING, now, now)
            replica.pid = info.get("pid")
            pg = get_placement_group(replica_name(self.fleet, rid, gen))
            slot = _Slot(replica, generation=gen, pg=pg, actor=handle, info=info)
            self._entries[rid] = slot
            self._background(slot, self._watch_exit(slot, gen))
            self._background(slot, self._await_ready(slot, gen, adopted=True))
            adopted.append(replica)
            log.info("adopted %s at %s", rid, info["url"])
        top = max((replica_index(r) for r in found), default=0)
        self._ids = (f"{self.id_prefix}-{i}" for i in itertools.count(top + 1))
        return adopted

    # -- internals --------------------------------------------------------------------
    async def _launch(self, slot: _Slot) -> None:
        gen = slot.generation
        replica = slot.replica
        name = replica_name(self.fleet, replica.replica_id, gen)
        shape = self.shape
        slot.pg = placement_group(
            shape.bundles(), strategy=shape.strategy, name=name, lifetime="detached"
        )
        slot.pending_since_s = self.clock()
        await slot.pg.ready()  # waits as long as it must: pending_reason() says why
        slot.pending_since_s = None
        if slot.stopping or gen != slot.generation:
            return
        bundle = shape.bundle()
        slot.actor = _Host.options(
            name=name,
            namespace=self.namespace,
            lifetime="detached",
            max_restarts=0,
            num_gpus=shape.tp,
            num_cpus=bundle.get("CPU", 0.0),
            memory=bundle.get("memory"),
            resources={k: v for k, v in bundle.items() if k not in ("GPU", "CPU", "memory")},
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                slot.pg, placement_group_bundle_index=0, placement_group_capture_child_tasks=True
            ),
        ).remote(replica.replica_id, self.fleet, gen)
        try:
            info = await slot.actor.launch.remote(
                self.command, self.values, str(self.log_dir) if self.log_dir else None
            )
        except ray.exceptions.RayError as e:
            await self._lost(slot, gen, f"could not start: {e}")
            return
        if slot.stopping or gen != slot.generation:
            return
        slot.info = info
        replica.url, replica.pid = info["url"], info["pid"]
        log.info(
            "started %s on %s (CUDA_VISIBLE_DEVICES=%s)",
            replica.replica_id,
            info["url"],
            info["cuda_visible_devices"],
        )
        self._background(slot, self._watch_exit(slot, gen))
        await self._await_ready(slot, gen)

    async def _await_ready(self, slot: _Slot, gen: int, adopted: bool = False) -> None:
        replica = slot.replica
        deadline = self.clock() + self.health_timeout_s
        while not await self._healthy(replica.url):
            if slot.stopping or gen != slot.generation:
                return
            if self.clock() > deadline:
                await self._lost(slot, gen, f"not healthy after {self.health_timeout_s:.0f} s")
                return
            await asyncio.sleep(0.2)
        if slot.stopping or gen != slot.generation:
            return
        took_s = self._mark_ready(replica, cold_start=not adopted)
        try:
            await self.registry.add(replica.replica_id, replica.url)
        except Exception:  # the gateway refused or is unreachable: say so, keep the replica
            log.exception("could not register %s with the gateway", replica.replica_id)
        log.info("%s ready after %.1f s", replica.replica_id, took_s)
        await self._probe(slot, gen)

    async def _healthy(self, url: str) -> bool:
        try:
            async with self._http().get(f"{url}/health") as resp:
                return resp.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False

    async def _probe(self, slot: _Slot, gen: int) -> None:
        """A node that dies takes its replica's port with it: notice in a few seconds, without
        waiting for Ray's own node health checks (tens of seconds by default). A replica
        that is only slow to answer keeps its place if its actor still answers."""
        failures = 0
        while not slot.stopping and gen == slot.generation and not self._closed:
            await asyncio.sleep(self.probe_interval_s)
            failures = 0 if await self._healthy(slot.replica.url) else failures + 1
            if failures >= self.probe_failures:
                if await self._actor_answers(slot):
                    failures = 0
                    continue
                await self._lost(slot, gen, f"/health failed {failures} times in a row")
                return

    async def _actor_answers(self, slot: _Slot, timeout_s: float = 2.0) -> bool:
        """Its host actor replies within `timeout_s` and its command still runs."""
        if slot.actor is None:
            return False
        try:
            info = await asyncio.wait_for(slot.actor.describe.remote(), timeout_s)
        except (TimeoutError, ray.exceptions.RayError):
            return False
        return bool(info.get("running"))

    async def _watch_exit(self, slot: _Slot, gen: int) -> None:
        try:
            code = await slot.actor.wait_exit.remote()
            why = f"exited with status {code}"
            with contextlib.suppress(Exception):
                tail = await asyncio.wait_for(slot.actor.log_tail.remote(), 5.0)
                why += f": …\n  {tail}" if tail else ""
        except ray.exceptions.RayError as e:
            why = f"its actor died ({type(e).__name__}: actor or node lost)"
        await self._lost(slot, gen, why)

    async def _lost(self, slot: _Slot, gen: int, why: str) -> None:
        replica = slot.replica
        if slot.stopping or self._closed or gen != slot.generation or slot.replacing:
            return
        slot.replacing = True
        log.warning("%s %s", replica.replica_id, why)
        with contextlib.suppress(KeyError):
            await self.registry.remove(replica.replica_id)
        await self._release(slot, graceful=False)
        if not self.restart_crashed:
            replica.state = ReplicaState.DEAD
            self._entries.pop(replica.replica_id, None)
            return
        backoff_s = self._restarting(replica)
        slot.generation += 1
        slot.info = {}
        await asyncio.sleep(backoff_s)
        slot.replacing = False
        if slot.stopping or self._closed:
            return
        replica.restarts += 1
        replica.started_at_s = self.clock()
        self._background(slot, self._launch(slot))

    async def _release(self, slot: _Slot, *, graceful: bool) -> None:
        """Stop the command, kill the actor, remove the placement group."""
        actor, pg = slot.actor, slot.pg
        slot.actor = slot.pg = None
        slot.pending_since_s = None
        if actor is not None:
            if graceful:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(
                        actor.shutdown.remote(self.stop_grace_s), self.stop_grace_s + 5.0
                    )
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        if pg is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(pg)


def _free_by_node() -> dict[str, dict[str, float]]:
    """Free resources per live node (Ray's private per-node view; the cluster total else)."""
    try:
        from ray._private.state import available_resources_per_node

        return {k: dict(v) for k, v in available_resources_per_node().items()}
    except Exception:
        return {"cluster": dict(ray.available_resources())}


def _scheduling_state(pg: Any) -> str | None:
    if pg is None:
        return None
    try:
        table = placement_group_table(pg)
    except Exception:
        return None
    stats = table.get("stats") or {}
    state = stats.get("scheduling_state") or table.get("state")
    return str(state) if state else None
