"""Tenants: API key -> tenant, with a requests/s token bucket and a concurrency cap."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from gpufleet.gateway.config import TenantConfig


class TokenBucket:
    """`rate_per_s` tokens a second, at most `burst` saved up."""

    __slots__ = ("burst", "rate_per_s", "tokens", "updated_s")

    def __init__(self, rate_per_s: float, burst: int) -> None:
        self.rate_per_s = rate_per_s
        self.burst = float(burst)
        self.tokens = float(burst)
        self.updated_s = time.monotonic()

    def take(self, now_s: float) -> float:
        """0.0 when a token was taken, else the seconds until one is available."""
        self.tokens = min(self.burst, self.tokens + (now_s - self.updated_s) * self.rate_per_s)
        self.updated_s = now_s
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate_per_s


@dataclass(slots=True, eq=False)
class Tenant:
    name: str
    pool: str | None = None
    policy_name: str | None = None
    max_concurrency: int | None = None
    bucket: TokenBucket | None = None
    failover: bool | None = None  # mid-stream failover on/off for this tenant (None: default)
    in_flight: int = 0

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


ANONYMOUS = Tenant(name="default")


def bearer_token(authorization: str | None) -> str | None:
    """The credentials of an `Authorization: Bearer <token>` header; the scheme name is
    case-insensitive (RFC 7235). None when absent or another scheme."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


class TenantTable:
    """Resolves `Authorization: Bearer <key>`; without configured tenants, all is anonymous."""

    def __init__(self, configs: list[TenantConfig]) -> None:
        self.tenants: dict[str, Tenant] = {}
        self._by_key: dict[str, Tenant] = {}
        for c in configs:
            bucket = None
            if c.requests_per_s is not None:
                bucket = TokenBucket(c.requests_per_s, c.burst or max(1, int(c.requests_per_s)))
            tenant = Tenant(
                name=c.name,
                pool=c.pool,
                policy_name=c.policy,
                max_concurrency=c.max_concurrency,
                bucket=bucket,
                failover=c.failover,
            )
            self.tenants[c.name] = tenant
            for key in c.api_keys:
                self._by_key[key] = tenant

    @property
    def enabled(self) -> bool:
        return bool(self._by_key)

    def resolve(self, authorization: str | None) -> Tenant | None:
        """The tenant for this header; None means 401 (only when keys are configured)."""
        if not self._by_key:
            return ANONYMOUS
        token = bearer_token(authorization)
        return None if token is None else self._by_key.get(token)
