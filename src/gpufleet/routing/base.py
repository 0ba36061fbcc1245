"""What every policy shares: no-op notifications and random tie-breaking."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

from gpufleet.native import mypyc_attr
from gpufleet.routing.types import ReplicaView, RequestInfo

T = TypeVar("T")


def random_min(rng: random.Random, items: Sequence[T], key: Callable[[T], Any]) -> T:
    """The item with the smallest key (numbers or tuples); ties broken uniformly at
    random, never by position."""
    return random_min_of(rng, items, list(map(key, items)))


def random_min_of(rng: random.Random, items: Sequence[T], keys: list[Any]) -> T:
    """`random_min` with the keys given (keys[i] is items[i]'s): the same choice and the
    same random draws."""
    best_key = min(keys)  # (the first of the smallest, as a loop keeping `<` finds it)
    if keys.count(best_key) == 1:
        return items[keys.index(best_key)]
    tied = [item for item, k in zip(items, keys, strict=True) if k == best_key]
    return tied[randbelow(rng, len(tied))]  # (`rng.choice(tied)`)


# `random.Random`'s choice and sample of two written out, drawing exactly what they draw
# (CPython 3.11's `_randbelow_with_getrandbits`, `sample`'s set branch for n > 21 and its
# pool branch below): compiled, a routed request's draws cost ~1/10 of the interpreted
# library's (tests/routing/test_random_draws.py checks the draws are the same).
def randbelow(rng: random.Random, n: int) -> int:
    """`rng._randbelow(n)`: a random int in [0, n), n > 0."""
    k = n.bit_length()
    r = rng.getrandbits(k)
    while r >= n:
        r = rng.getrandbits(k)
    return r


def sample_two(rng: random.Random, n: int) -> tuple[int, int]:
    """`rng.sample(range(n), 2)`: two distinct indices in [0, n), n >= 2."""
    if n <= 21:  # (`sample`'s pool branch: an n-list is smaller than a 2-set)
        a = randbelow(rng, n)
        b = randbelow(rng, n - 1)
        return a, (n - 1 if b == a else b)
    a = randbelow(rng, n)
    b = randbelow(rng, n)
    while b == a:
        b = randbelow(rng, n)
    return a, b


@mypyc_attr(allow_interpreted_subclasses=True)  # (compiled: policies elsewhere are not)
class PolicyBase:
    """A policy without soft state: notifications do nothing.

    Subclasses set `name` and implement `choose`. Randomness comes only from `self.rng`,
    seeded by the caller, so a run is reproducible.
    """

    name: ClassVar[str] = "base"  # (read from the class: the policy registry)
    # Whether `choose` reads `RequestInfo.prefix_hashes`: the gateway skips hashing the
    # prompt on the hot path when no policy needs it.
    uses_prefix_hashes = False

    def __init__(self, *, seed: int | None = None) -> None:
        self.rng = random.Random(seed)

    def choose(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> ReplicaView | None:
        raise NotImplementedError

    def on_started(self, request: RequestInfo, replica: ReplicaView) -> None:
        return None

    def on_first_token(self, request: RequestInfo, replica: ReplicaView) -> None:
        return None

    def on_finished(self, request: RequestInfo, replica: ReplicaView, ok: bool) -> None:
        return None

    def on_replica_removed(self, replica_id: str) -> None:
        return None
