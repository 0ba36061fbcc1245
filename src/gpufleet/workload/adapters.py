"""Which LoRA adapter each request asks for: a Zipf popularity over N adapters. Pure.

Multi-LoRA traffic is skewed: a few adapters take most requests and a long tail is asked
for now and then (S-LoRA and Punica evaluate with power-law popularity for this reason).
`AdapterPopularity(n, zipf_s)` gives adapter k (1-based rank) the probability

    P(k) = k^-s / sum_{j=1..n} j^-s

(s = 0 is uniform; s = 1 is classic Zipf; larger s is more skewed). Draws come from their
own seeded stream, so adding adapters to a workload never changes its arrivals or lengths,
and the same seed gives the same adapter for every request, live or simulated. Every turn
of a session asks for the session's adapter.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from gpufleet.workload.shapes import ConversationShape

ADAPTER_NAME_FORMAT = "lora-{:03d}"  # lora-001 is the most popular adapter


def adapter_name(rank: int) -> str:
    """The name of the adapter of popularity rank `rank` (1 = the most asked for)."""
    return ADAPTER_NAME_FORMAT.format(rank)


@dataclass(frozen=True, slots=True)
class AdapterPopularity:
    """N adapters with Zipf(s) popularity; `base_fraction` of requests use no adapter."""

    adapters: int
    zipf_s: float = 1.0
    base_fraction: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.adapters < 1:
            raise ValueError(f"adapters must be >= 1, got {self.adapters}")
        if self.zipf_s < 0:
            raise ValueError(f"zipf_s must be >= 0, got {self.zipf_s}")
        if not 0.0 <= self.base_fraction < 1.0:
            raise ValueError(f"base_fraction must be in [0, 1), got {self.base_fraction}")

    def probabilities(self) -> list[float]:
        """P(rank) for ranks 1..N, summing to 1."""
        weights = [k**-self.zipf_s for k in range(1, self.adapters + 1)]
        total = sum(weights)
        return [w / total for w in weights]

    def names(self) -> list[str]:
        return [adapter_name(k) for k in range(1, self.adapters + 1)]

    def draws(self) -> Iterator[str | None]:
        """An endless stream of adapter names (None: the base model)."""
        rng = random.Random(f"lora-adapters:{self.seed}")
        cumulative = list(itertools.accumulate(self.probabilities()))
        cumulative[-1] = 1.0  # no rounding gap at the top
        names = self.names()
        while True:
            if self.base_fraction and rng.random() < self.base_fraction:
                yield None
                continue
            yield names[bisect.bisect_left(cumulative, rng.random())]


def with_adapters(
    shapes: Iterable[ConversationShape], popularity: AdapterPopularity
) -> Iterator[ConversationShape]:
    """The same conversations, each asking for an adapter drawn from `popularity`."""
    for shape, adapter in zip(shapes, popularity.draws(), strict=False):
        yield dataclasses.replace(shape, adapter=adapter)
