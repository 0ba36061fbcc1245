"""The interface every step-time model implements (DESIGN.md: `StepTimeModel`).

One engine iteration processes a batch made of prefill chunks (new prompt tokens, each
with the number of tokens already in the KV cache before it) and decode sequences (one
new token each, attending over their KV length). A step-time model answers how long that
iteration takes on one layout. It is pure: same batch in, same seconds out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Protocol, cast, runtime_checkable

from gpufleet.perf.step_batch import StepBatch as StepBatch  # (its home before)


@runtime_checkable
class StepTimeModel(Protocol):
    def step_time_s(self, batch: StepBatch) -> float:
        """Seconds one iteration of `batch` takes, end to end (all pipeline stages)."""
        ...


@runtime_checkable
class DecodeStepTimes(Protocol):
    """An optional fast path of a step-time model, for the engine's jumps over decode runs."""

    def decode_step_times_s(
        self, num_decode: int, context_tokens: int, num_steps: int
    ) -> list[float]:
        """The times of `num_steps` decode-only iterations of `num_decode` (>= 1) sequences
        whose summed KV length is `context_tokens` at the first and grows by `num_decode` a
        step: bit for bit what `step_time_s(StepBatch(num_decode=num_decode,
        decode_context_tokens=c))` gives for each, so stepped and jumped runs agree exactly."""
        ...


StepTimeFn = Callable[[StepBatch], float]


def memoised_step_time_fn(model: StepTimeModel) -> StepTimeFn:
    """`model.step_time_s` evaluating each distinct batch once: fixed points and played-out
    loops revisit the same few batches (the model is pure, so a cached answer is exact)."""
    memo: dict[StepBatch, float] = {}
    step_time_s = model.step_time_s

    def memoised(batch: StepBatch) -> float:
        t = memo.get(batch)
        if t is None:
            t = memo[batch] = step_time_s(batch)
        return t

    return memoised


DecodeStepTimesFn = Callable[[int, int, int], list[float]]


def decode_step_times_fn(model: StepTimeModel) -> DecodeStepTimesFn:
    """`decode_step_times_s` of `model` (see `DecodeStepTimes`): its own fast path when it
    has one, else one `step_time_s` call per iteration (exact either way)."""
    fast = getattr(model, "decode_step_times_s", None)
    if fast is not None:
        return cast(DecodeStepTimesFn, fast)
    step_time_s = model.step_time_s

    def one_by_one(num_decode: int, context_tokens: int, num_steps: int) -> list[float]:
        stop = context_tokens + num_decode * num_steps
        return [
            step_time_s(StepBatch(num_decode=num_decode, decode_context_tokens=c))
            for c in range(context_tokens, stop, num_decode)
        ]

    return one_by_one


DecodeStepEndsFn = Callable[[int, int, int, float, float | None], Sequence[float]]


def decode_step_ends_fn(model: StepTimeModel) -> DecodeStepEndsFn:
    """(num_decode, context_tokens, num_steps, start_s, extra_s) -> when each step of a
    decode run ends: start_s plus the running sum of the steps' times (each plus extra_s
    when it is given), summed in step order. The model's own fast path when it has one
    (`decode_step_ends_s`), else the sum of `decode_step_times_fn`'s times."""
    fast = getattr(model, "decode_step_ends_s", None)
    if fast is not None:
        return cast(DecodeStepEndsFn, fast)
    times_fn = decode_step_times_fn(model)

    def summed(
        num_decode: int, context_tokens: int, num_steps: int, start_s: float, extra_s: float | None
    ) -> list[float]:
        times = times_fn(num_decode, context_tokens, num_steps)
        if extra_s is not None:
            times = [t + extra_s for t in times]
        ends = accumulate(times, initial=start_s)
        next(ends)
        return list(ends)

    return summed


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

    def decode_step_times_s(
        self, num_decode: int, context_tokens: int, num_steps: int
    ) -> list[float]:
        # The same operations in the same order as step_time_s, so every float is identical.
        head = self.base_s + self.per_token_s * num_decode + self.per_seq_s * num_decode
        per_ctx = self.per_context_token_s
        stop = context_tokens + num_decode * num_steps
        return [head + per_ctx * c for c in range(context_tokens, stop, num_decode)]
