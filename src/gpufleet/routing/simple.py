"""Load-only baselines: round robin, random, least outstanding, power of two choices."""

from __future__ import annotations

from collections.abc import Sequence

from gpufleet.routing.base import PolicyBase, randbelow, random_min_of, sample_two
from gpufleet.routing.types import ReplicaView, RequestInfo


class RoundRobin(PolicyBase):
    """Each replica in turn. The eligible set may differ per request (model, pool), so
    the counter indexes whatever list it is given."""

    name = "round_robin"

    def __init__(self, *, seed: int | None = None) -> None:
        super().__init__(seed=seed)
        self._next = 0

    def choose(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> ReplicaView | None:
        if not replicas:
            return None
        replica = replicas[self._next % len(replicas)]
        self._next += 1
        return replica


class RandomChoice(PolicyBase):
    name = "random"

    def choose(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> ReplicaView | None:
        if not replicas:
            return None
        return replicas[randbelow(self.rng, len(replicas))]  # (`rng.choice`)


def _loads(replicas: Sequence[ReplicaView]) -> list[float]:
    """Each replica's in-flight count (this gateway's and its peers'), divided by its
    slow-start weight while it ramps up (`routing.slow_start`; ints when none does, so a
    fleet without slow start routes exactly as before)."""
    loads: list[float] = [r.in_flight + r.peer_in_flight for r in replicas]
    for i, r in enumerate(replicas):
        if r.slow_start_weight != 1.0:
            loads[i] = loads[i] / r.slow_start_weight
    return loads


class LeastOutstanding(PolicyBase):
    """Fewest requests in flight as counted by this gateway; random among ties. A replica
    in slow start counts its requests divided by its weight."""

    name = "least_outstanding"

    def choose(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> ReplicaView | None:
        if not replicas:
            return None
        return random_min_of(self.rng, replicas, _loads(replicas))


class PowerOfTwo(PolicyBase):
    """Two distinct replicas at random; the one with fewer in flight (random on a tie)."""

    name = "power_of_two"

    def choose(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> ReplicaView | None:
        if not replicas:
            return None
        if len(replicas) == 1:
            return replicas[0]
        a, b = sample_two(self.rng, len(replicas))  # (`rng.sample(range(n), 2)`)
        pair = (replicas[a], replicas[b])
        return random_min_of(self.rng, pair, _loads(pair))
