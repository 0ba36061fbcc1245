"""The in-cluster controller's tick (policy → actuator → cluster) and the Lease keeping
one of two controllers acting, against the fake API and real gateways."""

from __future__ import annotations

import asyncio

import aiohttp
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


async def test_each_group_scales_on_its_own_models_signals(groups_env: Cluster) -> None:
    """Two model groups behind the same gateways, one controller each (deploy k8s with
    `groups:`): requests waiting for `other` scale `other` from zero and never `tiny`;
    each registers its pods as serving its model and leaves the other group's alone."""
    env = groups_env
    tiny_cfg = config(env, min_replicas=1).model_copy(
        update={"model": "tiny", "lease_name": "gpufleet-controller-tiny"}
    )
    other_cfg = env.add_group("other", "other").model_copy(
        update={"autoscale": config(env, min_replicas=0, max_replicas=2).autoscale}
    )
    other = env.cluster.workloads[("deployments", NS, "other")]
    api = KubeApi.for_host(env.server.url)
    tiny = ClusterController(tiny_cfg, api, KEY, clock=env.now)
    oth = ClusterController(other_cfg, api, KEY, clock=env.now)
    waiting: list[asyncio.Task[object]] = []
    try:
        await tiny.tick()
        await oth.tick()
        assert (env.workload.replicas, other.replicas) == (1, 0)
        [tiny_pod] = env.cluster.live_pods(NS, f"gpufleet.io/group={GROUP}")
        await env.schedule_and_serve(tiny_pod)
        env.cluster.set_ready(NS, tiny_pod, True)
        await tiny.tick()
        await wait_until(lambda: env.gateway_view(0) == {tiny_pod: "ready"})
        # Requests for `other` wait at a gateway: its controller scales it from zero.
        session = aiohttp.ClientSession()
        body = {"model": "other", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(3):
            waiting.append(asyncio.create_task(
                session.post(env.gateways[0].url + "/v1/chat/completions", json=body)))  # fmt: skip
        await wait_until(lambda: env.gateways[0].signals().queue_depth == 3)
        for _ in range(5):
            env.clock_s += 1.0
            await tiny.tick()
            await oth.tick()
        assert other.replicas >= 1  # its model's queue
        assert env.workload.replicas == 1  # not tiny's: another model's queue is not its load
        other_pods = env.cluster.live_pods(NS, "gpufleet.io/group=other")
        for pod in other_pods:
            await env.schedule_and_serve(pod)
            env.cluster.set_ready(NS, pod, True)
        await oth.tick()
        await tiny.tick()  # tiny's controller does not remove other's replicas
        every = {tiny_pod: "ready"} | dict.fromkeys(other_pods, "ready")
        await wait_until(lambda: env.gateway_view(1) == every)
        models = {r["id"]: r["models"] for r in env.gateways[1].list_replicas()}
        assert models == {tiny_pod: ["tiny"]} | {pod: ["other"] for pod in other_pods}
        await tiny.tick()
        assert set(env.gateway_view(1)) == set(every)
    finally:
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        if waiting:
            await session.close()
        await tiny.close()
        await oth.close()
