"""Prefix hashing of request bodies and the LRU prefix index (pure)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpufleet.routing.prefix import (
    ROUTING_BLOCK_BYTES,
    blocks_for_tokens,
    prompt_text,
    request_prefix_hashes,
    text_prefix_hashes,
)
from gpufleet.routing.prefix_index import PrefixIndex
from gpufleet.tokenizer import apply_chat_template

SYSTEM = "You are a careful assistant. " * 40  # ~1.2 kB: several routing blocks


def chat(user: str) -> dict:
    return {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]}


def test_shared_system_prompt_gives_shared_leading_hashes() -> None:
    a = request_prefix_hashes(chat("first question " * 50), "/v1/chat/completions")
    b = request_prefix_hashes(chat("another one " * 50), "/v1/chat/completions")
    shared_blocks = len(apply_chat_template(chat("")["messages"][:1]).encode()) // 256
    assert shared_blocks >= 4
    assert a[:shared_blocks] == b[:shared_blocks]
    assert a[shared_blocks + 1 :] != b[shared_blocks + 1 :]
    # Chained: a block's hash depends on everything before it.
    c = request_prefix_hashes(chat("first question " * 50), "chat")
    assert c == a


def test_hash_count_is_full_blocks_of_the_rendered_prompt() -> None:
    body = chat("x " * 3000)
    text = prompt_text(body, "/v1/chat/completions")
    assert text == apply_chat_template(body["messages"])
    assert len(request_prefix_hashes(body, "/v1/chat/completions")) == len(text.encode()) // (
        ROUTING_BLOCK_BYTES
    )
    assert text_prefix_hashes("short") == ()


def test_completions_prompts_strings_batches_and_token_ids() -> None:
    s = "word " * 200
    one = request_prefix_hashes({"prompt": s}, "/v1/completions")
    assert one and request_prefix_hashes({"prompt": [s, "other"]}, "/v1/completions") == one
    ids = request_prefix_hashes({"prompt": list(range(500))}, "/v1/completions")
    assert ids and ids == request_prefix_hashes({"prompt": [list(range(500))]}, "completions")


@pytest.mark.parametrize(
    "body",
    [{}, {"messages": "hi"}, {"messages": [1, 2]}, {"messages": [{"content": 5}]}, {"prompt": 3}],
)
def test_malformed_bodies_hash_to_nothing_instead_of_raising(body: dict) -> None:
    assert request_prefix_hashes(body, "/v1/chat/completions") == ()
    assert request_prefix_hashes(body, "/v1/completions") == ()


def test_unknown_endpoint_is_an_error() -> None:
    with pytest.raises(ValueError, match="endpoint"):
        request_prefix_hashes({"prompt": "x"}, "/v1/embeddings")


@pytest.mark.process
def test_hashes_agree_across_processes_with_different_hash_seeds() -> None:
    code = (
        "from gpufleet.routing.prefix import text_prefix_hashes;"
        "print(text_prefix_hashes('abc ' * 300))"
    )
    outs = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        res = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
        )
        assert res.returncode == 0, res.stderr
        outs.add(res.stdout)
    assert outs == {str(text_prefix_hashes("abc " * 300)) + "\n"}


def test_blocks_for_tokens() -> None:
    assert blocks_for_tokens(1024, bytes_per_token=4.0, block_bytes=256) == 16
    assert blocks_for_tokens(0) == 1


def test_index_match_is_the_longest_leading_run_per_replica() -> None:
    idx = PrefixIndex(capacity_blocks=100)
    idx.insert("a", (1, 2, 3, 4))
    idx.insert("b", (1, 2))
    idx.insert("c", (9, 2, 3))
    assert idx.match((1, 2, 3, 5), ["a", "b", "c", "d"]) == {"a": 3, "b": 2, "c": 0, "d": 0}
    assert idx.match((1, 2, 3, 4), ["a"]) == {"a": 4}
    assert idx.match((), ["a"]) == {"a": 0}


def test_index_is_lru_bounded_and_forgets_tails_before_heads() -> None:
    idx = PrefixIndex(capacity_blocks=6)
    idx.insert("a", (1, 2, 3, 4))
    idx.insert("a", (10, 11, 12, 13))  # 8 blocks > 6: the oldest tail (3, 4) goes
    assert idx.blocks_held("a") == 6
    assert idx.match((1, 2, 3, 4), ["a"]) == {"a": 2}  # head kept, contiguous
    assert idx.match((10, 11, 12, 13), ["a"]) == {"a": 4}
    idx.insert("a", (1, 2))  # touching a prefix makes it recent again
    idx.insert("a", (20, 21))
    assert idx.match((1, 2), ["a"]) == {"a": 2}
    assert idx.match((10, 11, 12, 13), ["a"])["a"] < 4
    assert idx.total_blocks() == 6


def test_index_capacity_per_replica_and_removal_drops_every_entry() -> None:
    idx = PrefixIndex(capacity_blocks=10)
    idx.insert("a", tuple(range(10)))
    idx.insert("b", tuple(range(10)))
    idx.set_capacity("a", 3)
    assert idx.blocks_held("a") == 3 and idx.blocks_held("b") == 10
    idx.remove_replica("b")
    assert idx.blocks_held("b") == 0
    assert idx.match(tuple(range(10)), ["a", "b"]) == {"a": 3, "b": 0}
    idx.remove_replica("a")
    assert idx.total_blocks() == 0
    assert len(idx._spans) == 0  # no reverse-map leak either


def test_index_tells_a_shared_prefix_from_one_conversations_history() -> None:
    idx = PrefixIndex(capacity_blocks=100)
    system = (1, 2, 3)
    idx.insert("a", (*system, 10, 11))  # conversation 1, turn 1
    assert idx.shared_depth((*system, 10, 11, 12), 5) == 0  # nothing branches yet
    idx.insert("b", (*system, 20, 21))  # conversation 2: prompts now branch after block 3
    assert idx.shared_depth((*system, 10, 11, 12), 5) == 3
    # Conversation 1's next turn resends its first whole: no new branch point.
    idx.insert("a", (*system, 10, 11, 12, 13))
    assert idx.shared_depth((*system, 10, 11, 12, 13, 14), 6) == 3
    assert idx.shared_depth((*system, 10, 11), 2) == 0  # only within the first `limit`
    # What no replica holds any more is forgotten, branch points included.
    idx.remove_replica("a")
    idx.remove_replica("b")
    assert len(idx._spans) == 0 and idx._branching == set()
