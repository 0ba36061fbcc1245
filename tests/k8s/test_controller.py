"""The in-cluster controller's tick (policy → actuator → cluster) and the Lease keeping
one of two controllers acting, against the fake API and real gateways."""

from __future__ import annotations

import asyncio

import pytest

from gpufleet.k8s.api import KubeApi
from gpufleet.k8s.controller import ClusterController, run_controller
from gpufleet.k8s.settings import LeaseTiming

from .cluster import GROUP, KEY, NS, Cluster, wait_until

pytestmark = pytest.mark.process  # real HTTP on loopback (the fake API server, gateways)


def config(env: Cluster, **autoscale: object):  # type: ignore[no-untyped-def]
    a = {"policy": "default", "min_replicas": 2, "max_replicas": 4, "interval_s": 0.05,
         "params": {"capacity_per_replica": 8}} | autoscale  # fmt: skip
    return env.config.model_copy(update={"autoscale": env.config.autoscale.model_validate(a)})


async def test_a_tick_scales_to_the_policy_minimum_and_registers_ready_pods(env: Cluster) -> None:
    term = ClusterController(config(env), KubeApi.for_host(env.server.url), KEY, clock=env.now)
    try:
        await term.tick()
        assert env.workload.replicas == 2  # the policy's minimum, through the scale subresource
        pods = env.cluster.live_pods(NS, f"gpufleet.io/group={GROUP}")
        for p in pods:
            await env.schedule_and_serve(p)
            env.cluster.set_ready(NS, p, True)
        await term.tick()
        assert env.workload.replicas == 2  # the pending ones became these: nothing doubled
        await wait_until(
            lambda: env.gateway_view(0) == env.gateway_view(1) == dict.fromkeys(pods, "ready")
        )
    finally:
        await term.close()


async def test_under_keda_the_controller_registers_but_does_not_scale(env: Cluster) -> None:
    cfg = config(env).model_copy(update={"scale": False})
    env.workload.replicas = 1
    env.cluster.reconcile(env.workload)
    [pod] = env.cluster.live_pods(NS, f"gpufleet.io/group={GROUP}")
    await env.schedule_and_serve(pod)
    env.cluster.set_ready(NS, pod, True)
    term = ClusterController(cfg, KubeApi.for_host(env.server.url), KEY, clock=env.now)
    try:
        await term.tick()
        await term.tick()
        assert env.workload.replicas == 1  # below min_replicas 2, yet untouched: KEDA owns it
        await wait_until(lambda: env.gateway_view(0) == {pod: "ready"})
    finally:
        await term.close()


async def test_two_controllers_one_leader(env: Cluster) -> None:
    timing = LeaseTiming(lease_duration_s=3, renew_deadline_s=2, retry_period_s=0.05)
    cfg = config(env).model_copy(update={"lease": timing})
    stops = [asyncio.Event(), asyncio.Event()]
    api = KubeApi.for_host(env.server.url)
    runs = [
        asyncio.create_task(run_controller(cfg, api, f"pod-{i}", KEY, stops[i])) for i in (0, 1)
    ]
    try:
        await wait_until(lambda: env.workload.replicas == 2)
        holder = env.cluster.leases[(NS, "gpufleet-controller")]["spec"]["holderIdentity"]
        assert holder in ("pod-0", "pod-1")
        # The leader stops cleanly: it releases, the other takes over without waiting 3 s.
        stops[int(holder[-1])].set()
        await runs[int(holder[-1])]
        other = "pod-1" if holder == "pod-0" else "pod-0"
        await wait_until(
            lambda: (
                env.cluster.leases[(NS, "gpufleet-controller")]["spec"]["holderIdentity"] == other
            )
        )
        spec = env.cluster.leases[(NS, "gpufleet-controller")]["spec"]
        assert spec["leaseTransitions"] == 1
        scale_puts = [c for m, p, c in env.cluster.log if m == "PUT" and p.endswith("/scale")]
        assert scale_puts == [200]  # one scale-out, by one controller
    finally:
        for s in stops:
            s.set()
        await asyncio.gather(*runs)
