"""Synthetic prefix-sharing workloads for routing: shared system prompts with Zipf
popularity, multi-turn chat sessions, tool-using agents with long shared prefixes, and
mixes of them.

Each returns single-turn `Conversation`s sorted by arrival, whose text already carries
everything earlier turns would resend (history, tool results), so any client can replay
them open-loop at their `arrival_s`; `prefix_group` names the session (or system-prompt
group) a request belongs to, a key a client could send for session affinity. A prompt
is a list of segments, each a seeded run of words: equal segments give equal text, so
requests share exactly the prefixes the generator means them to. All are deterministic
in `seed`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from gpufleet.workload.prompts import PromptFactory, mix_seed
from gpufleet.workload.types import Conversation, Turn

WORKLOAD_NAMES = ("system_prompts", "multi_turn", "tool_agent", "mixed")


@dataclass(frozen=True, slots=True)
class _Prompt:
    arrival_s: float
    segments: tuple[tuple[int, int], ...]  # (seed, tokens)
    output_tokens: int
    group: int


def zipf_weights(n: int, s: float) -> list[float]:
    """Popularity of ranks 1..n under Zipf's law with exponent `s` (not normalized)."""
    return [1.0 / (k**s) for k in range(1, n + 1)]


def _between(rng: random.Random, bounds: tuple[int, int]) -> int:
    return rng.randint(min(bounds), max(bounds))


def system_prompt_prompts(
    n: int,
    *,
    rate_per_s: float,
    groups: int = 200,
    zipf_s: float = 1.0,
    prefix_tokens: tuple[int, int] = (1000, 8000),
    suffix_tokens: tuple[int, int] = (100, 2000),
    output_tokens: tuple[int, int] = (50, 400),
    seed: int = 0,
) -> list[_Prompt]:
    """Single requests behind one of `groups` system prompts, popularity Zipf(`zipf_s`)."""
    rng = random.Random(mix_seed("system_prompts", seed))
    lengths = [_between(rng, prefix_tokens) for _ in range(groups)]
    weights = zipf_weights(groups, zipf_s)
    out: list[_Prompt] = []
    t = 0.0
    for i in range(n):
        t += rng.expovariate(rate_per_s)
        g = rng.choices(range(groups), weights=weights)[0]
        segments = (
            (mix_seed("sys", seed, g), lengths[g]),
            (mix_seed("ask", seed, i), _between(rng, suffix_tokens)),
        )
        out.append(_Prompt(t, segments, _between(rng, output_tokens), g))
    return out


def multi_turn_prompts(
    sessions: int,
    *,
    session_rate_per_s: float,
    turns: tuple[int, int] = (2, 12),
    think_s: float = 30.0,
    system_prompts: int = 16,
    system_tokens: tuple[int, int] = (200, 3000),
    user_tokens: tuple[int, int] = (50, 1500),
    answer_tokens: tuple[int, int] = (100, 800),
    seed: int = 0,
) -> list[_Prompt]:
    """Chat sessions: each turn resends the system prompt, every earlier question and
    answer, and asks something new; turns follow each other after exponential think times."""
    rng = random.Random(mix_seed("multi_turn", seed))
    sys_len = [_between(rng, system_tokens) for _ in range(system_prompts)]
    out: list[_Prompt] = []
    t = 0.0
    for s in range(sessions):
        t += rng.expovariate(session_rate_per_s)
        sp = rng.randrange(system_prompts)
        history: list[tuple[int, int]] = [(mix_seed("chat-sys", seed, sp), sys_len[sp])]
        at = t
        for k in range(_between(rng, turns)):
            history.append((mix_seed("chat-user", seed, s, k), _between(rng, user_tokens)))
            answer = _between(rng, answer_tokens)
            out.append(_Prompt(at, tuple(history), answer, 1_000_000 + s))
            history.append((mix_seed("chat-answer", seed, s, k), answer))
            at += rng.expovariate(1.0 / think_s)
    out.sort(key=lambda p: p.arrival_s)
    return out


def tool_agent_prompts(
    tasks: int,
    *,
    task_rate_per_s: float,
    agents: int = 40,
    zipf_s: float = 1.0,
    tools_tokens: tuple[int, int] = (4000, 16000),
    task_tokens: tuple[int, int] = (200, 2000),
    steps: tuple[int, int] = (3, 12),
    step_gap_s: float = 3.0,
    observation_tokens: tuple[int, int] = (200, 4000),
    output_tokens: tuple[int, int] = (20, 300),
    seed: int = 0,
) -> list[_Prompt]:
    """Agent tasks: a long per-agent prefix (instructions and tool schemas, popularity
    Zipf(`zipf_s`)), the task, then one call per step whose context grows by the model's
    last call and the tool's result, a few seconds apart."""
    rng = random.Random(mix_seed("tool_agent", seed))
    prefix_len = [_between(rng, tools_tokens) for _ in range(agents)]
    weights = zipf_weights(agents, zipf_s)
    out: list[_Prompt] = []
    t = 0.0
    for task in range(tasks):
        t += rng.expovariate(task_rate_per_s)
        a = rng.choices(range(agents), weights=weights)[0]
        context = [
            (mix_seed("agent", seed, a), prefix_len[a]),
            (mix_seed("task", seed, task), _between(rng, task_tokens)),
        ]
        at = t
        for k in range(_between(rng, steps)):
            call = _between(rng, output_tokens)
            out.append(_Prompt(at, tuple(context), call, 2_000_000 + task))
            context.append((mix_seed("call", seed, task, k), call))
            context.append((mix_seed("result", seed, task, k), _between(rng, observation_tokens)))
            at += rng.expovariate(1.0 / step_gap_s)
    out.sort(key=lambda p: p.arrival_s)
    return out


def _conversations(prompts: Sequence[_Prompt], factory: PromptFactory) -> list[Conversation]:
    texts: dict[tuple[int, int], str] = {}  # a segment's text, built once per workload

    def text(seg: tuple[int, int]) -> str:
        got = texts.get(seg)
        if got is None:
            got = texts[seg] = factory.text(*seg)
        return got

    out = []
    for i, p in enumerate(prompts):
        body = " ".join(text(seg) for seg in p.segments)
        tokens = sum(n for _, n in p.segments)
        out.append(
            Conversation(
                id=i,
                turns=(Turn(body, tokens, p.output_tokens),),
                arrival_s=p.arrival_s,
                prefix_group=p.group,
            )
        )
    return out


def prefix_sharing_workload(
    name: str,
    *,
    duration_s: float = 120.0,
    rate_per_s: float = 5.0,
    seed: int = 0,
    factory: PromptFactory | None = None,
) -> list[Conversation]:
    """About `rate_per_s` requests a second for `duration_s` of workload `name` (one of
    WORKLOAD_NAMES; `mixed` is a third of each), sorted by arrival."""
    if name not in WORKLOAD_NAMES:
        raise ValueError(f"unknown workload {name!r}; expected one of {WORKLOAD_NAMES}")
    if duration_s <= 0 or rate_per_s <= 0:
        raise ValueError("duration_s and rate_per_s must be positive")
    parts = WORKLOAD_NAMES[:3] if name == "mixed" else (name,)
    rate = rate_per_s / len(parts)
    prompts: list[_Prompt] = []
    for part in parts:
        if part == "system_prompts":
            prompts += system_prompt_prompts(int(rate * duration_s), rate_per_s=rate, seed=seed)
        elif part == "multi_turn":  # ~7 turns a session
            prompts += multi_turn_prompts(
                max(1, int(rate * duration_s / 7)), session_rate_per_s=rate / 7, seed=seed
            )
        else:  # ~7 steps a task
            prompts += tool_agent_prompts(
                max(1, int(rate * duration_s / 7)), task_rate_per_s=rate / 7, seed=seed
            )
    prompts = [p for p in prompts if p.arrival_s <= duration_s]
    prompts.sort(key=lambda p: p.arrival_s)
    return _conversations(prompts, factory or PromptFactory())
