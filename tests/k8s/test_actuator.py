"""KubernetesActuator against the fake API (real `kubernetes` client over HTTP) and two real
gateways: scale-out through the scale subresource, drain-then-scale-in that removes the
drained pod, and adoption after a controller restart."""

from __future__ import annotations

import pytest

from gpufleet.k8s.actuator import LOWEST_DELETION_COST, KubernetesActuator
from gpufleet.k8s.objects import DELETION_COST, DRAINING_SINCE, GROUP_LABEL
from gpufleet.routing.types import ReplicaState

from .cluster import GROUP, NS, Cluster, wait_until

pytestmark = pytest.mark.process  # real HTTP on loopback (the fake API server, gateways)

SCALE_PATH = f"/apis/apps/v1/namespaces/{NS}/deployments/{GROUP}/scale"


def states(act: KubernetesActuator) -> dict[str, ReplicaState]:
    return {r.replica_id: r.state for r in act.list()}


async def bring_up(env: Cluster, act: KubernetesActuator, n: int) -> list[str]:
    """Scale to n and let every pod come up and be registered at both gateways."""
    await env.sync(act)
    await act.start(n)
    pods = env.cluster.live_pods(NS, f"{GROUP_LABEL}={GROUP}")
    for pod in pods:
        await env.schedule_and_serve(pod)
        env.cluster.set_ready(NS, pod, True)
    env.clock_s += 90.0
    await env.sync(act)
    await wait_until(lambda: all(
        set(env.gateway_view(i).items()) >= {(p, "ready") for p in pods} for i in (0, 1)))  # fmt: skip
    return pods


def scale_puts(env: Cluster) -> list[int]:
    return [
        code for method, path, code in env.cluster.log if method == "PUT" and path == SCALE_PATH
    ]


async def test_scale_out_through_the_scale_subresource(env: Cluster) -> None:
    act = env.actuator()
    await env.sync(act)
    assert act.list() == []
    started = await act.start(2)
    assert [r.state for r in started] == [ReplicaState.STARTING] * 2
    assert env.workload.replicas == 2 and scale_puts(env) == [200]
    pods = env.cluster.live_pods(NS)
    pods = [p for p in pods if p.startswith(GROUP)]
    assert len(pods) == 2
    # Created but unscheduled: the pods replace the placeholders, nothing is counted twice.
    await env.sync(act)
    assert states(act) == {p: ReplicaState.STARTING for p in pods}
    # Scheduled, engine loading, not ready yet: still starting, not at the gateways.
    for p in pods:
        await env.schedule_and_serve(p)
    await env.sync(act)
    assert set(states(act).values()) == {ReplicaState.STARTING}
    assert env.gateway_view(0) == {}
    # Ready 100 s after creation: ready, registered with BOTH gateways, cold start measured.
    for p in pods:
        env.cluster.set_ready(NS, p, True)
    env.clock_s += 100.0
    await env.sync(act)
    assert states(act) == {p: ReplicaState.READY for p in pods}
    ips = {r.replica_id: r.url for r in act.list()}
    assert all(url.endswith(f":{env.engine_port}") and "127.0.1." in url for url in ips.values())
    await wait_until(
        lambda: env.gateway_view(0) == env.gateway_view(1) == dict.fromkeys(pods, "ready")
    )
    assert act.observed_cold_start_s() == pytest.approx(100.0)

    # Someone else writes the scale in between our read and our write: 409, re-read, retry.
    env.cluster.conflicts_to_inject = 1
    await act.start(1)
    assert env.workload.replicas == 3
    assert scale_puts(env)[-2:] == [409, 200] and act.scale_conflicts == 1


async def test_drain_then_scale_in_removes_the_drained_pod(env: Cluster) -> None:
    act = env.actuator()
    pods = await bring_up(env, act, 3)
    victim = pods[1]  # neither the newest nor the oldest: only the deletion cost picks it
    env.engines[victim].running = 2  # requests still in flight on it
    await act.drain(victim)

    meta = env.cluster.pods[(NS, victim)]["metadata"]
    assert meta["annotations"][DELETION_COST] == LOWEST_DELETION_COST
    assert float(meta["annotations"][DRAINING_SINCE]) == env.clock_s
    await wait_until(
        lambda: env.gateway_view(0)[victim] == env.gateway_view(1)[victim] == "draining"
    )
    assert states(act)[victim] == ReplicaState.DRAINING
    # The pod cannot be taken back (the scale subresource counts it gone): a scale-out
    # starts a new pod, and this one drains on.
    assert await act.undrain(victim) is False
    assert states(act)[victim] == ReplicaState.DRAINING
    # While it serves, the count stays (a few drain polls pass).
    for _ in range(5):
        await env.sync(act)
    assert env.workload.replicas == 3 and env.cluster.terminating() == []

    env.engines[victim].running = 0
    await wait_until(lambda: env.workload.replicas == 2)
    assert env.cluster.terminating() == [victim]  # the ReplicaSet removed the drained pod
    assert scale_puts(env)[-1] == 200
    env.cluster.finish_terminations()
    await env.sync(act)
    rest = [p for p in pods if p != victim]
    assert states(act) == dict.fromkeys(rest, ReplicaState.READY)
    await wait_until(
        lambda: env.gateway_view(0) == env.gateway_view(1) == dict.fromkeys(rest, "ready")
    )


async def test_drain_deadline_cuts_and_scales_in(env: Cluster) -> None:
    act = env.actuator()
    pods = await bring_up(env, act, 2)
    env.engines[pods[0]].running = 1
    await act.drain(pods[0])
    env.clock_s += env.config.drain_deadline_s + 1  # the deadline passes with one in flight
    await wait_until(lambda: env.workload.replicas == 1)
    assert env.cluster.terminating() == [pods[0]]


async def test_a_restarted_controller_adopts_the_pods_it_finds(env: Cluster) -> None:
    first = env.actuator()
    pods = await bring_up(env, first, 3)
    draining = pods[0]
    env.engines[draining].running = 1
    await first.drain(draining)
    await first.close()  # the controller dies mid-drain
    # A gateway restarts meanwhile and forgets every replica.
    for rid in list(env.gateway_view(1)):
        env.gateways[1].remove_replica(rid)
    puts_before = len(scale_puts(env))

    second = env.actuator()
    env.clock_s += 5.0
    await env.sync(second)
    assert states(second) == {draining: ReplicaState.DRAINING} | dict.fromkeys(
        pods[1:], ReplicaState.READY
    )
    assert second.observed_cold_start_s() is None  # adopted ready pods say nothing of it
    assert len(scale_puts(env)) == puts_before  # reading back changes nothing
    await wait_until(lambda: env.gateway_view(1) == dict.fromkeys(pods[1:], "ready"))
    # The adopted drain finishes under the new controller, once: one pod fewer, the right one.
    env.engines[draining].running = 0
    await wait_until(lambda: env.workload.replicas == 2)
    assert env.cluster.terminating() == [draining]
    assert len(scale_puts(env)) == puts_before + 1


async def test_pods_beyond_spec_replicas_are_leaving_not_drained_again(env: Cluster) -> None:
    act = env.actuator()
    pods = await bring_up(env, act, 3)
    # A controller lowered the count after marking pods[2], then died before the
    # ReplicaSet acted: 3 live pods, spec 2. A new controller must not drain again.
    env.cluster.pods[(NS, pods[2])]["metadata"]["annotations"].update(
        {DELETION_COST: LOWEST_DELETION_COST, DRAINING_SINCE: str(env.clock_s)}
    )
    env.workload.replicas = 2
    second = env.actuator()
    await env.sync(second)
    assert states(second) == dict.fromkeys(pods[:2], ReplicaState.READY)
    assert env.workload.replicas == 2 and len(scale_puts(env)) == 1  # only bring_up's


async def test_scale_in_of_a_leader_worker_set_drains_the_highest_ordinal(lws_env: Cluster) -> None:
    env = lws_env
    act = env.actuator()
    pods = await bring_up(env, act, 3)
    assert pods == [f"{GROUP}-0", f"{GROUP}-1", f"{GROUP}-2"]
    await act.drain(f"{GROUP}-0")  # the policy's pick; the StatefulSet would remove -2
    assert states(act)[f"{GROUP}-2"] == ReplicaState.DRAINING
    assert states(act)[f"{GROUP}-0"] == ReplicaState.READY
    await wait_until(lambda: env.workload.replicas == 2)
    assert env.cluster.terminating() == [f"{GROUP}-2"]
