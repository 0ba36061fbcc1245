"""The interface every step-time model implements (DESIGN.md: `StepTimeModel`).

One engine iteration processes a batch made of prefill chunks (new prompt tokens, each
with the number of tokens already in the KV cache before it) and decode sequences (one
new token each, attending over their KV length). A step-time model answers how long that
iteration takes on one layout. It is pure: same batch in, same seconds out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class StepBatch:
    """The shape of one engine iteration, in aggregates cheap to build every step.

    prefill_tokens[i] new tokens of prefill chunk i, which attend over
    prefill_context_tokens[i] tokens already cached plus themselves.
    num_decode sequences decode one token each; decode_context_tokens is the sum of their
    KV lengths (attention reads that many tokens' K and V).
    """

    prefill_tokens: tuple[int, ...] = ()
    prefill_context_tokens: tuple[int, ...] = ()
    num_decode: int = 0
    decode_context_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(self.prefill_tokens) + self.num_decode

    @property
    def num_seqs(self) -> int:
        return len(self.prefill_tokens) + self.num_decode


@runtime_checkable
class StepTimeModel(Protocol):
    def step_time_s(self, batch: StepBatch) -> float:
        """Seconds one iteration of `batch` takes, end to end (all pipeline stages)."""
        ...


@dataclass(frozen=True, slots=True)
class LinearStepTimeModel:
    """Explicit constants, for tests and for engines calibrated by hand.

    time = base_s + per_token_s * new tokens + per_seq_s * sequences
           + per_context_token_s * tokens attended over
    """

    base_s: float = 0.005
    per_token_s: float = 0.0
    per_seq_s: float = 0.0
    per_context_token_s: float = 0.0

    def step_time_s(self, batch: StepBatch) -> float:
        if batch.num_seqs == 0:
            return 0.0
        context = batch.decode_context_tokens + sum(
            c + n for c, n in zip(batch.prefill_context_tokens, batch.prefill_tokens, strict=True)
        )
        return (
            self.base_s
            + self.per_token_s * batch.num_tokens
            + self.per_seq_s * batch.num_seqs
            + self.per_context_token_s * context
        )
