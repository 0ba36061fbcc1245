"""The workload model: when requests arrive and what shape they have, before any text.

A workload is a sequence of `ConversationShape`s: an arrival time and one or more turns,
each turn the segments of its new user text (see `segments.py`) and its max_tokens. A
single request is a conversation of one turn; a session's later turns are sent when the
previous one ends and carry every earlier turn and answer. `synthetic_shapes(spec)` builds
them from a `WorkloadSpec` (random lengths, shared-prefix groups, sessions; fixed-rate,
ramped or scheduled arrivals) and `trace_shapes` from a trace; both are deterministic in
their seed. `render.py` turns the same shapes into prompt text for live traffic (`gpufleet
bench`, `gpufleet up --demo`) and into `SimRequest`s for the simulator, so a simulated run
and a live run with the same workload and seed send the same shapes at the same times.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from gpufleet.workload.arrivals import (
    RatePhase,
    arrival_offsets,
    iter_arrival_offsets,
    schedule_offsets,
)
from gpufleet.workload.segments import (
    KIND_PREFIX,
    KIND_TRACE_BLOCK,
    KIND_UNIQUE,
    Segments,
    key_of_name,
    named_key,
    segment_key,
)
from gpufleet.workload.traces import MOONCAKE_BLOCK_TOKENS, TraceRecord


@dataclass(frozen=True, slots=True)
class TurnShape:
    segments: Segments  # the turn's new user text
    output_tokens: int  # max_tokens (EOS ignored, as `bench --ignore-eos`)

    @property
    def input_tokens(self) -> int:
        return sum(n for _, n in self.segments)


@dataclass(frozen=True, slots=True)
class ConversationShape:
    id: int
    arrival_s: float  # seconds from the start of the run (closed loops ignore it)
    turns: tuple[TurnShape, ...]
    prefix_group: int | None = None
    session_key: str | None = None  # set for multi-turn sessions
    adapter: str | None = None  # the LoRA adapter every turn asks for (None: the base model)


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """A synthetic workload, in the terms of `gpufleet bench` / `gpufleet sim` flags.

    Arrivals: `conversations` of them at `rate` (n/rate seconds, vLLM's rescaled gamma
    process), or along `ramp` (start, end rate across the conversations), or along a
    `schedule` of rate phases. With `conversations` None the process is unbounded and
    `duration_s` (or the caller) ends it. A rate of inf (the default) starts all at once.
    Shapes: `input_tokens` / `output_tokens` ± `range_ratio` (vLLM's random dataset);
    `prefix_groups` shared prefixes of `prefix_tokens` (round robin); `sessions` of `turns`.
    """

    conversations: int | None = None
    rate: float = math.inf
    burstiness: float = 1.0
    ramp: tuple[float, float] | None = None
    schedule: tuple[RatePhase, ...] = ()
    duration_s: float | None = None  # no arrival at or after this
    input_tokens: int = 1024
    output_tokens: int = 128
    range_ratio: float = 0.0
    prefix_groups: int | None = None
    prefix_tokens: int = 0
    sessions: bool = False
    turns: int = 1
    seed: int = 0


# The flags `gpufleet bench` and `gpufleet sim` share, spelled alike in both configs.
_COMMON_FLAGS = ("burstiness", "duration_s", "input_tokens", "output_tokens", "range_ratio",
                 "prefix_groups", "prefix_tokens", "turns", "seed")  # fmt: skip


def spec_from_flags(flags: object, **arrivals: Any) -> WorkloadSpec:
    """A `WorkloadSpec` from a CLI's parsed flags (`BenchConfig`, `Scenario`): the common
    flags by name, `sessions` as a count, and the CLI's own arrival fields given here."""
    sessions = getattr(flags, "sessions", None)
    common = {name: getattr(flags, name) for name in _COMMON_FLAGS}
    return WorkloadSpec(sessions=sessions is not None, **common, **arrivals)


class LengthSampler:
    """Lengths uniform over [floor(L·(1−r)), ceil(L·(1+r))], at least 1 (as vLLM's random set).

    `range_ratio` 0 gives exactly `mean_tokens` every time. Draws one at a time, so a
    workload of unknown length (a timed run) costs nothing up front.
    """

    def __init__(self, mean_tokens: int, range_ratio: float, rng: random.Random):
        if not 0.0 <= range_ratio < 1.0:
            raise ValueError("range_ratio must be in [0, 1)")
        self.low = max(1, math.floor(mean_tokens * (1 - range_ratio)))
        self.high = max(self.low, math.ceil(mean_tokens * (1 + range_ratio)))
        self._rng = rng
        # rng.randint(low, high) is low + rng._randbelow(high - low + 1) (CPython's
        # randrange with step 1): called directly, the same draws at a third of the cost
        # (tests/workload check they agree).
        self._below: Callable[[int], int] | None = getattr(rng, "_randbelow", None)
        self._width = self.high - self.low + 1

    def draw(self) -> int:
        if self.low == self.high:
            return self.low
        if self._below is not None:
            return self.low + self._below(self._width)
        return self._rng.randint(self.low, self.high)


def arrivals(spec: WorkloadSpec) -> Iterator[float]:
    """The spec's arrival offsets, from `random.Random(seed)` (as `gpufleet bench` always
    drew them). Rescaled to n/rate when the count is known; unbounded otherwise."""
    rng = random.Random(spec.seed)
    if spec.schedule:
        return iter(schedule_offsets(spec.schedule, spec.burstiness, rng))
    if spec.conversations is not None:
        n = spec.conversations
        return iter(arrival_offsets(n, spec.rate, spec.burstiness, rng, spec.ramp))
    if spec.ramp is not None:
        raise ValueError("a ramp needs a number of conversations")
    return iter_arrival_offsets(spec.rate, spec.burstiness, rng)


def synthetic_shapes(spec: WorkloadSpec) -> Iterator[ConversationShape]:
    """The conversations of `spec`, lazily (a timed run may never reach the end)."""
    if spec.turns < 1 or (spec.prefix_groups is not None and spec.prefix_groups < 1):
        raise ValueError("turns and prefix_groups must be >= 1")
    if spec.input_tokens < 1 and (
        spec.sessions or not spec.prefix_groups or not spec.prefix_tokens
    ):
        raise ValueError("input_tokens must be >= 1 (0 only after a shared prefix)")
    rng = random.Random(spec.seed)  # lengths: their own stream, seeded as bench always was
    ins = LengthSampler(spec.input_tokens, spec.range_ratio, rng) if spec.input_tokens else None
    outs = LengthSampler(spec.output_tokens, spec.range_ratio, rng)
    seed = spec.seed

    def own(*name: int | str) -> tuple[tuple[int, int], ...]:
        n = ins.draw() if ins is not None else 0
        return ((named_key(KIND_UNIQUE, *name), n),) if n else ()

    for i, t in enumerate(arrivals(spec)):
        if spec.conversations is not None and i >= spec.conversations:
            return
        if spec.duration_s is not None and t >= spec.duration_s:
            return
        if spec.sessions:
            turns = []
            for k in range(spec.turns):  # (own("session", seed, i, k), formatted at once)
                n = ins.draw() if ins is not None else 0
                text = ((key_of_name(KIND_UNIQUE, f"session:{seed}:{i}:{k}"), n),) if n else ()
                turns.append(TurnShape(text, outs.draw()))
            yield ConversationShape(i, t, tuple(turns), session_key=f"session-{i}")
            continue
        group = None
        head: Segments = ()
        if spec.prefix_groups:
            group = i % spec.prefix_groups
            if spec.prefix_tokens > 0:
                head = ((named_key(KIND_PREFIX, "prefix", seed, group), spec.prefix_tokens),)
        turn = TurnShape((*head, *own("request", seed, i)), outs.draw())
        yield ConversationShape(i, t, (turn,), prefix_group=group)


def trace_shapes(
    records: Iterable[TraceRecord], *, speedup: float = 1.0, seed: int = 0
) -> Iterator[ConversationShape]:
    """Single-turn requests replaying a trace at `speedup`× its own pace.

    Mooncake `hash_ids` become shared 512-token segments (equal leading ids give equal
    prefixes); the rest of a prompt, and every Azure prompt, is its own. A zero length is
    raised to 1 token, since an empty prompt or max_tokens=0 is not a request.
    """
    if not speedup > 0:
        raise ValueError("speedup must be positive")
    for i, rec in enumerate(records):
        left = max(1, rec.input_tokens)
        segments: list[tuple[int, int]] = []
        for h in rec.hash_ids or ():
            if left <= 0:
                break
            take = min(left, MOONCAKE_BLOCK_TOKENS)
            segments.append((segment_key(KIND_TRACE_BLOCK, h), take))
            left -= take
        if left > 0:
            segments.append((named_key(KIND_UNIQUE, "trace", seed, i), left))
        turn = TurnShape(tuple(segments), max(1, rec.output_tokens))
        yield ConversationShape(i, rec.arrival_s / speedup, (turn,))
