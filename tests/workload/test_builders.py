import random
from pathlib import Path

import pytest

from gpufleet.tokenizer import Tokenizer, block_hashes
from gpufleet.workload import (
    PromptFactory,
    prefix_group_conversations,
    random_conversations,
    read_mooncake_jsonl,
    sample_lengths,
    session_conversations,
    trace_conversations,
)


def test_random_prompts_have_exact_token_counts_and_are_unique() -> None:
    convs = list(random_conversations(20, 64, 16, range_ratio=0.5, seed=7))
    tok = Tokenizer()
    seen = set()
    for c in convs:
        (turn,) = c.turns
        assert len(tok.encode(turn.text)) == turn.input_tokens
        assert 32 <= turn.input_tokens <= 96 and 8 <= turn.output_tokens <= 24
        seen.add(turn.text)
    assert len(seen) == 20
    # deterministic in the seed
    again = list(random_conversations(20, 64, 16, range_ratio=0.5, seed=7))
    assert [c.turns for c in again] == [c.turns for c in convs]


def test_range_ratio_zero_is_exact_and_bounds_are_vllms() -> None:
    assert sample_lengths(5, 100, 0.0, random.Random(0)) == [100] * 5
    xs = sample_lengths(2000, 100, 0.2, random.Random(0))
    assert min(xs) == 80 and max(xs) == 120
    with pytest.raises(ValueError):
        sample_lengths(1, 10, 1.0, random.Random(0))


def test_prefix_groups_share_exactly_their_prefix() -> None:
    convs = list(
        prefix_group_conversations(8, groups=2, prefix_tokens=40, input_tokens=10, output_tokens=4)
    )
    words = [c.turns[0].text.split() for c in convs]
    assert [c.prefix_group for c in convs] == [0, 1] * 4
    assert all(len(w) == 50 == c.turns[0].input_tokens for w, c in zip(words, convs, strict=True))
    assert words[0][:40] == words[2][:40] == words[6][:40]
    assert words[0][:40] != words[1][:40]
    assert words[0][40:] != words[2][40:]  # unique suffixes


def test_sessions_have_turns_with_exact_counts() -> None:
    convs = list(session_conversations(3, turns=4, input_tokens=12, output_tokens=5))
    assert len(convs) == 3 and all(len(c.turns) == 4 for c in convs)
    assert all(len(t.text.split()) == 12 for c in convs for t in c.turns)


def test_mooncake_hash_ids_become_shared_blocks(traces_dir: Path) -> None:
    recs = read_mooncake_jsonl(traces_dir / "mooncake_conversation.jsonl", limit=5)
    convs = list(trace_conversations(recs, speedup=2.0))
    words = [c.turns[0].text.split() for c in convs]
    for c, r, w in zip(convs, recs, words, strict=True):
        assert len(w) == r.input_tokens == c.turns[0].input_tokens
        assert c.arrival_s == pytest.approx(r.arrival_s / 2.0)
    # records 0 and 1 share hash id 0 only: their first 512 words are equal, the next differ
    assert recs[0].hash_ids and recs[1].hash_ids
    assert recs[0].hash_ids[0] == recs[1].hash_ids[0] and recs[0].hash_ids[1] != recs[1].hash_ids[1]
    assert words[0][:512] == words[1][:512] and words[0][512:1024] != words[1][512:1024]
    # so the replica's chained block hashes agree on exactly that prefix
    tok = Tokenizer()
    h0 = block_hashes(tok.encode(convs[0].turns[0].text), 16)
    h1 = block_hashes(tok.encode(convs[1].turns[0].text), 16)
    common = next(i for i, (a, b) in enumerate(zip(h0, h1, strict=False)) if a != b)
    assert common == 512 // 16


def test_blocks_shorter_than_asked_are_padded() -> None:
    f = PromptFactory(block_tokens=4)
    text = f.text_from_blocks([1, 2], 11, fill_seed=5)
    assert len(text.split()) == 11
    assert text.split()[:4] == f.block_words(1)
    assert f.text_from_blocks([1, 2], 3, fill_seed=5).split() == f.block_words(1)[:3]
