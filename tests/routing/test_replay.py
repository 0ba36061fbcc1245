"""The engine-free replay: its replicas keep a prefix cache the way vLLM's block pool does."""

from __future__ import annotations

import pytest

from gpufleet.routing import make_policy
from gpufleet.routing.replay import (
    EngineCacheModel,
    ReplayRequest,
    ReplicaTiming,
    pooled_cache_hit_rate,
    pooled_engine_hit_rate,
    replay,
)


def test_blocks_of_running_requests_are_never_evicted() -> None:
    cache = EngineCacheModel(10)
    running = cache.admit([1, 2, 3, 4], hit_blocks=0, total_blocks=4, full_blocks=4)
    other = cache.admit([5, 6, 7, 8, 9, 10], hit_blocks=0, total_blocks=6, full_blocks=6)
    cache.release(other)
    # Ten blocks taken; a new request's four evict only free ones, never 1..4.
    cache.release(cache.admit([20, 21, 22, 23], hit_blocks=0, total_blocks=4, full_blocks=4))
    assert cache.cached_prefix([1, 2, 3, 4]) == 4
    assert cache.occupied_blocks <= 10
    cache.release(running)
    assert cache.peak_overflow_blocks == 0


def test_a_finished_request_is_evicted_tail_first_and_its_output_before_its_prompt() -> None:
    cache = EngineCacheModel(8)
    # 4 prompt blocks and 2 full blocks of generated text.
    cache.release(cache.admit([1, 2, 3, 4], hit_blocks=0, total_blocks=6, full_blocks=6))
    assert cache.occupied_blocks == 6
    # Six new blocks evict four: the two generated ones, then the prompt's tail (4, 3).
    new = [30, 31, 32, 33, 34, 35]
    cache.release(cache.admit(new, hit_blocks=0, total_blocks=6, full_blocks=6))
    assert cache.cached_prefix([1, 2, 3, 4]) == 2


def test_a_block_cached_past_a_miss_is_computed_again_as_a_private_copy() -> None:
    cache = EngineCacheModel(100)
    cache.release(cache.admit([1, 2, 3], hit_blocks=0, total_blocks=3, full_blocks=3))
    # Same chain hashes cannot differ in their head in reality; the model still must not
    # share a block past the first miss (the engine stops its lookup there).
    lease = cache.admit([9, 2, 3], hit_blocks=0, total_blocks=3, full_blocks=3)
    assert lease.private_blocks == 2 and lease.pinned == [9]


def test_hits_are_counted_in_tokens_and_never_cover_the_last_token() -> None:
    prompt = tuple(range(10))  # 10 blocks of 16 tokens = 160 tokens
    reqs = [ReplayRequest(0.0, prompt, output_tokens=1), ReplayRequest(10.0, prompt, 1)]
    report = replay(make_policy("round_robin", seed=0), reqs, replicas=1)
    # The second request reuses 9 blocks: the 10th holds its last token, computed again.
    assert report.hit_tokens == 9 * 16
    assert report.prompt_tokens == 2 * 160


def test_router_and_engine_hash_chains_are_kept_apart() -> None:
    # The router sees 2 coarse blocks; the engine caches 8 fine ones.
    reqs = [
        ReplayRequest(0.0, (7, 8), 1, cache_hashes=tuple(range(8)), prompt_tokens=130),
        ReplayRequest(5.0, (7, 8), 1, cache_hashes=tuple(range(8)), prompt_tokens=130),
    ]
    report = replay(make_policy("prefix_aware", seed=0), reqs, replicas=2)
    assert report.hit_tokens == 8 * 16 and report.prompt_tokens == 260
    assert sorted(report.requests_per_replica.values()) == [0, 2]  # the match kept it home


def test_pooled_cache_hit_rate_is_one_lru_over_prompts() -> None:
    a, b = tuple(range(4)), tuple(range(100, 104))
    reqs = [ReplayRequest(float(i), h, 1) for i, h in enumerate((a, b, a))]
    assert pooled_cache_hit_rate(reqs, cache_blocks=8) == pytest.approx(4 / 12)
    assert pooled_cache_hit_rate(reqs, cache_blocks=4) == 0.0  # b evicted a


def test_pooled_engine_counts_the_room_generated_tokens_take() -> None:
    # a, then b with 4 blocks of output, then a again one block longer: a prompt-only LRU
    # of 8 blocks keeps a (4 + 4 blocks), an engine of 2 x 4 blocks evicts it for b's output.
    a, b = (1, 2, 3, 4), (11, 12, 13, 14)
    reqs = [
        ReplayRequest(0.0, a, output_tokens=0),
        ReplayRequest(10.0, b, output_tokens=64),
        ReplayRequest(20.0, (*a, 5), output_tokens=0),
    ]
    assert pooled_cache_hit_rate(reqs, cache_blocks=8) == pytest.approx(64 / 208)
    assert pooled_engine_hit_rate(reqs, ReplicaTiming(cache_blocks=4), replicas=2) == 0.0
    # with room for b's output too, the engine keeps a as the LRU does
    roomy = ReplicaTiming(cache_blocks=6)
    assert pooled_engine_hit_rate(reqs, roomy, replicas=2) == pytest.approx(64 / 208)


def test_replay_hands_back_the_replicas_caches() -> None:
    caches: dict[str, EngineCacheModel] = {}
    reqs = [ReplayRequest(0.0, (1, 2, 3), 16)]
    replay(
        make_policy("round_robin", seed=0),
        reqs,
        replicas=2,
        timing=ReplicaTiming(cache_blocks=50),
        caches=caches,
    )
    assert sorted(caches) == ["r0", "r1"]
    assert sum(c.cached_prefix([1, 2, 3]) for c in caches.values()) == 3


def test_hits_lost_to_placement_are_counted_apart_from_evictions() -> None:
    prompt = tuple(range(10))
    # Round robin sends the second copy to r1 while r0 holds it: 9 blocks held elsewhere.
    reqs = [ReplayRequest(0.0, prompt, output_tokens=1), ReplayRequest(10.0, prompt, 1)]
    report = replay(make_policy("round_robin", seed=0), reqs, replicas=2)
    assert report.hit_tokens == 0
    assert report.held_elsewhere_tokens == 9 * 16
    assert report.held_elsewhere_rate == pytest.approx(9 / 20)
    # A one-block cache keeps only the head on r0: the other 8 blocks were evicted, not
    # held elsewhere.
    tiny = ReplicaTiming(cache_blocks=1)
    evicted = replay(make_policy("round_robin", seed=0), reqs, replicas=2, timing=tiny)
    assert evicted.hit_tokens == 0 and evicted.held_elsewhere_tokens == 16
    assert evicted.evicted_here_tokens == 0  # r1 never had them: evicted from r0 only


def test_hits_a_replica_lost_to_its_own_eviction_are_counted() -> None:
    a, b = tuple(range(10)), tuple(range(100, 110))
    # One replica with room for one prompt: b evicts all of a but its head, so a's second
    # visit recomputes 8 blocks the replica itself held (the last block is always computed).
    reqs = [ReplayRequest(0.0, a, 1), ReplayRequest(10.0, b, 1), ReplayRequest(20.0, a, 1)]
    report = replay(make_policy("round_robin", seed=0), reqs, replicas=1,
                    timing=ReplicaTiming(cache_blocks=12))  # fmt: skip
    assert report.hit_tokens == 16
    assert report.held_elsewhere_tokens == 0
    assert report.evicted_here_tokens == 8 * 16
    assert report.evicted_here_rate == pytest.approx(8 / 30)


def test_each_placement_is_noted_with_its_hit_best_holder_and_own_eviction() -> None:
    prompt, other = tuple(range(10)), tuple(range(100, 110))
    # Round robin: r0, r1, r0. The second copy of `prompt` lands on r1 while r0 holds 9
    # of its blocks it may hit (never the last one, computed to sample from).
    reqs = [ReplayRequest(0.0, prompt, 1), ReplayRequest(10.0, prompt, 1),
            ReplayRequest(20.0, other, 1)]  # fmt: skip
    report = replay(make_policy("round_robin", seed=0), reqs, replicas=2,
                    timing=ReplicaTiming(cache_blocks=12))  # fmt: skip
    assert report.placements == {
        0: ("r0", 0, 0, 0, 9),
        1: ("r1", 0, 9, 9, 9),
        2: ("r0", 0, 0, 0, 9),
    }
    # Its own eviction: one replica with room for one prompt, `prompt` comes back after
    # `other` evicted all but its head: it hit 1, nobody held more, it had held 9.
    again = [*reqs[:1], reqs[2], ReplayRequest(30.0, prompt, 1)]
    report = replay(make_policy("round_robin", seed=0), again, replicas=1,
                    timing=ReplicaTiming(cache_blocks=12))  # fmt: skip
    assert report.placements[2] == ("r0", 1, 1, 9, 9)
    assert list(report.placements) == [0, 1, 2]  # in the order their prefills started


def test_ttft_is_reported_per_request_by_its_index() -> None:
    # Two prompts queue on one replica: the second waits for the first's prefill.
    timing = ReplicaTiming(cache_blocks=100, prefill_base_s=0.0, prefill_s_per_token=0.001)
    reqs = [ReplayRequest(0.0, (1, 2, 3, 4), 8), ReplayRequest(0.0, (5, 6), 8)]
    report = replay(make_policy("round_robin", seed=0), reqs, replicas=1, timing=timing)
    assert report.ttft_s_by_request == pytest.approx({0: 0.064, 1: 0.096})
    assert sorted(report.ttft_s) == sorted(report.ttft_s_by_request.values())
