"""The one place the gateway builds routing policies and asks whether they read prefixes.

Policies are the pure ones of `gpufleet.routing` (DESIGN.md); the simulator asks the same
questions through these functions, so live and simulated routing cannot drift apart.
"""

from __future__ import annotations

from typing import Any

from gpufleet.routing import make_policy
from gpufleet.routing.types import RoutingPolicy


def build_policy(name: str, seed: int | None = None, **options: Any) -> RoutingPolicy:
    policy: RoutingPolicy = make_policy(name, seed=seed, **options)
    return policy


def policy_needs_prefix(policy: RoutingPolicy) -> bool:
    """Whether choose() reads prefix hashes (hashing the prompt costs time on the hot path)."""
    return bool(getattr(policy, "uses_prefix_hashes", False))
