"""Workload builders: random lengths, shared-prefix groups, multi-turn sessions, traces.

Each returns an iterator of `Conversation`s and builds prompt text lazily, so a long
trace never holds every prompt in memory at once. All are deterministic in `seed`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence

from gpufleet.workload.prompts import PromptFactory, mix_seed
from gpufleet.workload.traces import TraceRecord
from gpufleet.workload.types import Conversation, Turn


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

    def draw(self) -> int:
        if self.low == self.high:
            return self.low
        return self._rng.randint(self.low, self.high)


def sample_lengths(n: int, mean_tokens: int, range_ratio: float, rng: random.Random) -> list[int]:
    """n lengths from `LengthSampler`."""
    sampler = LengthSampler(mean_tokens, range_ratio, rng)
    return [sampler.draw() for _ in range(n)]


def _turn(factory: PromptFactory, seed: int, input_tokens: int, output_tokens: int) -> Turn:
    return Turn(factory.text(seed, input_tokens), input_tokens, output_tokens)


def random_conversations(
    n: int,
    input_tokens: int,
    output_tokens: int,
    range_ratio: float = 0.0,
    seed: int = 0,
    factory: PromptFactory | None = None,
) -> Iterator[Conversation]:
    """n single-turn requests with unique random prompts."""
    factory = factory or PromptFactory()
    rng = random.Random(seed)
    ins = LengthSampler(input_tokens, range_ratio, rng)
    outs = LengthSampler(output_tokens, range_ratio, rng)
    for i in range(n):
        turn = _turn(factory, mix_seed("random", seed, i), ins.draw(), outs.draw())
        yield Conversation(id=i, turns=(turn,))


def prefix_group_conversations(
    n: int,
    groups: int,
    prefix_tokens: int,
    input_tokens: int,
    output_tokens: int,
    range_ratio: float = 0.0,
    seed: int = 0,
    factory: PromptFactory | None = None,
) -> Iterator[Conversation]:
    """n requests in `groups` shared-prefix groups (round robin).

    Each prompt is its group's fixed `prefix_tokens`-word prefix followed by a unique
    suffix of about `input_tokens` words, so prompt length = prefix_tokens + suffix.
    """
    if groups < 1:
        raise ValueError("groups must be at least 1")
    factory = factory or PromptFactory()
    rng = random.Random(seed)
    suffixes = LengthSampler(input_tokens, range_ratio, rng) if input_tokens > 0 else None
    outs = LengthSampler(output_tokens, range_ratio, rng)
    prefixes = [factory.text(mix_seed("prefix", seed, g), prefix_tokens) for g in range(groups)]
    for i in range(n):
        group = i % groups
        n_suffix = suffixes.draw() if suffixes else 0
        suffix = factory.text(mix_seed("suffix", seed, i), n_suffix)
        text = " ".join(part for part in (prefixes[group], suffix) if part)
        turn = Turn(text, prefix_tokens + n_suffix, outs.draw())
        yield Conversation(id=i, turns=(turn,), prefix_group=group)


def session_conversations(
    sessions: int,
    turns: int,
    input_tokens: int,
    output_tokens: int,
    range_ratio: float = 0.0,
    seed: int = 0,
    factory: PromptFactory | None = None,
) -> Iterator[Conversation]:
    """`sessions` conversations of `turns` turns each; turn k+1 resends turns 1..k and answers."""
    if turns < 1:
        raise ValueError("turns must be at least 1")
    factory = factory or PromptFactory()
    rng = random.Random(seed)
    ins = LengthSampler(input_tokens, range_ratio, rng)
    outs = LengthSampler(output_tokens, range_ratio, rng)
    for s in range(sessions):
        built = tuple(
            _turn(factory, mix_seed("session", seed, s, t), ins.draw(), outs.draw())
            for t in range(turns)
        )
        yield Conversation(id=s, turns=built)


def trace_conversations(
    records: Sequence[TraceRecord],
    speedup: float = 1.0,
    seed: int = 0,
    factory: PromptFactory | None = None,
) -> Iterator[Conversation]:
    """Single-turn requests replaying a trace at `speedup`× its own pace.

    Records with `hash_ids` (Mooncake) get prompts made of the named blocks, so equal
    leading ids give equal prefixes; others get unique random prompts. A zero length
    is raised to 1 token, since an empty prompt or max_tokens=0 is not a request.
    """
    if speedup <= 0:
        raise ValueError("speedup must be positive")
    factory = factory or PromptFactory()
    for i, rec in enumerate(records):
        n_in = max(1, rec.input_tokens)
        fill_seed = mix_seed("trace", seed, i)
        if rec.hash_ids:
            text = factory.text_from_blocks(list(rec.hash_ids), n_in, fill_seed)
        else:
            text = factory.text(fill_seed, n_in)
        turn = Turn(text, n_in, max(1, rec.output_tokens))
        yield Conversation(id=i, turns=(turn,), arrival_s=rec.arrival_s / speedup)
