"""Jumping over decode runs gives exactly what stepping one iteration at a time gives.

Seeded random workloads (mixed lengths, prefix sharing, preemption under small KV,
chunked prefill, PP > 1, stop tokens, aborts, arrivals in the middle of runs, LoRA adapters
over max_loras and runtime adapter loads) are driven
twice: once with `step()` only, once jumping with `plan_decode_run` / `run_decode` and
splitting a run wherever an arrival or abort falls into it. Every token id and token time,
every request's fate, the engine's counters and the block pool must be identical.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpufleet.engine import Engine, EngineConfig, EngineRequest, FinishReason
from gpufleet.engine.lora import AdapterSlots, LoraAdapter, LoraConfig
from gpufleet.engine.request import CountedOutputRequest, generate_tokens_for
from gpufleet.perf.lora import FixedLoraCost, LoraCost, lora_cost
from gpufleet.perf.roofline import RooflineStepTimeModel
from gpufleet.perf.step_time import LinearStepTimeModel, StepBatch, StepTimeModel
from gpufleet.plan.layout import Layout
from gpufleet.specs.catalog import load_model
from gpufleet.specs.gpus import load_gpu
from gpufleet.tokenizer import block_hashes


@dataclass(frozen=True)
class OnlyStepTime:
    """A step-time model without the decode fast path (the engine falls back to it)."""

    model: StepTimeModel

    def step_time_s(self, batch: StepBatch) -> float:
        return self.model.step_time_s(batch)


@dataclass
class Scenario:
    config: EngineConfig
    model: StepTimeModel
    events: list[tuple[float, str, Any]]  # (time, "add" | "abort" | "add_lora", payload)
    lora: tuple[LoraConfig, LoraCost] | None = None


@dataclass
class Record:
    tokens: dict[str, list[int]] = field(default_factory=dict)
    token_times: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    fates: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    snapshots: list[tuple[Any, ...]] = field(default_factory=list)
    requests: list[EngineRequest] = field(default_factory=list)
    jumps: int = 0
    jumped_steps: int = 0
    lora_jumps: int = 0  # runs jumped with adapters in the batch


ADAPTERS = [LoraAdapter(n, f"/adapters/{n}", rank=8) for n in ("a", "b", "c")]


def make_scenario(seed: int, lora: bool = False) -> Scenario:
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 4, 16])
    max_len = rng.choice([64, 128, 256])
    config = EngineConfig(
        num_gpu_blocks=-(-max_len // bs) * rng.choice([1, 2, 3, 8]),
        block_size=bs,
        max_num_seqs=rng.choice([2, 4, 8, 64]),
        max_num_batched_tokens=rng.choice([3, 6, 32, 64, 512]),
        max_model_len=max_len,
        pipeline_stages=rng.choice([1, 1, 2, 3]),
        enable_prefix_caching=rng.random() < 0.75,
        long_prefill_token_threshold=rng.choice([0, 0, 16]),
    )
    linear = LinearStepTimeModel(
        base_s=rng.uniform(0.001, 0.02),
        per_token_s=rng.uniform(0, 1e-4),
        # sometimes a micro-batch of one request takes less than half one of three
        per_seq_s=rng.choice([rng.uniform(0, 2e-3), rng.uniform(0.01, 0.03)]),
        per_context_token_s=rng.uniform(0, 1e-5),
    )
    kind = rng.choice(["linear", "linear", "roofline", "plain"])
    model: StepTimeModel = linear
    if kind == "roofline":
        layout = Layout(tp=1, pp=config.pipeline_stages, ep=1, weight_dtype="bf16", kv_dtype="bf16")
        model = RooflineStepTimeModel(
            load_model("meta-llama/Llama-3.1-8B"), load_gpu("h100-sxm"), layout
        )
    elif kind == "plain":
        model = OnlyStepTime(linear)
    bases = [
        [rng.randrange(100, 200) for _ in range(rng.randrange(1, 3 * bs + 8))] for _ in range(3)
    ]
    events: list[tuple[float, str, Any]] = []
    t = 0.0
    ids = []
    for i in range(rng.randrange(8, 30)):
        t += rng.expovariate(1 / 0.05) if rng.random() < 0.8 else 0.0  # some arrive together
        prompt = list(rng.choice(bases)) if rng.random() < 0.5 else []
        prompt += [rng.randrange(100, 200) for _ in range(rng.randrange(1, max_len // 2))]
        prompt = prompt[: max_len - 2]
        max_tokens = rng.randrange(1, 60)
        stop = rng.randrange(1, 40) if rng.random() < 0.2 else None
        seed_of = i
        if ids and rng.random() < 0.2:  # a repeat of an earlier request: the same tokens
            _, _, (_, prompt, _, _, seed_of) = rng.choice([e for e in events if e[1] == "add"])
        events.append((t, "add", (f"r{i}", prompt, max_tokens, stop, seed_of)))
        ids.append(f"r{i}")
    for _ in range(rng.randrange(0, 3)):
        events.append((rng.uniform(0, t + 1.0), "abort", rng.choice(ids)))
    events.sort(key=lambda e: e[0])
    if not lora:
        return Scenario(config, model, events)
    # LoRA from a stream of its own (the scenarios above stay as they were): adapters on
    # most requests, a runtime load or two, 1-2 GPU slots, fixed or roofline costs.
    lrng = random.Random(seed + 10_000)
    events = [
        (t, kind, (*p, lrng.choice([None, *ADAPTERS, *ADAPTERS])) if kind == "add" else p)
        for t, kind, p in events
    ]
    for _ in range(lrng.randrange(0, 3)):
        events.append((lrng.uniform(0, t + 0.5), "add_lora", lrng.choice(ADAPTERS)))
    events.sort(key=lambda e: e[0])
    cost: LoraCost = FixedLoraCost(
        load_fixed_s=lrng.uniform(0.01, 0.2), activate_fixed_s=lrng.uniform(0, 0.01),
        step_fixed_s=lrng.uniform(0, 1e-3), per_adapter_s=lrng.uniform(0, 1e-3),
    )  # fmt: skip
    if lrng.random() < 0.5:  # SGMV time that grows with the tokens
        cost = lora_cost(load_model("meta-llama/Llama-3.1-8B"), load_gpu("h100-sxm"))
    config_lora = LoraConfig(max_loras=lrng.choice([1, 2]), max_cpu_loras=lrng.choice([None, 3]))
    return Scenario(config, model, events, (config_lora, cost))


def apply_event(
    engine: Engine,
    event: tuple[float, str, Any],
    rec: Record,
    cls: type[EngineRequest] = EngineRequest,
) -> None:
    _, kind, payload = event
    if kind == "add_lora":
        engine.add_lora(payload, engine.now_s)
    elif kind == "add":
        rid, prompt, max_tokens, stop, seed, *adapter = payload
        lora = adapter[0] if adapter else None
        req = cls(rid, prompt, max_tokens, seed=seed, stop_after_tokens=stop, lora=lora)
        engine.add(req)
        rec.fates[rid] = ("pending",)
        rec.tokens[rid] = req.all_token_ids
        rec.requests.append(req)
    else:
        aborted = engine.abort(payload)
        if aborted is not None:
            rec.fates[payload] = ("aborted", aborted.finished_s, aborted.num_output_tokens)
    s = engine.stats
    rec.snapshots.append((s.num_running, s.num_waiting, s.now_s, engine.kv.fingerprint()))


def finish(engine: Engine, rec: Record, finished: list[EngineRequest]) -> None:
    for r in finished:
        assert r.finish_reason in (FinishReason.LENGTH, FinishReason.STOP)
        rec.fates[r.request_id] = (
            r.finish_reason,
            r.first_token_s,
            r.finished_s,
            r.num_preemptions,
            r.num_prefix_hit_tokens,
            r.first_scheduled_s,
        )


def drive(
    sc: Scenario, jump: bool, seed: int, cls: type[EngineRequest] = EngineRequest
) -> tuple[Record, Engine]:
    rng = random.Random(seed)
    slots = AdapterSlots(*sc.lora) if sc.lora else None
    engine = Engine(sc.config, sc.model, seed=3, lora=slots)
    rec = Record()
    events = sc.events
    i = 0
    while True:
        while i < len(events) and events[i][0] < engine.now_s:  # what came during the step
            apply_event(engine, events[i], rec, cls)
            i += 1
        if not engine.has_work:
            if i == len(events):
                break
            engine.advance_to(events[i][0])
            while i < len(events) and events[i][0] <= engine.now_s:
                apply_event(engine, events[i], rec, cls)
                i += 1
            continue
        run = engine.plan_decode_run(max_steps=rng.choice([None, None, 1, 3])) if jump else None
        if run is None:
            steps_before = engine.num_steps
            out = engine.step()
            assert engine.num_steps == steps_before + 1, "stepping made no progress"
            for r in out.emitted:
                rec.token_times[r.request_id].append(out.now_s)
            finish(engine, rec, out.finished)
            continue
        next_s = events[i][0] if i < len(events) else float("inf")
        steps = run.num_steps_started_by(next_s)
        assert steps >= 1
        usage = run.kv_cache_usage_after(steps) if steps < run.num_steps else None
        run_out = engine.run_decode(run, steps)
        if usage is not None:
            assert usage == engine.kv_cache_usage
        rec.jumps += 1
        rec.lora_jumps += bool(engine.lora and engine.lora.running)
        rec.jumped_steps += steps
        assert run_out.num_steps == steps and run_out.now_s == engine.now_s
        for j, end_s in enumerate(run_out.step_end_s):
            for r in run_out.step_emitted(j):
                rec.token_times[r.request_id].append(end_s)
        finish(engine, rec, run_out.finished)
    return rec, engine


def lora_state(engine: Engine) -> tuple[Any, ...] | None:
    s = engine.lora
    if s is None:
        return None
    return (s.gpu, s.cpu, dict(s.running), s.disk_loads, s.activations, s.admissions)


def state(r: EngineRequest) -> tuple[Any, ...]:
    return (r.status, r.in_flight, r.num_computed_tokens, r.num_output_tokens, r.block_hashes)


# 3973: a waiting request held back by KV whose cached prefix a running request (same
# prompt, same seed) extends during what would otherwise be a run.
@pytest.mark.parametrize(("seed", "lora"), [*((s, False) for s in [*range(60), 3973]),
                                           *((s, True) for s in range(30))])  # fmt: skip
def test_jumped_runs_equal_stepped_runs(seed: int, lora: bool) -> None:
    sc = make_scenario(seed, lora)
    stepped, stepped_engine = drive(sc, jump=False, seed=seed)
    jumped, jumped_engine = drive(sc, jump=True, seed=seed)
    assert jumped.tokens == stepped.tokens
    assert jumped.token_times == stepped.token_times  # exactly, not approximately
    assert jumped.fates == stepped.fates
    assert jumped.snapshots == stepped.snapshots
    assert jumped_engine.stats == stepped_engine.stats
    assert jumped_engine.kv.fingerprint() == stepped_engine.kv.fingerprint()
    assert lora_state(jumped_engine) == lora_state(stepped_engine)
    assert [state(r) for r in jumped.requests] == [state(r) for r in stepped.requests]
    prompts = {e[2][0]: e[2][1] for e in sc.events if e[1] == "add"}
    for rid, tokens in stepped.tokens.items():  # one time per generated token
        assert len(stepped.token_times[rid]) == len(tokens) - len(prompts[rid])


def without_hashes(snapshot: tuple[Any, ...]) -> tuple[Any, ...]:
    """A snapshot's counts, clock, which free blocks hold a cached hash (in eviction order)
    and the cached blocks' references; not under which hash values."""
    *head, (free, cached) = snapshot
    return (*head, [h is None for h in free], sorted(refs for _, refs in cached))


@pytest.mark.parametrize("seed", [*range(40), 3973])
def test_counted_output_requests_jump_exactly_and_schedule_as_token_ids_do(seed: int) -> None:
    """Answers whose token ids are placeholders (the simulator's) jump exactly as they step,
    and give the very schedule that seeded token ids give: the same token times, fates,
    prefix hits and blocks (only the hash values of answer blocks differ)."""
    sc = make_scenario(seed)
    real, real_engine = drive(sc, jump=False, seed=seed)
    stepped, stepped_engine = drive(sc, jump=False, seed=seed, cls=CountedOutputRequest)
    jumped, jumped_engine = drive(sc, jump=True, seed=seed, cls=CountedOutputRequest)
    assert jumped.tokens == stepped.tokens
    assert jumped.token_times == stepped.token_times
    assert jumped.fates == stepped.fates
    assert jumped.snapshots == stepped.snapshots
    assert jumped_engine.stats == stepped_engine.stats
    assert [state(r) for r in jumped.requests] == [state(r) for r in stepped.requests]
    assert stepped.token_times == real.token_times
    assert stepped.fates == real.fates
    assert stepped_engine.stats == real_engine.stats
    assert [without_hashes(s) for s in stepped.snapshots] == [
        without_hashes(s) for s in real.snapshots
    ]


def test_the_random_workloads_jump_preempt_and_pipeline() -> None:
    """The comparison above is only worth something if the jumps happen in all the
    situations it claims to cover."""
    seen: dict[str, int] = defaultdict(int)
    for seed in range(60):
        sc = make_scenario(seed)
        rec, engine = drive(sc, jump=True, seed=seed)
        seen["jumped_steps"] += rec.jumped_steps
        seen["steps"] += engine.stats.num_steps
        if rec.jumps and sc.config.pipeline_stages > 1:
            seen["pipelined"] += 1
        if rec.jumps and engine.stats.num_preemptions:
            seen["preempting"] += 1
        if rec.jumps and engine.stats.prefix_cache_hits_tokens:
            seen["prefix_hits"] += 1
    assert seen["jumped_steps"] > 0.4 * seen["steps"]
    assert seen["pipelined"] >= 5 and seen["preempting"] >= 5 and seen["prefix_hits"] >= 5


def test_lora_workloads_jump_with_adapters_running_and_requests_skipped() -> None:
    jumped = steps = skipping = lora_jumps = 0
    for seed in range(30):
        sc = make_scenario(seed, lora=True)
        rec, engine = drive(sc, jump=True, seed=seed)
        jumped += rec.jumped_steps
        lora_jumps += rec.lora_jumps
        steps += engine.stats.num_steps
        assert engine.lora is not None and engine.lora.admissions > 0
        first = {r.request_id: r.first_scheduled_s for r in rec.requests}
        arrival = {r.request_id: r.arrival_s for r in rec.requests}
        order = sorted(first, key=lambda rid: (arrival[rid] or 0.0, int(rid[1:])))
        starts = [first[rid] for rid in order if first[rid] is not None]
        skipping += starts != sorted(starts)  # someone passed a request held by max_loras
    assert jumped > 0.2 * steps and lora_jumps > 100 and skipping >= 3


@pytest.mark.parametrize("n", [1, 5, 47, 48, 1000])
def test_generating_tokens_in_bulk_equals_one_by_one(n: int) -> None:
    bulk = [EngineRequest(f"a{i}", [1], 10, seed=987654321 + i) for i in range(3)]
    single = [EngineRequest(f"b{i}", [1], 10, seed=987654321 + i) for i in range(3)]
    bulk[0].generate_tokens(n)
    generate_tokens_for(bulk[1:], n)
    for r in bulk:
        r.generate_tokens(3)
    for r in single:
        for _ in range(n + 3):
            r.all_token_ids.append(r.next_token_id())
    assert [r.all_token_ids for r in bulk] == [r.all_token_ids for r in single]


def test_block_hashes_extend_as_the_tokenizer_chains_them() -> None:
    rng = random.Random(1)
    tokens = [rng.randrange(100, 200) for _ in range(100)]
    req = EngineRequest("h", tokens[:40], 10)
    req.extend_block_hashes(16, max_blocks=1)
    assert req.block_hashes == block_hashes(tokens[:16], 16)
    req.all_token_ids.extend(tokens[40:])
    req.extend_block_hashes(16)
    assert req.block_hashes == block_hashes(tokens, 16)  # 6 full blocks of 100 tokens
