"""gpufleet.routing: pure routing policies and the prefix index they share (DESIGN.md).

`make_policy(name, seed=..., **options)` builds one; `POLICY_NAMES` lists the names.
"""

from gpufleet.routing.registry import POLICY_NAMES, make_policy, policy_options
from gpufleet.routing.types import (
    EngineStats,
    ReplicaState,
    ReplicaView,
    RequestInfo,
    RoutingPolicy,
)

__all__ = [
    "POLICY_NAMES",
    "EngineStats",
    "ReplicaState",
    "ReplicaView",
    "RequestInfo",
    "RoutingPolicy",
    "make_policy",
    "policy_options",
]
