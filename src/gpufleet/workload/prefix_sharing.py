"""Synthetic prefix-sharing workloads for routing: shared system prompts with Zipf
popularity, multi-turn chat sessions, tool-using agents with long shared prefixes, and
mixes of them.

Each is a list of single-turn `ConversationShape`s sorted by arrival whose segments already
carry everything earlier turns would resend (history, answers, tool results), so any
client replays them open-loop at their `arrival_s` (render them with
`text_conversations`, or hash their segments for the simulator). `session_key` names the
session or agent task a request belongs to, `prefix_group` the system prompt or agent. A
segment's key names its text, so requests share exactly the prefixes meant. All are
deterministic in `seed`.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from gpufleet.workload.segments import KIND_ANSWER, KIND_PREFIX, KIND_UNIQUE, Segments, named_key
from gpufleet.workload.shapes import ConversationShape, TurnShape

WORKLOAD_NAMES = ("system_prompts", "multi_turn", "tool_agent", "mixed")
Bounds = tuple[int, int]


def zipf_weights(n: int, s: float) -> list[float]:
    """Popularity of ranks 1..n under Zipf's law with exponent `s` (not normalized)."""
    return [1.0 / (k**s) for k in range(1, n + 1)]


def _between(rng: random.Random, bounds: Bounds) -> int:
    return rng.randint(min(bounds), max(bounds))


def _request(at: float, segments: Segments, output: int, group: int, session: str | None
             ) -> ConversationShape:  # fmt: skip
    return ConversationShape(0, at, (TurnShape(segments, output),), group, session)


def system_prompt_shapes(
    n: int,
    *,
    rate_per_s: float,
    groups: int = 200,
    zipf_s: float = 1.0,
    prefix_tokens: Bounds = (1000, 8000),
    suffix_tokens: Bounds = (100, 2000),
    output_tokens: Bounds = (50, 400),
    seed: int = 0,
) -> list[ConversationShape]:
    """Single requests behind one of `groups` system prompts, popularity Zipf(`zipf_s`)."""
    rng = random.Random(f"system_prompts:{seed}")
    lengths = [_between(rng, prefix_tokens) for _ in range(groups)]
    weights = zipf_weights(groups, zipf_s)
    out = []
    t = 0.0
    for i in range(n):
        t += rng.expovariate(rate_per_s)
        g = rng.choices(range(groups), weights=weights)[0]
        segments = ((named_key(KIND_PREFIX, "system", seed, g), lengths[g]),
                    (named_key(KIND_UNIQUE, "ask", seed, i), _between(rng, suffix_tokens)))  # fmt: skip
        out.append(_request(t, segments, _between(rng, output_tokens), g, None))
    return out


def multi_turn_shapes(
    sessions: int,
    *,
    session_rate_per_s: float,
    turns: Bounds = (2, 12),
    think_s: float = 30.0,
    system_prompts: int = 16,
    system_tokens: Bounds = (200, 3000),
    user_tokens: Bounds = (50, 1500),
    answer_tokens: Bounds = (100, 800),
    seed: int = 0,
) -> list[ConversationShape]:
    """Chat sessions: each turn resends the system prompt and every earlier question and
    answer, then asks something new; turns follow after exponential think times."""
    rng = random.Random(f"multi_turn:{seed}")
    sys_len = [_between(rng, system_tokens) for _ in range(system_prompts)]
    out = []
    t = 0.0
    for s in range(sessions):
        t += rng.expovariate(session_rate_per_s)
        sp = rng.randrange(system_prompts)
        history = [(named_key(KIND_PREFIX, "chat-system", seed, sp), sys_len[sp])]
        at = t
        for k in range(_between(rng, turns)):
            history.append((named_key(KIND_PREFIX, "chat-user", seed, s, k),
                            _between(rng, user_tokens)))  # fmt: skip
            answer = _between(rng, answer_tokens)
            out.append(_request(at, tuple(history), answer, sp, f"chat-{seed}-{s}"))
            history.append((named_key(KIND_ANSWER, "chat-answer", seed, s, k), answer))
            at += rng.expovariate(1.0 / think_s)
    return out


def tool_agent_shapes(
    tasks: int,
    *,
    task_rate_per_s: float,
    agents: int = 40,
    zipf_s: float = 1.0,
    tools_tokens: Bounds = (4000, 16000),
    task_tokens: Bounds = (200, 2000),
    steps: Bounds = (3, 12),
    step_gap_s: float = 3.0,
    observation_tokens: Bounds = (200, 4000),
    output_tokens: Bounds = (20, 300),
    seed: int = 0,
) -> list[ConversationShape]:
    """Agent tasks: a long per-agent prefix (instructions and tool schemas, popularity
    Zipf(`zipf_s`)), the task, then one call per step whose context grows by the model's
    last call and the tool's result, a few seconds apart."""
    rng = random.Random(f"tool_agent:{seed}")
    prefix_len = [_between(rng, tools_tokens) for _ in range(agents)]
    weights = zipf_weights(agents, zipf_s)
    out = []
    t = 0.0
    for task in range(tasks):
        t += rng.expovariate(task_rate_per_s)
        a = rng.choices(range(agents), weights=weights)[0]
        context = [(named_key(KIND_PREFIX, "agent", seed, a), prefix_len[a]),
                   (named_key(KIND_PREFIX, "task", seed, task), _between(rng, task_tokens))]  # fmt: skip
        at = t
        for k in range(_between(rng, steps)):
            call = _between(rng, output_tokens)
            out.append(_request(at, tuple(context), call, a, f"task-{seed}-{task}"))
            context.append((named_key(KIND_ANSWER, "call", seed, task, k), call))
            context.append((named_key(KIND_PREFIX, "result", seed, task, k),
                            _between(rng, observation_tokens)))  # fmt: skip
            at += rng.expovariate(1.0 / step_gap_s)
    return out


def prefix_sharing_shapes(
    name: str, *, duration_s: float = 120.0, rate_per_s: float = 4.0, seed: int = 0
) -> list[ConversationShape]:
    """About `rate_per_s` requests a second for `duration_s` of workload `name` (one of
    WORKLOAD_NAMES; `mixed` is a third of each), sorted by arrival, ids in that order."""
    if name not in WORKLOAD_NAMES:
        raise ValueError(f"unknown workload {name!r}; expected one of {WORKLOAD_NAMES}")
    if duration_s <= 0 or rate_per_s <= 0:
        raise ValueError("duration_s and rate_per_s must be positive")
    parts = WORKLOAD_NAMES[:3] if name == "mixed" else (name,)
    rate = rate_per_s / len(parts)
    count = max(1, int(rate * duration_s))
    shapes: list[ConversationShape] = []
    for part in parts:
        if part == "system_prompts":
            shapes += system_prompt_shapes(count, rate_per_s=rate, seed=seed)
        elif part == "multi_turn":  # ~7 turns a session
            shapes += multi_turn_shapes(max(1, count // 7), session_rate_per_s=rate / 7, seed=seed)
        else:  # ~7 steps a task
            shapes += tool_agent_shapes(max(1, count // 7), task_rate_per_s=rate / 7, seed=seed)
    return _numbered(s for s in shapes if s.arrival_s < duration_s)


def _numbered(shapes: Iterable[ConversationShape]) -> list[ConversationShape]:
    ordered = sorted(shapes, key=lambda s: s.arrival_s)
    return [
        ConversationShape(i, s.arrival_s, s.turns, s.prefix_group, s.session_key)
        for i, s in enumerate(ordered)
    ]
