"""SGLang's scheduling of new prompts, played out on virtual time (issue 14, wave 17).

The rules as SGLang's scheduler states them (managers/scheduler.py get_next_batch_to_run /
get_new_batch_prefill, managers/schedule_policy.py PrefillAdder), for a closed loop of
`concurrency` clients that all send `input_tokens` and read `output_tokens`:

* Prefill first: every loop takes the prompts that arrived, and while any waits (and the
  running batch is below max_running_requests) the next batch is a prefill batch; decodes
  run only when no prompt waits. Decodes are paused for the whole prefill phase.
* A prefill batch takes waiting prompts first come first served up to the chunk budget
  (--chunked-prefill-size; --max-prefill-tokens is larger on every GPU): whole prompts
  while they fit, then the first that does not fit as a chunk, continued first in the next
  prefill batch. A prompt's first token comes at the end of the batch that finishes it.
* A decode step advances every running request by one token; a finished request's client
  sends its next prompt `round_trip_s` later, plus a uniform jitter of up to `jitter_s`
  (the front end, HTTP and the client). A request's output length is `output_tokens`, or
  drawn uniformly within +-`output_spread` of it (a benchmark's random lengths); seeded,
  so runs repeat.

Requests that start decoding in the same step and have the same length finish in the same
step, so the prompts of clients that arrive together stay together (a cohort): only the
jitter or unequal lengths break them up.
What SGLang does not do here (no KV admission beyond `max_running`, no retraction) does not
bind on the rows this is used for (`benchmarks/plan_sglang_queue.py`). Pure: no I/O, no
clocks; the analytic solver (`plan.closed_loop`) is the planner's path, this a check of it.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass

from gpufleet.perf.step_time import StepBatch, StepTimeModel, memoised_step_time_fn


@dataclass(frozen=True, slots=True)
class SglangLoopResult:
    """Means over every request the clients sent (the first wave included)."""

    ttft_s: float  # arrival at the scheduler to the end of the prefill batch that finished it
    tpot_s: float  # (last token - first token) / (output_tokens - 1)
    first_wave_ttft_s: float  # the clients' first prompts, sent at once
    requests: int
    prefill_batches: int
    decode_steps: int


@dataclass(slots=True)
class _Request:
    client: int
    arrival_s: float
    prefilled: int = 0  # prompt tokens prefilled so far
    generated: int = 0  # output tokens so far (the first comes from the prefill)
    first_token_s: float = 0.0
    output_tokens: int = 1
    first: bool = False  # the client's first prompt


def simulate_sglang_loop(
    model: StepTimeModel,
    input_tokens: int,
    output_tokens: int,
    concurrency: int,
    *,
    chunk_tokens: int,
    max_running: int,
    requests_per_client: int = 5,
    round_trip_s: float = 0.0,
    jitter_s: float = 0.0,
    output_spread: float = 0.0,
    start_spread: bool = False,
    seed: int = 0,
) -> SglangLoopResult:
    """Play SGLang's loop out until every client has sent `requests_per_client` prompts.

    start_spread: the clients' first prompts arrive evenly over one decode phase of the
    whole batch instead of at once, and the means leave them out (a steady state that
    starts out of step); first_wave_ttft_s is then theirs."""
    if min(input_tokens, output_tokens, concurrency, chunk_tokens, max_running) < 1:
        raise ValueError("token counts, concurrency, chunk and max_running must be >= 1")
    if requests_per_client < 1 or not 0.0 <= output_spread < 1.0:
        raise ValueError("requests_per_client must be >= 1 and output_spread in [0, 1)")
    rng = random.Random(seed)
    phase_s = 0.0
    if start_spread:
        full = StepBatch(
            num_decode=concurrency,
            decode_context_tokens=concurrency * (input_tokens + output_tokens // 2),
        )
        phase_s = max(1, output_tokens - 1) * model.step_time_s(full)
    arrivals = [(c * phase_s / concurrency, c) for c in range(concurrency)]
    sent = [1] * concurrency
    waiting: deque[_Request] = deque()
    chunked: _Request | None = None  # a prompt part-way through its prefill
    running: list[_Request] = []
    ttfts: list[float] = []
    first_wave: list[float] = []
    tpots: list[float] = []
    now = 0.0
    prefill_batches = decode_steps = 0
    step_s = memoised_step_time_fn(model)  # the same few batches, each once

    def first_token(req: _Request) -> None:
        req.generated, req.first_token_s = 1, now
        if sent[req.client] == 1:
            first_wave.append(now - req.arrival_s)
        if not (start_spread and sent[req.client] == 1):
            ttfts.append(now - req.arrival_s)
        if req.output_tokens == 1:
            finish(req)
        else:
            running.append(req)

    def finish(req: _Request) -> None:
        if req.output_tokens > 1 and not (start_spread and req.first):
            tpots.append((now - req.first_token_s) / (req.output_tokens - 1))
        if sent[req.client] < requests_per_client:
            sent[req.client] += 1
            delay = round_trip_s + (rng.uniform(0.0, jitter_s) if jitter_s > 0 else 0.0)
            heapq.heappush(arrivals, (now + delay, req.client))

    while arrivals or waiting or chunked is not None or running:
        while arrivals and arrivals[0][0] <= now:
            at, client = heapq.heappop(arrivals)
            length = output_tokens
            if output_spread > 0.0:
                spread = rng.uniform(-output_spread, output_spread)
                length = max(1, round(output_tokens * (1.0 + spread)))
            waiting.append(_Request(client, at, output_tokens=length, first=sent[client] == 1))
        # (a chunked prompt continues whatever the running count, as SGLang's does)
        if chunked is not None or (waiting and len(running) < max_running):
            budget = chunk_tokens
            batch: list[tuple[_Request, int]] = []  # (request, tokens this batch)
            if chunked is not None:
                n = min(budget, input_tokens - chunked.prefilled)
                batch.append((chunked, n))
                budget -= n
                chunked = None
            while waiting and budget > 0 and len(running) + len(batch) < max_running:
                req = waiting.popleft()
                n = min(budget, input_tokens)
                batch.append((req, n))
                budget -= n
            shape = StepBatch(
                prefill_tokens=tuple(n for _, n in batch),
                prefill_context_tokens=tuple(req.prefilled for req, _ in batch),
            )
            now += step_s(shape)
            prefill_batches += 1
            for req, n in batch:
                req.prefilled += n
                if req.prefilled >= input_tokens:
                    first_token(req)
                else:
                    chunked = req
            continue
        if running:
            n = len(running)
            context = sum(input_tokens + req.generated for req in running)
            now += step_s(StepBatch(num_decode=n, decode_context_tokens=context))
            decode_steps += 1
            still: list[_Request] = []
            for req in running:
                req.generated += 1
                if req.generated >= req.output_tokens:
                    finish(req)
                else:
                    still.append(req)
            running = still
            continue
        if arrivals:
            now = max(now, arrivals[0][0])
    return SglangLoopResult(
        ttft_s=sum(ttfts) / len(ttfts) if ttfts else 0.0,
        tpot_s=sum(tpots) / len(tpots) if tpots else 0.0,
        first_wave_ttft_s=sum(first_wave) / len(first_wave),
        requests=len(first_wave) + len(ttfts) if start_spread else len(ttfts),
        prefill_batches=prefill_batches,
        decode_steps=decode_steps,
    )
