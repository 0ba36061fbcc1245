"""What a routing policy may also do, beside `RoutingPolicy`'s calls, as runtime-checkable
protocols. Pure.

(Their own module: tools/compile_sim.py compiles `fleet_state.state` with mypyc, which
does not keep a compiled class a `Protocol` that `isinstance` can check.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class SizedByCapacity(Protocol):
    """A policy that sizes per-replica state by the KV capacity replicas report."""

    def set_capacity_tokens(self, replica_id: str, tokens: int) -> None: ...


@runtime_checkable
class LearnsFromPeers(Protocol):
    """A policy that learns from the decisions of the gateway's other workers."""

    def on_peer_routed(self, replica_id: str, hashes: Sequence[int]) -> None: ...
