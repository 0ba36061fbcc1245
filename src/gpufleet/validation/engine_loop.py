"""Closed-loop serving measured by running the real engine on virtual time.

The analytic solver in `perf_serving` approximates the closed loop with mean values; here
the loop is played out: `concurrency` clients, each sending a prompt of `input_tokens`,
reading `output_tokens` tokens and sending its next prompt (after `think_s`), against
`gpufleet.engine.Engine` (vLLM v1 continuous batching, chunked prefill, paged KV) whose
iterations take `step_time_s` of a step-time model. Means are taken the way the serving
benchmarks take them: TTFT from a request's arrival to its first token, TPOT as the gap
between consecutive tokens of a request.

Two measurements, both cheap in engine iterations:

* Steady state. Clients start desynchronized: at time 0 each holds a request already at a
  uniformly spread point of its decode (a prompt of input_tokens + g tokens, g of its
  output done, output_tokens - g to go), so completions, and with them new prompts, are
  spread evenly from the start instead of after one whole request lifetime. That first
  burst is the warm-up and is not measured; requests arriving after it are, until
  `target_arrivals` of them have their first token (or the iteration cap is reached).
* First wave. All clients send their first prompt at once (what a benchmark run starts
  with): the mean TTFT of that wave, which the benchmark's mean mixes in.

Simulated work after the warm-up is bounded by `max_request_steps` (sum over iterations of
the requests in the batch), so a row costs at most a fraction of a second of CPU however
long its outputs; the warm-up burst costs about concurrency x (input + output / 2) tokens
of prefill.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass

from gpufleet.engine import Arrivals, Engine, EngineConfig, EngineDriver, EngineRequest, run_virtual
from gpufleet.perf.step_time import StepBatch, StepTimeModel

_BLOCK_SIZE = 16
_TOKEN_ID = 7  # prompt content is irrelevant with the prefix cache off


@dataclass(frozen=True, slots=True)
class EngineLoopResult:
    """Means measured on the simulated engine (no per-request overhead added)."""

    ttft_s: float  # steady state, mean over measured arrivals
    tpot_s: float  # steady state, mean gap between consecutive tokens of a request
    first_wave_ttft_s: float  # mean TTFT of `concurrency` prompts sent at once
    measured_requests: int
    engine_steps: int
    request_steps: int


@dataclass(frozen=True, slots=True)
class SeparatePrefillStepModel:
    """A step-time model seen by an engine that runs prefill batches as iterations of their
    own (SGLang's default): an iteration holding both prefill chunks and decodes costs a
    prefill-only iteration plus a decode-only one, as the decodes wait for the prefill."""

    model: StepTimeModel
    pipeline_stages: int = 1

    def step_time_s(self, batch: StepBatch) -> float:
        if not batch.prefill_tokens or not batch.num_decode:
            return self.model.step_time_s(batch)
        prefill = StepBatch(
            prefill_tokens=batch.prefill_tokens,
            prefill_context_tokens=batch.prefill_context_tokens,
        )
        decode = StepBatch(
            num_decode=batch.num_decode, decode_context_tokens=batch.decode_context_tokens
        )
        return self.model.step_time_s(prefill) + self.model.step_time_s(decode)


def simulate_closed_loop(
    model: StepTimeModel,
    input_tokens: int,
    output_tokens: int,
    concurrency: int,
    *,
    max_num_batched_tokens: int = 8192,
    max_running: int | None = None,
    mixed_prefill: bool = True,
    think_s: float = 0.0,
    target_arrivals: int | None = None,
    max_request_steps: int = 20_000,
    first_wave: bool = True,
    seed: int = 0,
) -> EngineLoopResult:
    """Play out the closed loop on the engine; see the module docstring.

    max_running: requests the engine runs at once (max_num_seqs, or what the KV cache
    holds); clients beyond it wait in the engine's queue. think_s: time between a
    request's end and the client's next prompt (per-request time spent outside the engine).
    target_arrivals: steady-state requests to measure (default: enough for a stable mean
    within the iteration cap, at least 8, at most 4 x concurrency).
    """
    if input_tokens < 1 or output_tokens < 1 or concurrency < 1:
        raise ValueError("input_tokens, output_tokens and concurrency must be >= 1")
    isl, osl, c = input_tokens, output_tokens, concurrency
    running_cap = max(1, min(c, max_running or c))
    stages = max(1, int(getattr(model, "pipeline_stages", 1)))
    engine_model: StepTimeModel = (
        model if mixed_prefill else SeparatePrefillStepModel(model, pipeline_stages=stages)
    )
    blocks_per_request = math.ceil((isl + osl + 1) / _BLOCK_SIZE)
    config = EngineConfig(
        num_gpu_blocks=running_cap * blocks_per_request + 2 * stages + 8,
        block_size=_BLOCK_SIZE,
        max_num_seqs=running_cap,
        max_num_batched_tokens=max(1, max_num_batched_tokens),
        max_model_len=isl + osl + 1,
        pipeline_stages=stages,
        enable_prefix_caching=False,
    )
    if target_arrivals is None:
        target_arrivals = max(8, min(4 * c, max_request_steps // (2 * osl)))
    steady = _steady_state(
        Engine(config, engine_model, seed=seed),
        isl,
        osl,
        c,
        think_s=think_s,
        target_arrivals=target_arrivals,
        max_request_steps=max_request_steps,
        seed=seed,
    )
    wave_ttft_s = steady[0]
    if first_wave:
        wave_ttft_s = _first_wave_ttft_s(
            Engine(config, engine_model, seed=seed), isl, osl, c, max_request_steps
        )
    ttft_s, tpot_s, measured, steps, request_steps = steady
    return EngineLoopResult(
        ttft_s=ttft_s,
        tpot_s=tpot_s,
        first_wave_ttft_s=wave_ttft_s,
        measured_requests=measured,
        engine_steps=steps,
        request_steps=request_steps,
    )


def _steady_state(
    engine: Engine,
    isl: int,
    osl: int,
    c: int,
    *,
    think_s: float,
    target_arrivals: int,
    max_request_steps: int,
    seed: int,
) -> tuple[float, float, int, int, int]:
    rng = random.Random(seed)
    driver = EngineDriver(engine)
    # Warm-up: client i's request is g_i tokens into its output, g spread uniformly; the
    # order of admission is shuffled so it is not sorted by phase.
    phases = [int((i + rng.random()) / c * osl) for i in range(c)]
    rng.shuffle(phases)
    client_of: dict[str, int] = {}
    for i, g in enumerate(phases):
        g = min(g, osl - 1)
        rid = f"w{i}"
        client_of[rid] = i
        driver.submit(EngineRequest(rid, [_TOKEN_ID] * (isl + g), osl - g, arrival_s=0.0), 0.0)
    warm_ids = set(client_of)
    warm_left = len(warm_ids)
    warm_end_s: float | None = None

    sends: Arrivals[int] = Arrivals()  # clients' next prompts (the value: the client)
    last_token_s: dict[str, float] = {}
    measured_ttft: list[float] = []
    gap_sum_s = 0.0
    gap_count = 0
    open_measured: set[str] = set()
    arrivals_measured = 0
    steps = 0
    request_steps = 0
    running = 0  # requests running when the next iteration begins
    warm_steps = -1
    ids = itertools.count(1)

    def send(send_s: float, client: int) -> EngineRequest:
        nonlocal arrivals_measured
        rid = f"r{next(ids)}"
        client_of[rid] = client
        if warm_end_s is not None and arrivals_measured < target_arrivals:
            open_measured.add(rid)
            arrivals_measured += 1
        return EngineRequest(rid, [_TOKEN_ID] * isl, osl, arrival_s=send_s)

    for out in run_virtual(driver, sends, send):
        # Arrivals only join the waiting queue: what runs at an iteration's start is what
        # ran at the previous one's end.
        request_steps += running
        running = engine.num_running
        steps += 1
        now = out.now_s
        for req in out.emitted:
            rid = req.request_id
            prev = last_token_s.get(rid)
            if prev is not None:
                if warm_end_s is not None:
                    gap_sum_s += now - prev
                    gap_count += 1
            elif rid in warm_ids:
                warm_left -= 1
                if warm_left == 0:
                    warm_end_s = now
            elif rid in open_measured:
                open_measured.discard(rid)
                measured_ttft.append(now - (req.arrival_s or 0.0))
            last_token_s[rid] = now
        for req in out.finished:
            last_token_s.pop(req.request_id, None)
            sends.add(now + think_s, client_of.pop(req.request_id))
        if warm_end_s is None or warm_steps < 0:
            # The warm-up always runs to its end; the cap counts from the step after it.
            warm_steps = request_steps if warm_end_s is not None else -1
            continue
        done = arrivals_measured >= target_arrivals and not open_measured
        if done or request_steps - warm_steps >= max_request_steps:
            break
    if not measured_ttft:
        # The cap came before any steady-state arrival got its first token: count what is
        # open as waiting until now (a lower bound), or fall back to the warm-up's end.
        for rid in open_measured:
            open_req = engine.get(rid)
            if open_req is not None and open_req.arrival_s is not None:
                measured_ttft.append(engine.now_s - open_req.arrival_s)
    ttft_s = sum(measured_ttft) / len(measured_ttft) if measured_ttft else (warm_end_s or 0.0)
    tpot_s = gap_sum_s / gap_count if gap_count else 0.0
    return ttft_s, tpot_s, len(measured_ttft), steps, request_steps


def _first_wave_ttft_s(engine: Engine, isl: int, osl: int, c: int, max_request_steps: int) -> float:
    """Mean TTFT of `c` prompts sent at once to an idle engine (decodes of the early ones
    interleave with the later prefills, as they do in the real first wave)."""
    driver = EngineDriver(engine)
    for i in range(c):
        driver.submit(EngineRequest(f"f{i}", [_TOKEN_ID] * isl, osl, arrival_s=0.0), 0.0)
    total_s = 0.0
    left = c
    request_steps = 0
    running = 0
    nothing: Arrivals[None] = Arrivals()
    for out in run_virtual(driver, nothing, lambda _t, _x: None):
        request_steps += running
        running = engine.num_running
        for req in out.emitted:
            if req.num_output_tokens == 1:
                total_s += out.now_s
                left -= 1
        if not left or request_steps >= 4 * max_request_steps:
            break
    # (a cap hit leaves `left` prompts unserved: count them at the time reached)
    total_s += left * engine.now_s
    return total_s / c
