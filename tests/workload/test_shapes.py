"""One workload model: same spec and seed -> the same shapes, as text (bench) or for sim."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from gpufleet.bench.config import BenchConfig
from gpufleet.bench.runner import build_conversations
from gpufleet.bench.runner import workload_spec as bench_spec
from gpufleet.sim.scenario import Scenario, build_requests
from gpufleet.sim.scenario import workload_spec as sim_spec
from gpufleet.tokenizer import Tokenizer, block_hashes
from gpufleet.workload import (
    KIND_UNIQUE,
    Conversation,
    LengthSampler,
    SimRequest,
    WorkloadSpec,
    common_prefix_tokens,
    read_trace,
    sim_requests,
    synthetic_shapes,
    text_conversations,
    trace_shapes,
)
from gpufleet.workload.segments import named_key


def texts(spec: WorkloadSpec) -> list[Conversation]:
    return list(text_conversations(synthetic_shapes(spec)))


def test_random_prompts_have_exact_token_counts_and_are_unique() -> None:
    spec = WorkloadSpec(20, input_tokens=64, output_tokens=16, range_ratio=0.5, seed=7)
    convs = texts(spec)
    tok = Tokenizer()
    for c in convs:
        (turn,) = c.turns
        assert len(tok.encode(turn.text)) == turn.input_tokens
        assert 32 <= turn.input_tokens <= 96 and 8 <= turn.output_tokens <= 24
    assert len({c.turns[0].text for c in convs}) == 20
    assert texts(spec) == convs  # deterministic in the seed
    assert texts(WorkloadSpec(20, input_tokens=64, output_tokens=16, range_ratio=0.5)) != convs


def test_range_ratio_zero_is_exact_and_bounds_are_vllms() -> None:
    exact = LengthSampler(100, 0.0, random.Random(0))
    assert [exact.draw() for _ in range(5)] == [100] * 5
    wide = LengthSampler(100, 0.2, random.Random(0))
    xs = [wide.draw() for _ in range(2000)]
    assert min(xs) == 80 and max(xs) == 120
    with pytest.raises(ValueError):
        LengthSampler(10, 1.0, random.Random(0))


def test_lengths_are_the_draws_of_randint() -> None:
    """The sampler skips randint's argument checks; its lengths stay randint's exactly
    (the workloads of every seed so far depend on it)."""
    for mean, ratio in ((100, 0.2), (600, 0.9), (3, 0.5), (1 << 20, 0.99)):
        sampler = LengthSampler(mean, ratio, random.Random(7))
        ref = random.Random(7)
        want = [ref.randint(sampler.low, sampler.high) for _ in range(500)]
        assert [sampler.draw() for _ in range(500)] == want


def test_session_turns_keep_their_named_keys() -> None:
    """A session's turns are keyed as named_key("session", seed, i, k) always was."""
    spec = WorkloadSpec(3, input_tokens=50, output_tokens=5, sessions=True, turns=2, seed=4)
    for shape in synthetic_shapes(spec):
        for k, turn in enumerate(shape.turns):
            ((key, _),) = turn.segments
            assert key == named_key(KIND_UNIQUE, "session", 4, shape.id, k)


def test_prefix_groups_share_exactly_their_prefix() -> None:
    spec = WorkloadSpec(8, prefix_groups=2, prefix_tokens=40, input_tokens=10, output_tokens=4)
    convs = texts(spec)
    words = [c.turns[0].text.split() for c in convs]
    assert [c.prefix_group for c in convs] == [0, 1] * 4
    assert all(len(w) == 50 == c.turns[0].input_tokens for w, c in zip(words, convs, strict=True))
    assert words[0][:40] == words[2][:40] == words[6][:40]
    assert words[0][:40] != words[1][:40]
    assert words[0][40:] != words[2][40:]  # unique suffixes


def test_sessions_have_turns_with_exact_counts() -> None:
    convs = texts(WorkloadSpec(3, sessions=True, turns=4, input_tokens=12, output_tokens=5))
    assert len(convs) == 3 and all(len(c.turns) == 4 for c in convs)
    assert all(len(t.text.split()) == 12 for c in convs for t in c.turns)


def test_mooncake_hash_ids_become_shared_blocks() -> None:
    recs = read_trace("sample:mooncake", limit=5)
    convs = list(text_conversations(trace_shapes(recs, speedup=2.0)))
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


def _common_words(a: list[str], b: list[str]) -> int:
    pairs = zip(a, b, strict=False)
    return sum(1 for _ in itertools.takewhile(lambda p: p[0] == p[1], pairs))


def test_text_shares_exactly_what_the_segments_share() -> None:
    """What the simulator hashes (segments) and what a live replica sees (words) agree on
    every pair's shared prefix, for prefix groups and for a trace's blocks."""
    group_shapes = list(synthetic_shapes(WorkloadSpec(12, prefix_groups=3, prefix_tokens=70)))
    trace = list(trace_shapes(read_trace("sample:mooncake", limit=30)))
    for shapes in (group_shapes, trace):
        words = [c.turns[0].text.split() for c in text_conversations(shapes)]
        for i, j in itertools.combinations(range(len(shapes)), 2):
            a, b = shapes[i].turns[0], shapes[j].turns[0]
            shared = common_prefix_tokens(a.segments, b.segments)
            assert _common_words(words[i], words[j]) == shared, (i, j)


# The same workload through `gpufleet bench`'s flags and `gpufleet sim`'s flags.
SAME_FLAGS = [
    dict(rate=5.0, num_requests=40, input_tokens=300, output_tokens=30, range_ratio=0.5),
    dict(rate=2.0, burstiness=0.5, num_requests=30, prefix_groups=4, prefix_tokens=256,
         input_tokens=50, output_tokens=20, range_ratio=0.3),
    dict(rate=1.0, sessions=6, turns=3, input_tokens=40, output_tokens=10, range_ratio=0.9),
    dict(rate=3.0, duration_s=20.0, input_tokens=100, output_tokens=50, range_ratio=0.2),
]  # fmt: skip


@pytest.mark.parametrize("flags", SAME_FLAGS, ids=["random", "prefix", "sessions", "timed"])
@pytest.mark.parametrize("seed", [0, 11])
def test_bench_and_sim_send_the_same_shapes_at_the_same_times(
    flags: dict[str, float], seed: int
) -> None:
    config = BenchConfig(url="http://127.0.0.1:1", seed=seed, **flags).validate()  # type: ignore[arg-type]
    scenario = Scenario(seed=seed, **flags)  # type: ignore[arg-type]
    assert bench_spec(config) == sim_spec(scenario)
    convs, _ = build_conversations(config)
    live = list(convs)
    sim = build_requests(scenario)
    assert len(sim) == sum(len(c.turns) for c in live) > 0
    by_turn = iter(sim)
    for conv in live:
        prev: SimRequest | None = None
        for turn in conv.turns:
            req = next(by_turn)
            assert req.arrival_s == conv.arrival_s
            assert req.prefix_group == conv.prefix_group
            assert req.output_tokens == turn.output_tokens
            assert len(turn.text.split()) == turn.input_tokens
            # a session's turn k+1 resends turn k and its answer, then the new text
            resent = prev.input_tokens + prev.output_tokens if prev else 0
            assert req.input_tokens == resent + turn.input_tokens
            assert req.after == (prev.index if prev else None)
            prev = req
    if "duration_s" in flags:  # a timed run: arrivals until the deadline, not rescaled
        arrivals = [c.arrival_s or 0.0 for c in live]
        assert max(arrivals) < flags["duration_s"] and len(live) > flags["rate"] * 10


def test_rate_inf_starts_everything_at_once_and_ramps_need_a_count() -> None:
    shapes = list(synthetic_shapes(WorkloadSpec(5, input_tokens=8, output_tokens=2)))
    assert [s.arrival_s for s in shapes] == [0.0] * 5
    with pytest.raises(ValueError, match="ramp"):
        next(synthetic_shapes(WorkloadSpec(None, rate=1.0, ramp=(1.0, 2.0))))
    with pytest.raises(ValueError, match="input_tokens"):
        next(synthetic_shapes(WorkloadSpec(3, input_tokens=0)))
    assert math.isinf(WorkloadSpec().rate)


def test_render_keeps_a_sessions_turns_in_order() -> None:
    shapes = list(synthetic_shapes(WorkloadSpec(2, sessions=True, turns=3, input_tokens=5)))
    reqs = sim_requests(shapes)
    assert [r.after for r in reqs] == [None, 0, 1, None, 3, 4]
    assert {r.session_key for r in reqs[:3]} == {"session-0"}
    # turn 2 starts with all of turn 1 (its text and an answer of its length)
    assert common_prefix_tokens(reqs[0].segments, reqs[1].segments) == 5
    assert reqs[1].input_tokens == 5 + 128 + 5


def test_bench_and_sim_replay_a_trace_with_the_same_shapes() -> None:
    config = BenchConfig(url="http://127.0.0.1:1", trace="sample:mooncake", num_requests=30)
    convs, planned = build_conversations(config.validate())
    live = list(convs)
    sim = build_requests(Scenario(trace="sample:mooncake", num_requests=30))
    assert planned == len(live) == len(sim) == 30
    assert live[0].turns[0].input_tokens == 6758  # the trace's first request
    for conv, req in zip(live, sim, strict=True):
        assert (conv.arrival_s, conv.turns[0].input_tokens, conv.turns[0].output_tokens) == (
            req.arrival_s,
            req.input_tokens,
            req.output_tokens,
        )
