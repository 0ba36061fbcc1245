"""A tenant's admission limits: a requests/s token bucket and a cap on requests in flight.

The gateway answers 429 + Retry-After when either is reached; the simulator does the same
with the same objects on its virtual clock. Pure: times come in as arguments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class TokenBucket:
    """`rate_per_s` tokens a second, at most `burst` saved up; full at the first take."""

    __slots__ = ("burst", "rate_per_s", "tokens", "updated_s")

    def __init__(self, rate_per_s: float, burst: int) -> None:
        self.rate_per_s = rate_per_s
        self.burst = float(burst)
        self.tokens = float(burst)
        self.updated_s: float | None = None

    def take(self, now_s: float) -> float:
        """0.0 when a token was taken, else the seconds until one is available."""
        if self.updated_s is not None:
            refill = (now_s - self.updated_s) * self.rate_per_s
            self.tokens = min(self.burst, self.tokens + refill)
        self.updated_s = now_s
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate_per_s


@dataclass(slots=True, eq=False)
class TenantLimits:
    max_concurrency: int | None = None
    bucket: TokenBucket | None = None
    in_flight: int = 0

    @staticmethod
    def bucket_for(requests_per_s: float | None, burst: int | None) -> TokenBucket | None:
        """The bucket of a tenant config (burst defaults to max(1, rate)); None: no rate limit."""
        if requests_per_s is None:
            return None
        return TokenBucket(requests_per_s, burst or max(1, int(requests_per_s)))

    def admit(self, now_s: float) -> int:
        """0 when admitted (the caller must call `release`), else Retry-After in seconds."""
        if self.max_concurrency is not None and self.in_flight >= self.max_concurrency:
            return 1
        if self.bucket is not None:
            wait_s = self.bucket.take(now_s)
            if wait_s > 0:
                return max(1, math.ceil(wait_s))
        self.in_flight += 1
        return 0

    def release(self) -> None:
        self.in_flight -= 1
