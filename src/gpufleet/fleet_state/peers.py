"""Routing events shared between gateway workers that serve one fleet (`--workers N`).

Each worker routes its own connections; without these events each would see only its
share of the prompts (a prefix index of half the traffic) and of the load (in-flight
counts of half the requests). A worker records what it routed in a `PeerEvents` batch,
its driver ships the batch to the other workers, and they apply it to their fleet core
(`FleetState.apply_peer_events`): the blocks go into their prefix index as if they had
routed the request, the in-flight change into the replica's `peer_in_flight`. Pure data:
the transport (and its batching) is the driver's.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class PeerEvents:
    """Routing decisions (replica id, tenant, prompt block hashes) and net in-flight
    changes per replica id, in the order they happened."""

    routed: list[tuple[str, str | None, tuple[int, ...]]] = field(default_factory=list)
    in_flight: dict[str, int] = field(default_factory=dict)
    # Called when an empty batch gets its first event (the driver schedules a send).
    on_first: Callable[[], None] | None = field(default=None, compare=False, repr=False)
    _armed: bool = field(default=False, compare=False, repr=False)

    def __bool__(self) -> bool:
        return bool(self.routed) or any(self.in_flight.values())

    def started(
        self, replica_id: str, tenant: str | None, hashes: tuple[int, ...], routed: bool = True
    ) -> None:
        """A request went to `replica_id` (`routed`: its policy learns from peers)."""
        if routed:
            self.routed.append((replica_id, tenant, hashes))
        self.in_flight[replica_id] = self.in_flight.get(replica_id, 0) + 1
        self._arm()

    def finished(self, replica_id: str) -> None:
        self.in_flight[replica_id] = self.in_flight.get(replica_id, 0) - 1
        self._arm()

    def _arm(self) -> None:
        if not self._armed:
            self._armed = True
            if self.on_first is not None:
                self.on_first()

    def take(self) -> PeerEvents:
        """This batch, leaving this one empty (to be filled again)."""
        batch = PeerEvents(self.routed, {k: v for k, v in self.in_flight.items() if v})
        self.routed = []
        self.in_flight = {}
        self._armed = False
        return batch

    def to_json(self) -> dict[str, Any]:
        """JSON-ready; the hashes (64-bit) packed as base64, half the size of JSON numbers
        and quicker to read back (a long prompt has hundreds)."""
        return {"routed": [[rid, tenant, _pack(h)] for rid, tenant, h in self.routed],
                "in_flight": self.in_flight}  # fmt: skip

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> PeerEvents:
        routed = [(str(r[0]), r[1], _unpack(r[2])) for r in raw.get("routed", ())]
        in_flight = {str(k): int(v) for k, v in (raw.get("in_flight") or {}).items()}
        return cls(routed, in_flight)


def _pack(hashes: tuple[int, ...]) -> str:
    return base64.b64encode(struct.pack(f">{len(hashes)}Q", *hashes)).decode("ascii")


def _unpack(text: str) -> tuple[int, ...]:
    data = base64.b64decode(text)
    return struct.unpack(f">{len(data) // 8}Q", data)
