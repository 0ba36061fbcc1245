"""Lease-based leader election against the fake API (real client, real HTTP): client-go's
rules for acquiring, renewing, expiring on the candidate's own clock, and releasing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpufleet.k8s.api import KubeApi
from gpufleet.k8s.lease import LeaderElector
from gpufleet.k8s.settings import LeaseTiming

from .fake_api import FakeApiServer

pytestmark = pytest.mark.process  # real HTTP on loopback (the fake API server, gateways)

NS, LEASE = "llm", "gpufleet-controller"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as s:
        yield s


def elector(server: FakeApiServer, who: str, clock: Clock) -> LeaderElector:
    timing = LeaseTiming(lease_duration_s=15, renew_deadline_s=10, retry_period_s=2)
    return LeaderElector(KubeApi.for_host(server.url), NS, LEASE, who, timing,
                         clock=clock, wall=lambda: 1_700_000_000.0 + clock.t)  # fmt: skip


async def test_one_leader_takeover_after_expiry_and_release(server: FakeApiServer) -> None:
    ca, cb = Clock(), Clock()
    a, b = elector(server, "pod-a", ca), elector(server, "pod-b", cb)
    assert await a.step() is True  # creates the lease
    assert await b.step() is False  # held, and fresh as far as b has seen
    spec = server.cluster.leases[(NS, LEASE)]["spec"]
    assert spec["holderIdentity"] == "pod-a" and spec["leaseTransitions"] == 0
    assert spec["leaseDurationSeconds"] == 15

    # a renews: renewTime moves, acquireTime and transitions stay.
    ca.t += 2
    assert await a.step() is True
    renewed = server.cluster.leases[(NS, LEASE)]["spec"]
    assert (
        renewed["acquireTime"] == spec["acquireTime"] and renewed["renewTime"] != spec["renewTime"]
    )
    # b saw the record change just now: 14 s later it must still wait (15 s from *its* view).
    cb.t += 1
    assert await b.step() is False
    cb.t += 14
    assert await b.step() is False
    # a goes silent; b's own clock passes 15 s since the record last changed: b takes it.
    cb.t += 1.01
    assert await b.step() is True
    taken = server.cluster.leases[(NS, LEASE)]["spec"]
    assert taken["holderIdentity"] == "pod-b" and taken["leaseTransitions"] == 1

    # a wakes up: the record names b, so a stops leading at once (client-go's IsLeader),
    # and its own lease duration does not matter: it observed b's record just now.
    ca.t += 3
    assert await a.step() is False and not a.leading

    # b releases: the holder empties and a standby takes over at once, no wait.
    await b.release()
    released = server.cluster.leases[(NS, LEASE)]["spec"]
    assert released["holderIdentity"] == "" and released["leaseDurationSeconds"] == 1
    assert await a.step() is True
    assert server.cluster.leases[(NS, LEASE)]["spec"]["leaseTransitions"] == 2


async def test_racing_candidates_one_wins_by_resource_version(server: FakeApiServer) -> None:
    ca, cb = Clock(), Clock()
    a, b = elector(server, "pod-a", ca), elector(server, "pod-b", cb)
    await a.step()
    # Both see the lease expired (a crashed) and both try to take it with the same read:
    # the second write carries a stale resourceVersion and gets 409.
    stale = await b.api.read_lease(NS, LEASE)
    cb.t += 100
    c = elector(server, "pod-c", Clock())
    c.clock.t = cb.t  # type: ignore[attr-defined]
    b.observed, b.observed_at = stale["spec"], 0.0
    c.observed, c.observed_at = stale["spec"], 0.0
    assert await b.step() is True
    assert await c.step() is False
    assert (
        "PUT",
        f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{LEASE}",
        200,
    ) in server.cluster.log
    assert server.cluster.leases[(NS, LEASE)]["spec"]["holderIdentity"] == "pod-b"
