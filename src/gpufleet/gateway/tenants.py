"""Tenants: API key -> tenant, with a requests/s token bucket and a concurrency cap (the
limits are the fleet core's `TenantLimits`, which the simulator drives too)."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.fleet_state import TenantLimits
from gpufleet.gateway.config import TenantConfig


@dataclass(slots=True, eq=False)
class Tenant(TenantLimits):
    name: str = "default"
    pool: str | None = None
    policy_name: str | None = None
    failover: bool | None = None  # mid-stream failover on/off for this tenant (None: default)


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
            tenant = Tenant(
                name=c.name,
                pool=c.pool,
                policy_name=c.policy,
                max_concurrency=c.max_concurrency,
                bucket=TenantLimits.bucket_for(c.requests_per_s, c.burst),
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
