"""PrefixUses: decayed prompt counts per shared prefix, and how rare and one-shot it is."""

from __future__ import annotations

import pytest

from gpufleet.routing.prefix_uses import PrefixUses


def test_counts_decay_once_per_decision() -> None:
    uses = PrefixUses(decay=0.5)
    uses.add(7, continues=False)
    uses.add(7, continues=True)
    assert uses.get(7) == (2.0, 1.0)
    uses.tick()
    uses.tick()
    assert uses.get(7) == (0.5, 0.25)
    assert uses.get(8) == (0.0, 0.0)


def test_a_rare_one_shot_prefix_fills_little_of_a_replica() -> None:
    uses = PrefixUses(decay=0.999)
    uses.add(1, continues=False)
    # 1 prompt of 100 decisions over 4 replicas: 4 % of one replica's share
    assert uses.one_shot_fill(1, replicas=4, decisions=100.0) == pytest.approx(0.96)
    for _ in range(30):
        uses.add(1, continues=False)
    assert uses.one_shot_fill(1, replicas=4, decisions=100.0) == 0.0  # it fills a replica
    assert uses.one_shot_fill(2, replicas=4, decisions=100.0) == 0.0  # unknown


def test_prompts_that_start_conversations_are_not_one_shot() -> None:
    uses = PrefixUses(decay=0.999)
    uses.add(1, continues=False)  # a first turn...
    assert uses.one_shot_fill(1, replicas=4, decisions=100.0) > 0.9
    uses.add(1, continues=True)  # ...that its next turn continued
    assert uses.one_shot_fill(1, replicas=4, decisions=100.0) == 0.0


def test_memory_is_bounded_by_forgetting_faded_keys() -> None:
    uses = PrefixUses(decay=0.5, max_keys=100)
    for k in range(1000):
        uses.add(k, continues=False)
        uses.tick()
    assert len(uses._counts) <= 101
    with pytest.raises(ValueError, match="decay"):
        PrefixUses(decay=1.0)


def test_memory_is_bounded_when_nothing_fades_within_the_window() -> None:
    uses = PrefixUses(decay=0.99999, max_keys=100)
    for k in range(1000):
        uses.add(k, continues=False)
    assert len(uses._counts) <= 100
    assert uses.get(999) == (1.0, 0.0)  # the most recent are kept
