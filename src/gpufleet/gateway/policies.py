"""The one place the gateway builds routing policies and computes prefix hashes.

Uses `gpufleet.routing.make_policy` (pure policies, DESIGN.md); falls back to a local
round robin only when that registry is not importable (keeps the gateway usable alone).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from gpufleet.routing.types import ReplicaView, RequestInfo, RoutingPolicy


class _LocalRoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._next = itertools.count()

    def choose(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> ReplicaView | None:
        if not replicas:
            return None
        return replicas[next(self._next) % len(replicas)]

    def on_started(self, request: RequestInfo, replica: ReplicaView) -> None:
        return None

    def on_first_token(self, request: RequestInfo, replica: ReplicaView) -> None:
        return None

    def on_finished(self, request: RequestInfo, replica: ReplicaView, ok: bool) -> None:
        return None

    def on_replica_removed(self, replica_id: str) -> None:
        return None


def build_policy(name: str, seed: int | None = None, **options: Any) -> RoutingPolicy:
    try:
        from gpufleet.routing import make_policy  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        if name != "round_robin":
            from gpufleet.errors import UserError

            raise UserError(
                f"routing policy {name!r} is not available", field="policy", fix="round_robin"
            ) from None
        return _LocalRoundRobin()
    policy: RoutingPolicy = make_policy(name, seed=seed, **options)
    return policy


def policy_needs_prefix(policy: RoutingPolicy) -> bool:
    """Whether choose() reads prefix hashes (hashing the prompt costs time on the hot path)."""
    return bool(getattr(policy, "uses_prefix_hashes", policy.name == "prefix_aware"))


def prefix_hashes(body: dict[str, Any], endpoint: str) -> tuple[tuple[int, ...], int]:
    """(block hashes, prompt tokens if known) of a request, as the prefix policy indexes it."""
    try:
        from gpufleet.routing.prefix import (  # type: ignore[import-not-found,unused-ignore]
            request_prefix_hashes,
        )
    except ImportError:
        return (), 0
    return tuple(request_prefix_hashes(body, endpoint)), 0
