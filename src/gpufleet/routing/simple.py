"""Load-only baselines: round robin, random, least outstanding, power of two choices."""

from __future__ import annotations

from collections.abc import Sequence

from gpufleet.routing.base import PolicyBase, randbelow, random_min_of, sample_two
from gpufleet.routing.load import awaiting_first_token
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


# A request awaiting its first token counts this many times by default (`_loads`; 1: off):
# what it still owes a replica over what a decoding one owes, by the step-time model, is
# 4.2 on the autoscale study's mix and 4.0 on the ramp's (docs/up.md, Wave 17). On by
# default since wave 17: mean TTFT -12 to -25 % on every replay workload (docs/gateway.md).
DEFAULT_PREFILL_WEIGHT = 4.0


def check_prefill_weight(prefill_weight: float) -> float:
    if not prefill_weight >= 1.0:
        raise ValueError(f"prefill_weight must be >= 1 (1: off), got {prefill_weight}")
    return float(prefill_weight)


def _loads(replicas: Sequence[ReplicaView], prefill_weight: float = 1.0) -> list[float]:
    """Each replica's in-flight count (this gateway's and its peers'), a request still
    awaiting its first token counted `prefill_weight` times, divided by its slow-start
    weight while it ramps up (`routing.slow_start`; the counts exactly, as floats, when
    neither applies, so such a fleet routes exactly as before).

    Why weigh prefill: a replica that just became ready holds nothing, and counted by
    requests alone it wins every arrival until it holds as many as the others (40-110 on
    the autoscale study): that many whole prompts to prefill at once, a TTFT tail of 2-9 s
    (docs/up.md, Wave 16). Counting prompts not yet prefilled more heavily lets it take a
    few, and more as it answers their first tokens: it fills at the rate it prefills.
    Dynamo's KV router likewise adds a worker's active prefill tokens to its decode load.
    """
    extra = prefill_weight - 1.0
    loads: list[float] = []
    for r in replicas:  # one pass: this runs for every request routed
        load = float(r.in_flight + r.peer_in_flight)  # exact: counts are small ints
        if extra:
            load = load + extra * awaiting_first_token(r)
        if r.slow_start_weight != 1.0:
            load = load / r.slow_start_weight
        loads.append(load)
    return loads


class LeastOutstanding(PolicyBase):
    """Fewest requests in flight as counted by this gateway; random among ties. A request
    awaiting its first token counts `prefill_weight` times (4 by default, 1: as any other;
    `_loads`); a replica in slow start counts its requests divided by its weight."""

    name = "least_outstanding"

    def __init__(
        self, *, seed: int | None = None, prefill_weight: float = DEFAULT_PREFILL_WEIGHT
    ) -> None:
        super().__init__(seed=seed)
        self.prefill_weight = check_prefill_weight(prefill_weight)

    def choose(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> ReplicaView | None:
        if not replicas:
            return None
        return random_min_of(self.rng, replicas, _loads(replicas, self.prefill_weight))


class PowerOfTwo(PolicyBase):
    """Two distinct replicas at random; the one with fewer in flight (random on a tie),
    weighed as `LeastOutstanding` weighs them."""

    name = "power_of_two"

    def __init__(
        self, *, seed: int | None = None, prefill_weight: float = DEFAULT_PREFILL_WEIGHT
    ) -> None:
        super().__init__(seed=seed)
        self.prefill_weight = check_prefill_weight(prefill_weight)

    def choose(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> ReplicaView | None:
        if not replicas:
            return None
        if len(replicas) == 1:
            return replicas[0]
        a, b = sample_two(self.rng, len(replicas))  # (`rng.sample(range(n), 2)`)
        pair = (replicas[a], replicas[b])
        return random_min_of(self.rng, pair, _loads(pair, self.prefill_weight))
