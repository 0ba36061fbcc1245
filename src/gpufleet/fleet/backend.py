"""Where one group's replicas run: `gpufleet replica` (or any command) as local child
processes, or placement groups and actors on a Ray cluster (docs/ray.md)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from gpufleet.autoscale.actuator import FleetActuator
from gpufleet.autoscale.gateway_link import InProcessGateway
from gpufleet.autoscale.local import LocalProcessActuator
from gpufleet.fleet.config import FleetConfig, GroupSpec


@contextlib.asynccontextmanager
async def group_actuator(
    cfg: FleetConfig,
    group: GroupSpec,
    link: InProcessGateway,
    log_dir: Path,
    clock: Callable[[], float],
) -> AsyncIterator[FleetActuator]:
    """The backend's actuator (local processes or Ray) of one group, closed (all its
    replicas stopped) on exit. With `groups:`, replica ids (and Ray fleet names) carry
    the group's name."""
    rs, be = group.replicas, cfg.backend
    several, groups = bool(cfg.groups), cfg.fleet_groups()
    common: dict[str, Any] = {
        "values": rs.values(),
        "registry": link,
        "expected_startup_s": rs.expected_startup_s or rs.startup_s + 2.0,
        "health_timeout_s": rs.health_timeout_s,
        "drain_deadline_s": rs.drain_deadline_s,
        "restart_crashed": rs.restart_crashed,
        "log_dir": log_dir,
        "clock": clock,
        "id_prefix": group.label if several else "replica",
    }
    if be.kind == "ray":
        from gpufleet.autoscale.raycluster import ReplicaShape, ray_actuator

        shape = ReplicaShape(
            tp=rs.tp,
            pp=rs.pp,
            cpus_per_bundle=be.cpus_per_bundle,
            memory_bytes_per_bundle=(
                int(be.memory_gb_per_bundle * (1 << 30)) if be.memory_gb_per_bundle else None
            ),
            resources_per_bundle=be.resources_per_bundle,
        )
        async with ray_actuator(
            rs.full_command(),
            address=be.address,
            namespace=be.namespace,
            fleet=f"{be.fleet_name}-{group.label}" if several else be.fleet_name,
            shape=shape,
            # A local cluster of its own is started once, for every group's most replicas.
            local_gpus=be.local_gpus
            if be.local_gpus is not None
            else sum(g.autoscale.max_replicas * g.replicas.tp * g.replicas.pp for g in groups),
            local_cpus=sum(
                math.ceil(g.autoscale.max_replicas * g.replicas.pp * be.cpus_per_bundle)
                for g in groups
            )
            + 1,
            probe_interval_s=be.probe_interval_s,
            probe_failures=be.probe_failures,
            **common,
        ) as ray_act:
            yield ray_act
        return
    local = LocalProcessActuator(rs.full_command(), host="127.0.0.1", **common)
    try:
        yield local
    finally:
        await local.close()
