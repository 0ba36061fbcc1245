"""The engine model, driven offline (no clock, no timing asserts): vLLM v1 behaviour."""

from __future__ import annotations

import pytest

from gpufleet.engine import Engine, EngineConfig, EngineRequest, FinishReason, RequestStatus
from gpufleet.perf.step_time import LinearStepTimeModel
from gpufleet.tokenizer import default_tokenizer

MODEL = LinearStepTimeModel(base_s=0.01, per_token_s=1e-4, per_context_token_s=1e-6)


def make_engine(**overrides: int) -> Engine:
    cfg = dict(
        num_gpu_blocks=4096, max_model_len=4096, max_num_seqs=64, max_num_batched_tokens=2048
    )
    cfg.update(overrides)
    return Engine(EngineConfig(**cfg), MODEL, seed=7)


def prompt(seed: int, n: int) -> list[int]:
    return default_tokenizer().word_ids_for_seed(seed, n)


def run_to_completion(engine: Engine, max_steps: int = 100_000) -> list[EngineRequest]:
    finished = []
    for _ in range(max_steps):
        if not engine.has_work:
            return finished
        finished.extend(engine.step().finished)
    raise AssertionError("engine did not drain")


def mean_ttft_s(reqs: list[EngineRequest]) -> float:
    ttfts = [r.first_token_s - r.arrival_s for r in reqs]  # type: ignore[operator]
    return sum(ttfts) / len(ttfts)


def test_single_request_prefill_then_one_token_per_step() -> None:
    engine = make_engine()
    req = EngineRequest("a", prompt(1, 100), max_tokens=5)
    engine.add(req)
    first = engine.step()
    assert first.emitted == [req]  # the prefill step yields the first token
    assert first.duration_s == pytest.approx(0.01 + 100e-4 + 100e-6)
    durations = []
    while engine.has_work:
        out = engine.step()
        assert out.emitted == [req]
        durations.append(out.duration_s)
    assert req.num_output_tokens == 5 and len(durations) == 4
    assert req.finish_reason is FinishReason.LENGTH
    assert engine.stats.generation_tokens == 5 and engine.stats.prompt_tokens == 100
    assert engine.stats.kv_cache_usage == 0.0  # everything freed


def test_chunked_prefill_respects_token_budget() -> None:
    engine = make_engine(max_num_batched_tokens=256)
    req = EngineRequest("long", prompt(2, 1000), max_tokens=2)
    engine.add(req)
    steps_until_first = 0
    while req.num_output_tokens == 0:
        out = engine.step()
        assert out.num_scheduled_tokens <= 256
        steps_until_first += 1
    assert steps_until_first == 4  # ceil(1000 / 256)


def test_max_num_seqs_bounds_running_and_grows_waiting() -> None:
    engine = make_engine(max_num_seqs=8)
    for i in range(20):
        engine.add(EngineRequest(f"r{i}", prompt(i, 50), max_tokens=50))
    engine.step()
    s = engine.stats
    assert s.num_running == 8 and s.num_waiting == 12


def test_saturation_past_max_num_seqs_raises_ttft() -> None:
    def ttft_for(n: int) -> float:
        engine = make_engine(max_num_seqs=16)
        reqs = [EngineRequest(f"r{i}", prompt(i, 64), max_tokens=64) for i in range(n)]
        for r in reqs:
            engine.add(r)
        run_to_completion(engine)
        return mean_ttft_s(reqs)

    assert ttft_for(64) > 2 * ttft_for(16)


def test_kv_pressure_preempts_newest_and_usage_nears_one() -> None:
    # 64 blocks of 16 tokens = 1024 tokens of KV for requests wanting 100 + 200 tokens each.
    engine = make_engine(num_gpu_blocks=64, max_model_len=1024)
    reqs = [EngineRequest(f"r{i}", prompt(i, 100), max_tokens=200) for i in range(12)]
    for r in reqs:
        engine.add(r)
    peak_usage = 0.0
    preempted_ids: list[str] = []
    while engine.has_work:
        out = engine.step()
        peak_usage = max(peak_usage, engine.stats.kv_cache_usage)
        preempted_ids += [r.request_id for r in out.preempted]
    assert peak_usage > 0.95
    assert engine.stats.num_preemptions > 0 and preempted_ids
    # the newest running request is preempted first: never the oldest one
    assert "r0" not in preempted_ids
    assert all(r.num_output_tokens == 200 for r in reqs)  # recompute, nothing lost
    assert engine.stats.kv_cache_usage == 0.0


def test_preemption_raises_ttft_compared_with_ample_kv() -> None:
    def run(num_blocks: int) -> tuple[float, int]:
        engine = make_engine(num_gpu_blocks=num_blocks, max_model_len=1024)
        reqs = [EngineRequest(f"r{i}", prompt(i, 100), max_tokens=200) for i in range(24)]
        for r in reqs:
            engine.add(r)
        run_to_completion(engine)
        return mean_ttft_s(reqs), engine.stats.num_preemptions

    tight_ttft, tight_preemptions = run(64)
    ample_ttft, ample_preemptions = run(4096)
    assert ample_preemptions == 0 and tight_preemptions > 0
    assert tight_ttft > ample_ttft


def test_shared_prefix_hits_cache_and_lowers_ttft() -> None:
    system = prompt(99, 512)

    def run(shared: bool) -> tuple[float, int, int]:
        engine = make_engine(max_num_batched_tokens=512)
        reqs = []
        for i in range(8):
            head = system if shared else prompt(1000 + i, 512)
            reqs.append(EngineRequest(f"r{i}", head + prompt(i, 32), max_tokens=4))
        for r in reqs:
            engine.add(r)
            # arrive one after another so earlier prefixes are cached by the time
            while engine.has_work:
                engine.step()
        s = engine.stats
        return mean_ttft_s(reqs), s.prefix_cache_hits_tokens, s.prefix_cache_queries_tokens

    shared_ttft, shared_hits, shared_queries = run(True)
    cold_ttft, cold_hits, _ = run(False)
    assert shared_hits == 7 * 512  # every later request reuses the 32 full blocks
    assert shared_queries == 8 * 544
    assert cold_hits == 0
    assert shared_ttft < cold_ttft


def test_cached_prefix_survives_finish_and_is_evicted_lru() -> None:
    engine = make_engine(num_gpu_blocks=300, max_model_len=1024)
    a = prompt(1, 320)  # 20 blocks
    engine.add(EngineRequest("a", a, max_tokens=1))
    run_to_completion(engine)
    engine.add(EngineRequest("a2", a, max_tokens=1))
    run_to_completion(engine)
    assert engine.get("a2") is None
    assert engine.stats.prefix_cache_hits_tokens == 304  # 19 blocks; the last token recomputed
    # Fill the whole cache with other prompts: a's blocks are evicted (least recently used).
    for i in range(20):
        engine.add(EngineRequest(f"f{i}", prompt(100 + i, 320), max_tokens=1))
        run_to_completion(engine)
    hits_before = engine.stats.prefix_cache_hits_tokens
    engine.add(EngineRequest("a3", a, max_tokens=1))
    run_to_completion(engine)
    assert engine.stats.prefix_cache_hits_tokens == hits_before


def test_abort_frees_blocks_at_once() -> None:
    engine = make_engine()
    engine.add(EngineRequest("x", prompt(3, 200), max_tokens=100))
    engine.step()
    assert engine.stats.kv_cache_usage > 0
    aborted = engine.abort("x")
    assert aborted is not None and aborted.status is RequestStatus.ABORTED
    assert engine.stats.kv_cache_usage == 0 and not engine.has_work
    assert engine.stats.finished_by_reason["abort"] == 1
    assert engine.abort("x") is None


def test_outputs_are_deterministic_for_a_seed() -> None:
    def outputs(seed: int) -> list[list[int]]:
        engine = Engine(EngineConfig(num_gpu_blocks=1000, max_model_len=2048), MODEL, seed=seed)
        reqs = [EngineRequest(f"r{i}", prompt(i, 30), max_tokens=10) for i in range(3)]
        for r in reqs:
            engine.add(r)
        run_to_completion(engine)
        return [r.output_token_ids for r in reqs]

    assert outputs(1) == outputs(1)
    assert outputs(1) != outputs(2)
    tok = default_tokenizer()
    for ids in outputs(1):
        assert tok.encode(tok.decode(ids)) == ids  # generated text re-tokenizes exactly


def test_natural_stop_and_max_model_len() -> None:
    engine = make_engine(max_model_len=64, num_gpu_blocks=64)
    stop = EngineRequest("s", prompt(1, 10), max_tokens=40, stop_after_tokens=7)
    capped = EngineRequest("c", prompt(2, 40), max_tokens=1000)
    engine.add(stop)
    engine.add(capped)
    run_to_completion(engine)
    assert stop.finish_reason is FinishReason.STOP and stop.num_output_tokens == 7
    assert capped.finish_reason is FinishReason.LENGTH and capped.num_tokens == 64


def test_pipeline_parallel_lone_request_pays_whole_pipeline_loaded_fills_bubble() -> None:
    flat = LinearStepTimeModel(base_s=0.04)

    def tpot(pp: int, n: int) -> float:
        engine = Engine(EngineConfig(num_gpu_blocks=4096, pipeline_stages=pp), flat)
        reqs = [EngineRequest(f"r{i}", prompt(i, 16), max_tokens=50) for i in range(n)]
        for r in reqs:
            engine.add(r)
        while engine.has_work:
            engine.step()
        total = sum(r.finished_s - r.first_token_s for r in reqs)  # type: ignore[operator]
        return total / (49 * n)

    assert tpot(4, 1) == pytest.approx(0.04)  # a lone request waits for the whole pipeline
    assert tpot(1, 8) == pytest.approx(0.04)
    # Loaded, a micro-batch leaves the pipeline every 0.04 / 4 s: the bubble is filled.
    engine = Engine(EngineConfig(num_gpu_blocks=4096, pipeline_stages=4), flat)
    for i in range(8):
        engine.add(EngineRequest(f"q{i}", prompt(i, 16), max_tokens=50))
    durations = []
    tokens = 0
    while engine.has_work:
        out = engine.step()
        durations.append(out.duration_s)
        tokens += len(out.emitted)
    assert tokens == 400
    steady = durations[4:-4]
    assert steady and all(d == pytest.approx(0.01) for d in steady)


def test_bad_config_and_requests_are_refused() -> None:
    with pytest.raises(ValueError, match="max_model_len"):
        EngineConfig(num_gpu_blocks=2, max_model_len=1000)
    engine = make_engine(max_model_len=128)
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add(EngineRequest("big", prompt(1, 200), max_tokens=1))
    engine.add(EngineRequest("dup", prompt(1, 10), max_tokens=1))
    with pytest.raises(ValueError, match="already"):
        engine.add(EngineRequest("dup", prompt(1, 10), max_tokens=1))


def test_abort_reason_is_counted() -> None:
    engine = make_engine()
    engine.add(EngineRequest("s", prompt(5, 20), max_tokens=50))
    engine.step()
    engine.abort("s", FinishReason.STOP)  # the server matched a stop string
    assert engine.stats.finished_by_reason == {"length": 0, "stop": 1, "abort": 0}
