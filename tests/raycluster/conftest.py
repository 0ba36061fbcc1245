"""One real local Ray cluster for the whole session: a head (no GPU) plus two nodes each
declaring 4 GPUs (no real GPU needed: Ray hands out the ids and sets
CUDA_VISIBLE_DEVICES). Every address is loopback; the dashboard is off, object stores
small, Ray's OOM killer off (a shared 2-core machine), node failures detected within ~2 s.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

# Before anything imports Ray: loopback addresses stay loopback; no OOM killer.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")

NAMESPACE = "gpufleet-test"
OBJECT_STORE_BYTES = 80 * 1024 * 1024
NODE = {
    "num_cpus": 4,
    "num_gpus": 4,
    "node_ip_address": "127.0.0.1",
    "object_store_memory": OBJECT_STORE_BYTES,
}


@dataclass
class RayCluster:
    cluster: Any
    nodes: list[Any]  # the two GPU nodes (ray._private.node.Node)

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def add_gpu_node(self) -> Any:
        node = self.cluster.add_node(**NODE)
        self.nodes.append(node)
        return node


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    from gpufleet.autoscale.raycluster import require_ray

    ray = require_ray()  # sets the loopback switch before Ray is imported
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "num_gpus": 0,
            "node_ip_address": "127.0.0.1",
            "include_dashboard": False,
            "object_store_memory": OBJECT_STORE_BYTES,
            "_system_config": {
                "health_check_initial_delay_ms": 500,
                "health_check_period_ms": 500,
                "health_check_failure_threshold": 3,
            },
        },
    )
    handle = RayCluster(cluster, [cluster.add_node(**NODE) for _ in range(2)])
    ray.init(
        address=cluster.address,
        namespace=NAMESPACE,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
    )
    try:
        yield handle
    finally:
        ray.shutdown()
        cluster.shutdown()


async def wait_for(
    cond: Callable[[], bool], timeout_s: float = 90.0, why: Callable[[], object] | None = None
) -> None:
    """Hang guard only: polls a condition, fails after a generous timeout, saying what `why`
    reads then (a fleet's replicas and what they wait for: a rare timeout says its cause)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not cond():
        if loop.time() > end:
            state = f": {why()}" if why is not None else ""
            raise AssertionError(
                f"condition not met before the hang guard ({timeout_s:g} s){state}"
            )
        await asyncio.sleep(0.1)
