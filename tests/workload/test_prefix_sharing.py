"""Synthetic prefix-sharing workloads: the sharing each one promises is in the text."""

from __future__ import annotations

import itertools

import pytest

from gpufleet.workload.prefix_sharing import (
    WORKLOAD_NAMES,
    multi_turn_prompts,
    prefix_sharing_workload,
    system_prompt_prompts,
    tool_agent_prompts,
    zipf_weights,
)


def _shared_words(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a.split(), b.split(), strict=False):
        if x != y:
            break
        n += 1
    return n


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_each_workload_is_sorted_deterministic_and_counted_in_words(name: str) -> None:
    a = prefix_sharing_workload(name, duration_s=20, rate_per_s=3, seed=1)
    b = prefix_sharing_workload(name, duration_s=20, rate_per_s=3, seed=1)
    assert a == b and len(a) > 10
    arrivals = [c.arrival_s or 0.0 for c in a]
    assert arrivals == sorted(arrivals) and arrivals[-1] <= 20
    for c in a[:20]:
        (turn,) = c.turns
        assert len(turn.text.split()) == turn.input_tokens  # one word is one token
    assert prefix_sharing_workload(name, duration_s=20, rate_per_s=3, seed=2) != a


def test_system_prompt_groups_share_exactly_their_prefix_and_follow_zipf() -> None:
    prompts = system_prompt_prompts(400, rate_per_s=10, groups=8, zipf_s=1.0, seed=0)
    counts = [sum(p.group == g for p in prompts) for g in range(8)]
    assert counts[0] > 2 * counts[7]  # rank 1 about 8x rank 8
    convs = prefix_sharing_workload("system_prompts", duration_s=30, rate_per_s=4, seed=0)
    by_group: dict[int | None, list[str]] = {}
    for c in convs:
        by_group.setdefault(c.prefix_group, []).append(c.turns[0].text)
    texts = next(t for t in by_group.values() if len(t) >= 2)
    shared = _shared_words(texts[0], texts[1])
    assert shared >= 1000  # the group's system prompt (1k-8k tokens)
    others = next(t for g, t in by_group.items() if t is not texts)
    assert _shared_words(texts[0], others[0]) == 0


def test_a_session_turn_resends_the_previous_turn_and_its_answer() -> None:
    prompts = multi_turn_prompts(3, session_rate_per_s=1.0, turns=(3, 3), seed=0)
    session = sorted((p for p in prompts if p.group == prompts[0].group), key=lambda p: p.arrival_s)
    assert len(session) == 3
    for earlier, later in itertools.pairwise(session):
        assert later.segments[: len(earlier.segments)] == earlier.segments
        # ...plus the answer to it (its output length) and a new question.
        assert later.segments[len(earlier.segments)][1] == earlier.output_tokens
        assert later.arrival_s > earlier.arrival_s


def test_agent_steps_grow_one_context_behind_a_long_shared_tool_prefix() -> None:
    prompts = tool_agent_prompts(40, task_rate_per_s=1.0, agents=3, steps=(2, 4), seed=0)
    first_steps: dict[int, tuple[int, int]] = {}
    for p in prompts:
        first_steps.setdefault(p.group, p.segments[0])
        assert p.segments[0][1] >= 4000  # the agent's instructions and tool schemas
    assert len(set(first_steps.values())) <= 3  # tasks share one of three agent prefixes


def test_zipf_weights_and_bad_names() -> None:
    assert zipf_weights(3, 1.0) == pytest.approx([1.0, 0.5, 1 / 3])
    with pytest.raises(ValueError, match="unknown workload"):
        prefix_sharing_workload("nope")
    with pytest.raises(ValueError, match="positive"):
        prefix_sharing_workload("mixed", duration_s=0)
