"""A `CountedOutputRequest` holds its tokens virtually (its prompt and a count of answer
tokens); everything read from it must be what a grown list of placeholders would give."""

from __future__ import annotations

import pytest

from gpufleet.engine import Engine, EngineConfig, EngineRequest
from gpufleet.engine.request import (
    COUNTED_TOKEN,
    CountedOutputRequest,
    counted_tokens,
    generate_tokens_for,
    span_tokens,
)
from gpufleet.perf.step_time import LinearStepTimeModel
from gpufleet.tokenizer import block_hashes

MODEL = LinearStepTimeModel(base_s=0.01, per_token_s=1e-4, per_context_token_s=1e-6)


def test_a_counted_request_owns_its_prompt_only_when_handed_it() -> None:
    prompt = [7] * 40
    held = CountedOutputRequest("a", prompt, 10, copy=False)
    copied = CountedOutputRequest("b", prompt, 10)
    assert held.prompt_token_ids is prompt
    assert copied.prompt_token_ids is not prompt and copied.prompt_token_ids == prompt
    assert EngineRequest("c", prompt, 10).all_token_ids is not prompt


def test_decoding_grows_no_list_and_reads_as_placeholders() -> None:
    prompt = [5] * 37
    req = CountedOutputRequest("a", prompt, 50, seed=3, copy=False)
    req.num_output_tokens += 9  # (the engine advances the count, then generates)
    generate_tokens_for([req], 9)
    req.generate_tokens(4)  # (no-op: counted by num_output_tokens)
    assert prompt == [5] * 37  # the caller's list is never grown
    assert req.all_token_ids == [5] * 37 + counted_tokens(9)
    assert req.output_token_ids == counted_tokens(9)
    assert req.num_tokens == 46 == len(req.all_token_ids)


@pytest.mark.parametrize("jump", [False, True])
def test_an_engine_run_reads_the_same_tokens_and_hashes(jump: bool) -> None:
    """Through the engine (stepped and jumped), a counted request ends with the prompt
    untouched, the answer's count as tokens, and block hashes over the prompt's blocks
    that are those of its token ids."""
    cfg = EngineConfig(num_gpu_blocks=512, max_model_len=4096, max_num_seqs=8)
    engine = Engine(cfg, MODEL, seed=1)
    prompts = [[100 + i] * (50 + 17 * i) for i in range(4)]
    reqs = [
        CountedOutputRequest(f"r{i}", p, 30 + 11 * i, copy=False) for i, p in enumerate(prompts)
    ]
    for r in reqs:
        engine.add(r)
    jumps = 0
    while engine.has_work:
        run = engine.plan_decode_run() if jump else None
        if run is None:
            engine.step()
        else:
            engine.run_decode(run)
            jumps += 1
    assert (jumps > 0) is jump
    bs = cfg.block_size
    for r, p in zip(reqs, prompts, strict=True):
        assert r.is_finished and r.num_output_tokens == r.max_tokens
        assert r.prompt_token_ids is p and len(p) == r.num_prompt_tokens
        assert r.all_token_ids == p + counted_tokens(r.max_tokens)
        assert r.block_hashes[: len(p) // bs] == block_hashes(p, bs)


def test_a_prompt_given_as_spans_reads_and_schedules_as_its_ids() -> None:
    """`of_spans` (the simulator's prompts: placeholders and earlier answers) stands for the
    very ids `span_tokens` builds: the same tokens, hashes and schedule through an engine."""
    spans_of = [((0, 40),), ((0, 33), (COUNTED_TOKEN, 20), (0, 0), (0, 51)), ((9, 1),)]
    ends = []
    for as_spans in (False, True):
        engine = Engine(EngineConfig(num_gpu_blocks=256, max_model_len=2048), MODEL, seed=2)
        reqs = [
            CountedOutputRequest.of_spans(f"r{i}", s, 25)
            if as_spans
            else CountedOutputRequest(f"r{i}", span_tokens(s), 25)
            for i, s in enumerate(spans_of)
        ]
        for r in reqs:
            engine.add(r)
        while engine.has_work:
            engine.step()
        ends.append([(r.all_token_ids, r.block_hashes, r.finished_s) for r in reqs])
        for r, s in zip(reqs, spans_of, strict=True):
            assert r.num_prompt_tokens == len(span_tokens(s))
            assert span_tokens(r.prompt_spans) == span_tokens(s)
    assert ends[0] == ends[1]
    with pytest.raises(ValueError):
        CountedOutputRequest.of_spans("empty", ((0, 0),), 5)
