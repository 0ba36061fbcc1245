"""Tenants in the simulator: whose each request is, and the limits the gateway applies.

Each request is drawn for a tenant in proportion to the tenants' shares (seeded; a
session's later turns are its first turn's tenant's). A tenant's requests are admitted by
its `TenantLimits` (the fleet core's token bucket and concurrency cap: over them, the
gateway's 429), go only to replicas of its pool, and are routed by its own policy when it
has one — all as the live gateway does with the same objects.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from gpufleet.fleet_state import TenantLimits
from gpufleet.routing.types import RoutingPolicy
from gpufleet.sim.config import TenantSpec
from gpufleet.workload import SimRequest


@dataclass(slots=True, eq=False)
class SimTenant:
    name: str
    pool: str | None
    policy: RoutingPolicy  # its own, or the fleet's
    limits: TenantLimits


class SimTenants:
    def __init__(
        self,
        specs: Sequence[TenantSpec],
        requests: Sequence[SimRequest],
        fleet_policy: RoutingPolicy,
        seed: int,
    ) -> None:
        self.fleet_policy = fleet_policy
        self.tenants = [
            SimTenant(
                s.name,
                s.pool,
                s.routing if s.routing is not None else fleet_policy,
                TenantLimits(s.max_concurrency, TenantLimits.bucket_for(s.requests_per_s, s.burst)),
            )
            for s in specs
        ]
        total = sum(s.share for s in specs)
        cumulative, acc = [], 0.0
        for s in specs:
            acc += s.share / total
            cumulative.append(acc)
        rng = random.Random(f"tenants:{seed}")  # a str seed: the same in every process
        by_index = {r.index: r for r in requests}
        self._of: dict[int, int] = {}
        for r in requests:
            if r.after is None:
                u = rng.random()
                self._of[r.index] = next(
                    (i for i, c in enumerate(cumulative) if u < c), len(specs) - 1
                )
        for r in requests:  # later turns: the tenant of the session's first turn
            first = r
            while first.after is not None:
                first = by_index[first.after]
            self._of[r.index] = self._of[first.index]

    def of(self, index: int) -> SimTenant:
        return self.tenants[self._of[index]]

    def policies(self) -> dict[str, RoutingPolicy]:
        """The tenants' own routing policies, for the fleet core (`tenant_policies`)."""
        return {t.name: t.policy for t in self.tenants if t.policy is not self.fleet_policy}
