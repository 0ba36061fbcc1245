"""prefix_aware: longest cached prefix, bounded loads, no herding, bounded memory."""

from __future__ import annotations

import pytest

from gpufleet.routing import make_policy
from gpufleet.routing.prefix_aware import PrefixAware
from gpufleet.routing.replay import (
    ReplicaTiming,
    pooled_cache_hit_rate,
    replay,
)
from gpufleet.routing.types import ReplicaView

from .helpers import hot_prefix_workload, request, stats, views

P = tuple(range(100, 120))  # a 20-block prefix


def test_routes_to_the_replica_holding_the_longest_prefix() -> None:
    p = PrefixAware(seed=0)
    rs = views(4)
    first = p.choose(request(0, prefix_hashes=P), rs)
    assert first is not None
    for i in range(1, 6):
        again = p.choose(request(i, prefix_hashes=(*P[:15], 900 + i)), rs)
        assert again is first
    # A longer match wins over a shorter one elsewhere.
    other = next(r for r in rs if r is not first)
    p.index.insert(other.replica_id, P[:5])
    assert p.choose(request(9, prefix_hashes=P), rs) is first


def test_new_prefixes_are_placed_by_load() -> None:
    rs = views(4, [3, 0, 2, 5])
    assert PrefixAware(seed=0).choose(request(0, prefix_hashes=(1, 2, 3)), rs).replica_id == "r1"  # type: ignore[union-attr]
    assert PrefixAware(seed=1).choose(request(1), rs).replica_id == "r1"  # type: ignore[union-attr]


def test_pending_prefill_steers_the_next_placement_until_its_first_token() -> None:
    p = PrefixAware(seed=0, share_weight=0.0)
    rs = views(4, [3, 0, 2, 5])
    first = p.choose(request(0, prefix_hashes=(1, 2, 3)), rs)
    assert first is not None and first.replica_id == "r1"
    # r1's prefill of that prompt is still pending: a short prompt goes elsewhere...
    assert p.choose(request(1), rs).replica_id == "r2"  # type: ignore[union-attr]
    p.on_first_token(request(0), first)
    p.on_first_token(request(1), rs[2])
    # ...and back to the least loaded once it is done.
    assert p.choose(request(2), rs).replica_id == "r1"  # type: ignore[union-attr]


def test_requests_with_nothing_to_gain_keep_away_from_replicas_ahead_on_share() -> None:
    p = PrefixAware(seed=0)
    rs = views(2)
    hot = tuple(range(50))
    for i in range(6):  # r? takes six requests of one prefix, all finished at once
        holder = p.choose(request(i, prefix_hashes=hot), rs)
        assert holder is not None
        p.on_finished(request(i), holder, True)
    other = next(r for r in rs if r is not holder)
    # A new prompt, equally uncached everywhere, goes to the replica behind on share.
    assert p.choose(request(9, prefix_hashes=tuple(range(100, 150))), rs) is other
    # The hot prefix still goes home: its 50 cached blocks outweigh the share.
    assert p.choose(request(10, prefix_hashes=hot), rs) is holder


def test_cold_prompts_even_out_the_blocks_written_not_the_request_counts() -> None:
    # One long cold prompt wrote 100 blocks on one replica: the next short cold prompts all
    # go to the other, so both caches evict at the same pace (as one pooled LRU would);
    # counting requests instead would alternate and evict the long prompt's replica first.
    def placements(share: str) -> list[str]:
        p = PrefixAware(seed=0, share=share)
        rs = views(2)
        long = p.choose(request(0, prefix_hashes=tuple(range(1000, 1100))), rs)
        assert long is not None
        p.on_first_token(request(0), long)
        out = []
        for i in range(1, 5):
            short = p.choose(request(i, prefix_hashes=(i, 10 + i)), rs)
            assert short is not None
            p.on_first_token(request(i), short)
            out.append("same" if short is long else "other")
        return out

    assert placements("new_blocks") == ["other"] * 4
    assert placements("cold_blocks") == ["other"] * 4  # prompts no replica holds: by blocks
    # By both: the blocks first, within balance_factor x the mean request count.
    assert placements("requests_and_cold_blocks") == ["other", "other", "same", "other"]
    assert placements("requests").count("same") >= 1
    assert PrefixAware().share == "requests_and_cold_blocks"  # the default evens churn


def test_a_new_prompt_leaves_the_share_slack_to_the_hot_prefix_holder() -> None:
    # r? holds a hot prefix: six requests, five of them hits, so it has written the fewest
    # blocks; the other replica took one long new prompt. A new prompt loses nothing by
    # moving: by churn alone it would go to the hot holder, which is ahead on requests
    # (within the slack of the share bound, past balance_factor x mean). It goes to the
    # replica behind, leaving that room to the holder's matches.
    p = PrefixAware(seed=0, share="requests_and_cold_blocks")
    rs = views(2)
    hot = tuple(range(50))
    for i in range(6):
        holder = p.choose(request(i, prefix_hashes=hot), rs)
        assert holder is not None
        p.on_finished(request(i), holder, True)
    other = next(r for r in rs if r is not holder)
    long = p.choose(request(6, prefix_hashes=tuple(range(1000, 1200))), rs)
    assert long is other
    p.on_finished(request(6), long, True)
    assert p.choose(request(7, prefix_hashes=tuple(range(2000, 2010))), rs) is other


def test_share_signal_is_validated() -> None:
    with pytest.raises(ValueError, match="share must be one of"):
        PrefixAware(share="tokens")


def test_pending_prefill_is_tracked_per_request_and_settled_once() -> None:
    p = PrefixAware(seed=0)
    rs = views(2)
    a = p.choose(request(0, prefix_hashes=P), rs)
    assert a is not None
    assert p.pending_prefill_blocks(a.replica_id) == len(P) + 1
    # A retry of the same request replaces its earlier attempt instead of adding to it.
    b = p.choose(request(0, prefix_hashes=P), rs)
    assert b is not None
    assert sum(p.pending_prefill_blocks(r.replica_id) for r in rs) <= len(P) + 1
    p.on_first_token(request(0), b)
    p.on_finished(request(0), b, True)
    assert all(p.pending_prefill_blocks(r.replica_id) == 0 for r in rs)


def test_a_long_prefill_queue_on_the_holder_sends_a_small_match_elsewhere() -> None:
    p = PrefixAware(seed=0, miss_weight=2.0, share_weight=0.0)  # queue vs match alone
    rs = views(2)
    holder = p.choose(request(0, prefix_hashes=(1, 2)), rs)
    assert holder is not None
    # 200 blocks of someone else's prefill queued on the holder (never settled here).
    p.choose(request(1, prefix_hashes=tuple(range(500, 700))), [holder])
    other = p.choose(request(2, prefix_hashes=(1, 2, 3)), rs)
    assert other is not None and other is not holder
    # A long match is still worth the wait: 150 cached blocks beat an idle replica.
    long_prefix = tuple(range(1000, 1150))
    p.index.insert(holder.replica_id, long_prefix)
    assert p.choose(request(3, prefix_hashes=(*long_prefix, 7)), rs) is holder


def test_an_overloaded_holder_sheds_to_a_new_replica_which_then_holds_the_prefix() -> None:
    p = PrefixAware(seed=0)
    rs = views(4)
    holder = p.choose(request(0, prefix_hashes=P), rs)
    assert holder is not None
    # Far above the others (mean (20+1)/4): over the in-flight bound even stretched by
    # match_headroom for a replica holding the whole prompt.
    holder.in_flight = 20
    spill = p.choose(request(1, prefix_hashes=P), rs)
    assert spill is not None and spill is not holder
    assert p.index.match(P, [spill.replica_id])[spill.replica_id] == len(P)
    holder.in_flight = 0
    # Both hold it now; the less loaded copy takes the next one.
    spill.in_flight = 1
    assert p.choose(request(2, prefix_hashes=P), rs) is holder


def test_a_holder_a_few_requests_above_the_mean_keeps_its_long_match() -> None:
    # Four more running sequences barely slow a memory-bound decode step; moving the
    # request would recompute its 20-block match on a replica that holds none of it.
    p = PrefixAware(seed=0)
    rs = views(4)
    holder = p.choose(request(0, prefix_hashes=P), rs)
    assert holder is not None
    p.on_first_token(request(0), holder)
    holder.in_flight = 4  # mean (4 + 1) / 4: a slack of 2 would have sent it elsewhere
    assert p.choose(request(1, prefix_hashes=(*P, 7)), rs) is holder


def test_the_bounds_stretch_for_the_share_of_the_prompt_a_replica_holds() -> None:
    # 12 in flight, the others idle: over the bound (max(2 x 3.25, 3.25 + 8) = 11.25)...
    def placement(suffix_of: tuple[int, ...], headroom: float) -> bool:
        p = PrefixAware(seed=0, match_headroom=headroom)
        rs = views(4)
        holder = p.choose(request(0, prefix_hashes=P), rs)
        assert holder is not None
        p.on_first_token(request(0), holder)
        holder.in_flight = 12
        return p.choose(request(1, prefix_hashes=suffix_of), rs) is holder

    whole = (*P, 7)
    # ...but moving a request that hits all of its prompt there would recompute all of it:
    # the bound stretches to 1.5x for it and it stays;
    assert placement(whole, 0.5)
    assert not placement(whole, 0.0)  # (without headroom it would have moved)
    # one that would hit 2 of its 21 blocks stretches it by 5% only and still moves.
    assert not placement((*P[:2], *range(500, 519)), 0.5)


@pytest.mark.parametrize("keep_history", [True, False])
def test_a_conversation_stays_with_its_history_while_new_ones_do_the_balancing(
    keep_history: bool,
) -> None:
    # A share cost big enough to outweigh recomputing 20 blocks for a replica 5 decisions
    # ahead of the mean, still within the share bound.
    p = PrefixAware(seed=0, share_weight=200.0, keep_history=keep_history)
    rs = views(2)
    system = tuple(range(1000, 1020))
    turn1 = (*system, *range(2000, 2020))
    holder = p.choose(request(0, prefix_hashes=turn1), rs)
    assert holder is not None
    p.on_first_token(request(0), holder)
    other = next(r for r in rs if r is not holder)
    # Another conversation behind the same system prompt, and more decisions, on the
    # holder (by a peer worker): the prompts branch after `system`; the holder is ahead.
    p.on_peer_routed(holder.replica_id, (*system, *range(3000, 3020)))
    for _ in range(7):
        p.on_peer_routed(holder.replica_id, ())
    # A new conversation shares only the system prompt there: it moves, copying it.
    fresh = p.choose(request(1, prefix_hashes=(*system, *range(4000, 4021))), rs)
    assert fresh is other
    p.on_first_token(request(1), other)
    p.on_peer_routed(holder.replica_id, ())  # (the holder stays as far ahead)
    # The first conversation's next turn resends 40 blocks of its own history: it stays,
    # where the share cost alone would have moved it.
    turn2 = (*turn1, *range(2020, 2040))
    assert (p.choose(request(2, prefix_hashes=turn2), rs) is holder) is keep_history


def test_match_headroom_is_validated() -> None:
    with pytest.raises(ValueError, match="match_headroom"):
        PrefixAware(match_headroom=-0.1)


def test_long_run_share_is_bounded_even_when_in_flight_is_even() -> None:
    # Every request finishes at once (in_flight stays 0), so only the share bound acts.
    p = PrefixAware(seed=0, balance_factor=1.1, balance_slack=2.0, window_requests=200)
    rs = views(4)
    counts = {r.replica_id: 0 for r in rs}
    for i in range(2000):
        r = p.choose(request(i, prefix_hashes=P), rs)
        assert r is not None
        counts[r.replica_id] += 1
    mean = sum(counts.values()) / 4
    assert max(counts.values()) / mean <= 1.15


def test_removed_replica_takes_its_index_entries_and_is_not_chosen_from_memory() -> None:
    p = PrefixAware(seed=0)
    rs = views(3)
    holder = p.choose(request(0, prefix_hashes=P), rs)
    assert holder is not None
    p.on_replica_removed(holder.replica_id)
    assert p.index.blocks_held(holder.replica_id) == 0
    rest = [r for r in rs if r is not holder]
    assert p.choose(request(1, prefix_hashes=P), rest) in rest


def test_index_memory_stays_bounded_under_endless_unique_prompts() -> None:
    p = make_policy("prefix_aware", seed=0, capacity_tokens=50 * 256 // 8, bytes_per_token=8.0)
    assert isinstance(p, PrefixAware)
    rs = views(4)
    for i in range(2000):
        p.choose(request(i, prefix_hashes=tuple(range(i * 10, i * 10 + 10))), rs)
    assert p.index.total_blocks() <= 4 * 50


def test_queue_depth_load_signal_is_selectable() -> None:
    from .helpers import stats

    p = make_policy("prefix_aware", seed=0, load="queue_depth")
    rs = views(2, [1, 1])
    rs[0].stats = stats(running=1, waiting=6, at_scrape=1)
    rs[1].stats = stats(running=1, at_scrape=1)
    assert p.choose(request(0, prefix_hashes=P), rs).replica_id == "r1"  # type: ignore[union-attr]


def _hot_run(policy_name: str, **options: object):  # type: ignore[no-untyped-def]
    reqs = hot_prefix_workload(n_requests=2000, rate_per_s=16, seed=3)
    timing = ReplicaTiming(cache_blocks=1000)
    opts = dict(options)
    if policy_name == "prefix_aware":
        opts.setdefault("capacity_tokens", 1000 * 32)  # the index knows the cache size
    report = replay(make_policy(policy_name, seed=1, **opts), reqs, replicas=4, timing=timing)
    return report, pooled_cache_hit_rate(reqs, 4 * timing.cache_blocks)


def test_no_herding_on_hot_prefixes_while_the_hit_rate_stays_high() -> None:
    report, ideal = _hot_run("prefix_aware")
    assert report.max_mean_requests <= 1.15
    assert report.max_mean_in_flight <= 1.15
    # (the replicas' caches also hold running requests and generated text, which one
    # pooled prompt cache does not: a few points below it is the ceiling here)
    assert report.hit_rate >= 0.93 * ideal
    # The scenario is one where both failure modes are real:
    naive, _ = _hot_run(  # pure longest match: no bounds, no queue or share cost
        "prefix_aware",
        balance_factor=1e9,
        inflight_factor=1e9,
        inflight_slack=1e9,
        share_weight=0.0,
        miss_weight=1e9,
    )
    assert naive.max_mean_requests > 1.15  # herds
    blind, _ = _hot_run("least_outstanding")
    assert blind.hit_rate < 0.85 * report.hit_rate  # load-only routing loses the cache
    assert report.mean_ttft_s < blind.mean_ttft_s


def test_replay_is_deterministic() -> None:
    a, _ = _hot_run("prefix_aware")
    b, _ = _hot_run("prefix_aware")
    assert a.requests_per_replica == b.requests_per_replica and a.ttft_s == b.ttft_s


def test_a_replica_with_an_empty_queue_takes_new_conversations_from_queued_holders() -> None:
    # r0 and r1 hold a system prompt and their engines queue (full batches); r2 was just
    # ready: idle, empty queue. Pending prefill counts blocks, not the wait for a batch
    # slot, so the match alone kept every new conversation on the queued holders.
    p = PrefixAware(seed=0)
    rs = views(3)
    system = tuple(range(100, 140))
    for i, holder in enumerate(rs[:2]):
        p.choose(request(i, prefix_hashes=(*system, 900 + i)), [holder])
        p.on_first_token(request(i), holder)
    for r in rs[:2]:
        r.in_flight = 20
        r.stats = stats(running=16, waiting=4, at_scrape=20)
    rs[2].stats = stats()
    new = p.choose(request(5, prefix_hashes=(*system, 950)), rs)
    assert new is rs[2]
    # A conversation whose own history one of them holds stays there (moving would
    # recompute it), and without a scrape nothing is known of slots: the match decides.
    history = (*system, 900, 901, 902)
    assert p.choose(request(6, prefix_hashes=(*history, 7)), rs) is rs[0]
    rs[2].stats = None
    assert p.choose(request(7, prefix_hashes=(*system, 951)), rs) in rs[:2]
    # Off: the old rule.
    rs[2].stats = stats()
    off = PrefixAware(seed=0, idle_first=False)
    for i, holder in enumerate(rs[:2]):
        off.choose(request(i, prefix_hashes=(*system, 900 + i)), [holder])
        off.on_first_token(request(i), holder)
    assert off.choose(request(5, prefix_hashes=(*system, 950)), rs) in rs[:2]


@pytest.mark.parametrize("idle_first", [True, False])
def test_a_request_without_hashes_also_leaves_a_queued_engine_for_an_idle_one(
    idle_first: bool,
) -> None:
    p = PrefixAware(seed=0, idle_first=idle_first)
    rs = views(2, [4, 0])
    p.choose(request(0), [rs[1]])  # r1: one prefill of ours pending, one recent decision
    rs[1].in_flight = 1
    rs[0].stats = stats(running=4, waiting=3, at_scrape=4)  # a full batch and a queue
    rs[1].stats = stats(running=0, waiting=0, at_scrape=0)
    # By pending prefill and share r0 looks free; its engine says it queues.
    assert p.choose(request(1), rs) is (rs[1] if idle_first else rs[0])


def _background(p: PrefixAware, rs: list[ReplicaView], ahead: ReplicaView, extra: int) -> None:
    """Other decisions by a peer worker: 20 one-block prompts on each replica and `extra`
    more on `ahead`, so the prompts under test are rare and `ahead` is ahead on share."""
    for k in range(20):
        for r in rs:
            p.on_peer_routed(r.replica_id, (10_000 + 10 * k + int(r.replica_id[1:]),))
    for k in range(extra):
        p.on_peer_routed(ahead.replica_id, (20_000 + k,))


@pytest.mark.parametrize("floor", [0.25, 1.0])
def test_a_rare_one_shot_prefix_stays_with_its_holder_ahead_on_share(floor: float) -> None:
    # A share cost big enough to outweigh recomputing a 10-block prefix for a replica a
    # few decisions ahead of the mean, within the share bound. The prefix's prompts are
    # one-shot and rare (3 of ~50 decisions): moving one relieves one request and copies
    # the prefix; the holder pays the share cost scaled down (to rare_share_floor at most).
    p = PrefixAware(seed=0, share_weight=60.0, rare_share_floor=floor)
    rs = views(2)
    rare = tuple(range(100, 110))
    holder = p.choose(request(0, prefix_hashes=(*rare, 900)), rs)
    assert holder is not None
    p.on_first_token(request(0), holder)
    assert p.choose(request(1, prefix_hashes=(*rare, 901)), rs) is holder
    p.on_first_token(request(1), holder)
    _background(p, rs, holder, extra=4)
    again = p.choose(request(2, prefix_hashes=(*rare, 902)), rs)
    assert (again is holder) is (floor < 1.0)


def test_a_prefix_whose_prompts_start_conversations_is_balanced_as_before() -> None:
    # The same, but behind the prefix are conversations (a system prompt): a new prompt
    # starts one whose later turns follow it, so it moves, as with rare_share_floor=1.
    p = PrefixAware(seed=0, share_weight=60.0)
    rs = views(2)
    system = tuple(range(100, 110))
    turn1 = (*system, 900)
    holder = p.choose(request(0, prefix_hashes=turn1), rs)
    assert holder is not None
    p.on_first_token(request(0), holder)
    p.on_peer_routed(holder.replica_id, (*system, 950))  # (a second conversation)
    turn2 = (*turn1, 901)
    assert p.choose(request(1, prefix_hashes=turn2), rs) is holder
    p.on_first_token(request(1), holder)
    assert p.choose(request(2, prefix_hashes=(*turn2, 902)), rs) is holder
    p.on_first_token(request(2), holder)
    _background(p, rs, holder, extra=2)
    other = next(r for r in rs if r is not holder)
    assert p.choose(request(3, prefix_hashes=(*system, 903)), rs) is other


def test_rare_share_floor_is_validated() -> None:
    with pytest.raises(ValueError, match="rare_share_floor"):
        PrefixAware(rare_share_floor=1.5)
