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


class LeastOutstanding(PolicyBase):
    """Fewest requests in flight as counted by this gateway; random among ties."""

    name = "least_outstanding"

    def choose(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> ReplicaView | None:
        if not replicas:
            return None
        # `in_flight` of each, in one comprehension (a call per replica costs more than it)
        return random_min_of(self.rng, replicas, [r.in_flight + r.peer_in_flight for r in replicas])


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
        keys = [r.in_flight + r.peer_in_flight for r in pair]  # (`in_flight` of each)
        return random_min_of(self.rng, pair, keys)
