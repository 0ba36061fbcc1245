"""The admission queue: requests that found no ready replica wait here, bounded in size
and in time (scale from zero, a fleet whose replicas are all starting or ejected).

A model given its own `QueueLimits` (a model group of `gpufleet up`) has a queue of its
own: its size, wait and Retry-After, and no other model's backlog can fill it. Every other
model shares the default queue, bounded in total.

A data structure with deadlines, nothing more: the live gateway waits on an asyncio event
and the simulator on a timeout event, and both ask `FleetState.admit` again when the
table changes or the deadline passes. Tickets leave in the order they came (FIFO).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
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


@dataclass(frozen=True, slots=True)
class QueueLimits:
    max_size: int = 256  # requests waiting at once (beyond: 503 queue_full)
    timeout_s: float = 60.0  # the longest a request waits (then: 503 queue_timeout)
    retry_after_s: int = 5  # the Retry-After of those 503s


@dataclass(slots=True, eq=False)
class QueueTicket:
    """One waiting request: which replicas it waits for, and until when."""

    model: str
    pool: str | None
    deadline_s: float
    adapter: str | None = None  # the LoRA adapter it asks for (of base model `model`)


class AdmissionQueue:
    """Waiting requests in arrival order, with a depth per model for the autoscaler."""

    def __init__(
        self,
        max_size: int = 256,
        timeout_s: float = 60.0,
        retry_after_s: int = 5,
        per_model: Mapping[str, QueueLimits] | None = None,
    ):
        self.default = QueueLimits(max_size, timeout_s, retry_after_s)
        self.per_model: dict[str, QueueLimits] = dict(per_model or {})
        self._tickets: dict[QueueTicket, None] = {}  # insertion-ordered: FIFO
        self.depth_by_model: dict[str, int] = {}
        self._shared_depth = 0  # tickets of models without limits of their own

    @property
    def max_size(self) -> int:
        return self.default.max_size

    @property
    def timeout_s(self) -> float:
        return self.default.timeout_s

    @property
    def retry_after_s(self) -> int:
        return self.default.retry_after_s

    def limits(self, model: str) -> QueueLimits:
        return self.per_model.get(model, self.default)

    def set_limits(self, default: QueueLimits, per_model: Mapping[str, QueueLimits]) -> None:
        """New limits (a reloaded config); requests already waiting keep their deadlines."""
        self.default, self.per_model = default, dict(per_model)
        self._shared_depth = sum(n for m, n in self.depth_by_model.items() if m not in per_model)

    def is_full(self, model: str) -> bool:
        """Whether a new request for `model` finds its queue full."""
        own = self.per_model.get(model)
        if own is not None:
            return self.depth_by_model.get(model, 0) >= own.max_size
        return self._shared_depth >= self.default.max_size

    def __len__(self) -> int:
        return len(self._tickets)

    def __contains__(self, ticket: QueueTicket) -> bool:
        return ticket in self._tickets

    def __iter__(self) -> Iterator[QueueTicket]:
        """The waiting tickets, oldest first (a snapshot: safe to leave while iterating)."""
        return iter(list(self._tickets))

    def join(self, ticket: QueueTicket) -> None:
        self._tickets[ticket] = None
        self.depth_by_model[ticket.model] = self.depth_by_model.get(ticket.model, 0) + 1
        if ticket.model not in self.per_model:
            self._shared_depth += 1

    def leave(self, ticket: QueueTicket) -> None:
        """Take it out (no-op if it already left)."""
        if self._tickets.pop(ticket, 0) is None:
            if ticket.model not in self.per_model:
                self._shared_depth -= 1
            left = self.depth_by_model[ticket.model] - 1
            if left:
                self.depth_by_model[ticket.model] = left
            else:
                del self.depth_by_model[ticket.model]
