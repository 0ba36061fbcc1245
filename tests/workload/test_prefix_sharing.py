"""Synthetic prefix-sharing workloads: the sharing each one promises is in the shapes."""

from __future__ import annotations

import itertools

import pytest

from gpufleet.workload import common_prefix_tokens, text_conversations
from gpufleet.workload.prefix_sharing import (
    WORKLOAD_NAMES,
    multi_turn_shapes,
    prefix_sharing_shapes,
    system_prompt_shapes,
    tool_agent_shapes,
    zipf_weights,
)


def _segments(shape):  # type: ignore[no-untyped-def]
    return shape.turns[0].segments


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_each_workload_is_sorted_deterministic_and_single_turn(name: str) -> None:
    a = prefix_sharing_shapes(name, duration_s=30, rate_per_s=3, seed=1)
    assert a == prefix_sharing_shapes(name, duration_s=30, rate_per_s=3, seed=1)
    assert len(a) > 10 and [s.id for s in a] == list(range(len(a)))
    arrivals = [s.arrival_s for s in a]
    assert arrivals == sorted(arrivals) and arrivals[-1] < 30
    assert all(len(s.turns) == 1 for s in a)
    assert prefix_sharing_shapes(name, duration_s=30, rate_per_s=3, seed=2) != a
    # Rendered as text: one word per token, as the replica counts them.
    conv = next(text_conversations(a[:1]))
    assert len(conv.turns[0].text.split()) == conv.turns[0].input_tokens


def test_system_prompt_groups_share_exactly_their_prefix_and_follow_zipf() -> None:
    shapes = system_prompt_shapes(400, rate_per_s=10, groups=8, zipf_s=1.0, seed=0)
    counts = [sum(s.prefix_group == g for s in shapes) for g in range(8)]
    assert counts[0] > 2 * counts[7]  # rank 1 is about 8x rank 8
    same = [s for s in shapes if s.prefix_group == 0][:2]
    other = next(s for s in shapes if s.prefix_group == 1)
    assert common_prefix_tokens(_segments(same[0]), _segments(same[1])) >= 1000
    assert common_prefix_tokens(_segments(same[0]), _segments(other)) == 0


def test_a_session_turn_resends_the_previous_turn_and_its_answer() -> None:
    shapes = multi_turn_shapes(3, session_rate_per_s=1.0, turns=(3, 3), seed=0)
    key = shapes[0].session_key
    session = sorted((s for s in shapes if s.session_key == key), key=lambda s: s.arrival_s)
    assert len(session) == 3
    for earlier, later in itertools.pairwise(session):
        before, after = _segments(earlier), _segments(later)
        assert after[: len(before)] == before
        # ...then the answer to it (its max_tokens long) and a new question.
        assert after[len(before)][1] == earlier.turns[0].output_tokens
        assert later.arrival_s > earlier.arrival_s


def test_agent_steps_grow_one_context_behind_a_long_shared_tool_prefix() -> None:
    shapes = tool_agent_shapes(40, task_rate_per_s=1.0, agents=3, steps=(2, 4), seed=0)
    heads = {_segments(s)[0] for s in shapes}
    assert len(heads) <= 3 and all(n >= 4000 for _, n in heads)
    task = [s for s in shapes if s.session_key == shapes[0].session_key]
    assert len(task) >= 2
    assert common_prefix_tokens(_segments(task[0]), _segments(task[1])) == (
        task[0].turns[0].input_tokens
    )


def test_zipf_weights_and_bad_arguments() -> None:
    assert zipf_weights(3, 1.0) == pytest.approx([1.0, 0.5, 1 / 3])
    with pytest.raises(ValueError, match="unknown workload"):
        prefix_sharing_shapes("nope")
    with pytest.raises(ValueError, match="positive"):
        prefix_sharing_shapes("mixed", duration_s=0)
