"""The admission queue: requests that found no ready replica wait here, bounded in size
and in time (scale from zero, a fleet whose replicas are all starting or ejected).

A data structure with deadlines, nothing more: the live gateway waits on an asyncio event
and the simulator on a timeout event, and both ask `FleetState.admit` again when the
table changes or the deadline passes. Tickets leave in the order they came (FIFO).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request the fleet will not serve, with the OpenAI-format error it gets."""

    status: int
    message: str
    reason: str  # a short slug for reports: queue_full, queue_timeout, model_not_found
    param: str | None = None
    code: str | None = None
    retry_after_s: int | None = None

    @property
    def headers(self) -> dict[str, str] | None:
        if self.retry_after_s is None:
            return None
        return {"Retry-After": str(self.retry_after_s)}


@dataclass(slots=True, eq=False)
class QueueTicket:
    """One waiting request: which replicas it waits for, and until when."""

    model: str
    pool: str | None
    deadline_s: float
    adapter: str | None = None  # the LoRA adapter it asks for (of base model `model`)


class AdmissionQueue:
    """Waiting requests in arrival order, with a depth per model for the autoscaler."""

    def __init__(self, max_size: int = 256, timeout_s: float = 60.0, retry_after_s: int = 5):
        self.max_size = max_size
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_s
        self._tickets: dict[QueueTicket, None] = {}  # insertion-ordered: FIFO
        self.depth_by_model: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._tickets)

    def __contains__(self, ticket: QueueTicket) -> bool:
        return ticket in self._tickets

    def __iter__(self) -> Iterator[QueueTicket]:
        """The waiting tickets, oldest first (a snapshot: safe to leave while iterating)."""
        return iter(list(self._tickets))

    @property
    def full(self) -> bool:
        return len(self._tickets) >= self.max_size

    def join(self, ticket: QueueTicket) -> None:
        self._tickets[ticket] = None
        self.depth_by_model[ticket.model] = self.depth_by_model.get(ticket.model, 0) + 1

    def leave(self, ticket: QueueTicket) -> None:
        """Take it out (no-op if it already left)."""
        if self._tickets.pop(ticket, 0) is None:
            left = self.depth_by_model[ticket.model] - 1
            if left:
                self.depth_by_model[ticket.model] = left
            else:
                del self.depth_by_model[ticket.model]
