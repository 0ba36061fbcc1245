"""The unit of work a load generator or simulator replays."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Turn:
    """One user turn: new text of exactly `input_tokens` words, asking `output_tokens` back."""

    text: str
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class Conversation:
    """One or more turns sent one after another; turn k+1 carries turns 1..k and their answers.

    `arrival_s` is set when the workload carries its own timing (a trace), in seconds from
    the start of the run; otherwise the arrival process chooses when the conversation starts.
    `prefix_group` names the shared-prefix group a prompt belongs to, when there is one;
    `adapter` the LoRA adapter its requests ask for (sent as their `model`), if any.
    """

    id: int
    turns: tuple[Turn, ...]
    arrival_s: float | None = None
    prefix_group: int | None = None
    adapter: str | None = None

    @property
    def num_requests(self) -> int:
        return len(self.turns)
