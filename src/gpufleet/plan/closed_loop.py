"""Closed-loop serving predictions from any step-time model: mean TTFT, TPOT, throughput.

The load is the one vLLM's / SGLang's / TRT-LLM's benchmarks apply at fixed concurrency:
`concurrency` clients, each sends a prompt of `input_tokens`, reads `output_tokens`
tokens, and sends the next prompt at once. In steady state:

* Decoding requests advance one token per engine iteration, so TPOT is the mean iteration
  time a decoding request sees. Prefill work shares the GPU: when a fraction `rho` of the
  time goes to prefill tokens (piggybacked chunks in vLLM / TRT-LLM, separate prefill
  batches in SGLang), decode iterations stretch to T_decode / (1 - rho).
* TTFT is the wait for the running iteration to end (half an iteration on average, plus
  one more where the engine forms the next batch while the GPU runs this one), the queue
  of other prompts ahead at the prefill "station", and the request's own prefill chunks. The queue is that of a closed network (finite population: the clients), solved
  with Schweitzer's mean-value approximation, so it saturates at `concurrency - 1`
  prompts instead of diverging like an open queue would; its wait is scaled by the
  variability of arrivals and service (Kingman), which is nil for clients that all send
  the same lengths (`FIXED_LENGTH_QUEUE_SCALE`: the planner's and the benchmarks' load).
* Little's law ties them: requests_per_s = concurrency / (TTFT + (osl - 1) * TPOT).

The three are solved together by damped fixed-point iteration (a few dozen step-time
calls: cheap enough for the planner's whole search to stay well under a second).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from gpufleet.perf.step_time import StepBatch, StepTimeModel, memoised_step_time_fn

_ITERATIONS = 60
# Queueing at the prefill station scales with the variability of arrivals and service,
# Kingman's (ca^2 + cs^2) / 2 (1: exponential, the mean-value analysis as written). A
# closed loop of clients that all send the same isl / osl — the benchmarks' load and the
# planner's question — has deterministic service and arrivals that are completions of
# identical cycles: once the clients drift apart the prompts arrive evenly spaced and none
# waits for another below saturation (ca = cs = 0). What waiting remains is the iteration
# in progress (`ahead_s`) and, at saturation, the throughput caps (Little's law).
FIXED_LENGTH_QUEUE_SCALE = 0.0
_DAMPING = 0.5
_MAX_PREFILL_SHARE = 0.97


@dataclass(frozen=True, slots=True)
class SchedulerShape:
    """What the engine's scheduler allows per iteration.

    mixed_prefill: prefill chunks ride in the same iteration as the decodes, which take
    their share of the token budget first (vLLM V1, TRT-LLM in-flight batching); False:
    prefill batches run as iterations of their own (SGLang's default).
    """

    max_num_batched_tokens: int = 8192
    max_running: int = 1024
    mixed_prefill: bool = True
    # Streamed output tokens per second the engine's front-end delivers (all ranks).
    max_output_tokens_per_s: float = math.inf
    # Iterations already formed when a request arrives (overlap scheduling: 1): it waits
    # for the running one to end and for these before its prefill starts.
    iterations_ahead: int = 0
    # Iterations of the engine's loop a request's first token costs beyond those (a
    # calibrated count, `BackendCalibration.first_token_iterations`): the closed loop's
    # phase (a prompt sent on another's last token arrives as the next iteration starts,
    # so it waits a whole one, not half) and the front-end's share of each iteration.
    first_token_iterations: float = 0.0
    # Batch waiting (TRT-LLM's batch_wait_timeout_iters / batch_wait_max_tokens_ratio, both
    # off by default): while decodes run, new prompts are held until this many iterations
    # have passed since the first of them was held, or until the held prompts plus the
    # decodes reach batch_wait_tokens scheduled tokens (0: no token threshold).
    batch_wait_iterations: int = 0
    batch_wait_tokens: int = 0
    # TRT-LLM's attention-DP balancing (attention_dp_config enable_balance, off by default;
    # batching_wait_iters 0): while every rank decodes, new prompts are held until each of
    # the `balance_ranks` ranks holds one or `balance_timeout_iterations` have passed.
    balance_timeout_iterations: int = 0
    balance_ranks: int = 1
    # Tokens a decoding request emits per iteration: 1, or with speculative decoding its
    # accepted drafts plus one (`perf.speculative.accepted_tokens`); the step model then
    # prices the drafts and their verification (`perf.speculative.SpeculativeStepModel`).
    accepted_tokens: float = 1.0


@dataclass(frozen=True, slots=True)
class ServingPrediction:
    """Means over requests in steady state at fixed concurrency."""

    concurrency: int
    ttft_s: float
    tpot_s: float
    requests_per_s: float
    output_tokens_per_s: float
    e2e_latency_s: float
    running_decodes: float  # mean number of requests in their decode phase
    prefill_share: float  # fraction of GPU time spent on prefill work
    prefill_s: float  # a lone prompt's prefill time (no queue, no decodes alongside)


def predict_closed_loop(
    model: StepTimeModel,
    input_tokens: int,
    output_tokens: int,
    concurrency: int,
    scheduler: SchedulerShape | None = None,
    *,
    ttft_overhead_s: float = 0.0,
    queue_scale: float = 1.0,
    requests_per_client: float | None = None,
    lockstep_ranks: int = 1,
) -> ServingPrediction:
    """Mean TTFT / TPOT / throughput for `concurrency` clients in a closed loop.

    requests_per_client: when set, the mean is over a finite benchmark run in which all
    clients start at once: the first wave of prompts queues behind each other (the i-th
    waits for i-1 prefills), and that wave is 1/requests_per_client of the requests.
    None: steady state only (what a long-running service sees).
    queue_scale: the variability factor of the prefill queue (Kingman's (ca^2 + cs^2) / 2;
    1: exponential arrivals and service; FIXED_LENGTH_QUEUE_SCALE for identical requests).
    lockstep_ranks: attention data-parallel ranks that run every iteration together (their
    MoE layers exchange tokens): a prefill on any rank stalls the decodes on all of them,
    so each rank's decodes see the prefill work of every rank. `concurrency` is per rank.
    """
    if input_tokens < 1 or output_tokens < 1 or concurrency < 1:
        raise ValueError("input_tokens, output_tokens and concurrency must be >= 1")
    sched = scheduler or SchedulerShape()
    stages = max(1, int(getattr(model, "pipeline_stages", 1)))
    if stages > 1:
        # Pipeline parallelism: `stages` micro-batches in flight, each a closed loop of its
        # share of the clients whose iteration takes step_time_s end to end; together they
        # keep every stage busy, so throughput adds up while latency is one micro-batch's.
        per_batch = math.ceil(concurrency / stages)
        sub = predict_closed_loop(
            _OneMicroBatch(model),
            input_tokens,
            output_tokens,
            per_batch,
            dataclasses.replace(  # one micro-batch's share of the running slots and front end
                sched,
                max_running=max(1, math.ceil(sched.max_running / stages)),
                max_output_tokens_per_s=sched.max_output_tokens_per_s / stages,
            ),
            ttft_overhead_s=ttft_overhead_s,
            queue_scale=queue_scale,
            requests_per_client=requests_per_client,
            lockstep_ranks=lockstep_ranks,
        )
        scale = concurrency / per_batch
        return ServingPrediction(
            concurrency=concurrency,
            ttft_s=sub.ttft_s,
            tpot_s=sub.tpot_s,
            requests_per_s=sub.requests_per_s * scale,
            output_tokens_per_s=sub.output_tokens_per_s * scale,
            e2e_latency_s=sub.e2e_latency_s,
            running_decodes=sub.running_decodes * scale,
            prefill_share=sub.prefill_share,
            prefill_s=sub.prefill_s,
        )
    isl, osl = input_tokens, output_tokens
    running = max(1, min(concurrency, sched.max_running))
    decode_ctx = isl + osl / 2.0  # mean KV length of a decoding request
    step_s = memoised_step_time_fn(model)  # the same few batches, each once

    def decode_step_s(n: int) -> float:
        if n <= 0:
            return 0.0
        return step_s(StepBatch(num_decode=n, decode_context_tokens=int(n * decode_ctx)))

    def prefill_batch(tokens_budget: int) -> StepBatch:
        """Prefill tokens one iteration packs, given the free budget and the queue."""
        if tokens_budget >= isl:
            n = max(1, tokens_budget // isl)
            return StepBatch(prefill_tokens=(isl,) * n, prefill_context_tokens=(0,) * n)
        # A chunk of a long prompt attends over the half already cached, on average.
        return StepBatch(
            prefill_tokens=(tokens_budget,),
            prefill_context_tokens=((isl - tokens_budget) // 2,),
        )

    def with_decodes(batch: StepBatch, n: int) -> StepBatch:
        return StepBatch(
            prefill_tokens=batch.prefill_tokens,
            prefill_context_tokens=batch.prefill_context_tokens,
            num_decode=n,
            decode_context_tokens=int(n * decode_ctx),
        )

    alone_s = sum(_chunk_times(model, isl, sched.max_num_batched_tokens))
    per_iteration = max(1.0, sched.accepted_tokens)  # tokens a decode emits per iteration
    tpot_s = decode_step_s(running) / per_iteration if osl > 1 else 0.0
    ttft_s = alone_s + ttft_overhead_s
    rate = running / (ttft_s + (osl - 1) * tpot_s)
    queue = 0.0
    prefill_share = 0.0
    n_dec = 0.0

    for _ in range(_ITERATIONS):
        n_dec = min(float(running), rate * (osl - 1) * tpot_s) if osl > 1 else 0.0
        n = round(n_dec)
        t_decode = decode_step_s(n)
        budget = (
            sched.max_num_batched_tokens - n
            if sched.mixed_prefill
            else sched.max_num_batched_tokens
        )
        budget = max(budget, 16)
        waiting = max(1.0, queue)
        if not sched.mixed_prefill:
            # A prefill-only iteration takes every prompt that arrived since the last one
            # (about one decode iteration's worth of arrivals), paying its fixed costs once.
            waiting = max(waiting, rate * tpot_s * per_iteration)
        packed = prefill_batch(min(budget, max(isl, int(isl * waiting))))
        packed_tokens = sum(packed.prefill_tokens)
        if sched.mixed_prefill:
            marginal_s = step_s(with_decodes(packed, n)) - t_decode
        else:
            marginal_s = step_s(packed)
        work_per_prompt_s = marginal_s * isl / packed_tokens  # GPU time one prompt costs

        # The request's own prefill: full chunks of `budget` tokens at growing context, then
        # the rest. Attention is linear in context, so the full chunks cost k times one
        # chunk at their mean context (two step-time calls however long the prompt).
        full, rest = divmod(isl, budget)
        own_s = 0.0
        if full:
            chunk = StepBatch(
                prefill_tokens=(budget,), prefill_context_tokens=((full - 1) * budget // 2,)
            )
            own_s += full * step_s(with_decodes(chunk, n) if sched.mixed_prefill else chunk)
        if rest:
            chunk = StepBatch(prefill_tokens=(rest,), prefill_context_tokens=(full * budget,))
            own_s += step_s(with_decodes(chunk, n) if sched.mixed_prefill else chunk)

        share = min(_MAX_PREFILL_SHARE, rate * work_per_prompt_s * lockstep_ranks)
        new_iteration = t_decode / (1.0 - share) if osl > 1 else 0.0
        # The front-end streams at most so many tokens per second: past that, requests
        # wait before their prefill (TTFT), the GPU's iterations are unaffected.
        rate_cap = sched.max_output_tokens_per_s / osl / lockstep_ranks
        if sched.mixed_prefill and osl > 1:
            # An iteration never exceeds a full token budget: decodes plus the budget's
            # rest in prefill. Past that, prefill throughput is capped and prompts queue.
            full_batch = with_decodes(prefill_batch(budget), n)
            full_s = step_s(full_batch)
            new_iteration = min(new_iteration, full_s)
            budget_cap = sum(full_batch.prefill_tokens) / (full_s * isl) / lockstep_ranks
            rate_cap = min(rate_cap, budget_cap)
        # Closed-network queue at the prefill station (Schweitzer): a prompt finds
        # queue * (N-1)/N others ahead, each costing work_per_prompt_s.
        ahead = queue * (running - 1) / running
        wait_s = queue_scale * ahead * work_per_prompt_s
        # A decoding request is in its own decode batch: with fewer than half a decode in
        # flight on average (long prompts, few outputs) n rounds to 0 and the iteration
        # to 0 s, but its own steps still take one decode step each.
        new_tpot = max(new_iteration, decode_step_s(1) if osl > 1 else 0.0) / per_iteration
        # The running iteration's rest (half of one on average), those already formed and
        # the engine's first-token iterations.
        ahead_s = (0.5 + sched.iterations_ahead + sched.first_token_iterations) * new_iteration
        if sched.batch_wait_iterations and n_dec >= 1.0 and osl > 1:
            ahead_s += new_iteration * batch_wait_iterations(
                sched.batch_wait_iterations,
                sched.batch_wait_tokens,
                isl,
                n,
                rate * new_iteration,
            )
        if sched.balance_timeout_iterations and running >= 2 and n_dec >= 1.0 and osl > 1:
            # A rank whose only client is the one prompting has no decode, which releases
            # the hold at once: with two or more clients per rank the others decode.
            ahead_s += new_iteration * balance_wait_iterations(
                sched.balance_timeout_iterations,
                sched.balance_ranks,
                rate * new_iteration * sched.balance_ranks,
            )
        new_ttft = ttft_overhead_s + ahead_s + wait_s + own_s
        new_rate = running / (new_ttft + (osl - 1) * new_tpot)
        if new_rate > rate_cap:
            new_rate = rate_cap
            new_ttft = running / rate_cap - (osl - 1) * new_tpot
        new_queue = new_rate * (wait_s + work_per_prompt_s)

        tpot_s += _DAMPING * (new_tpot - tpot_s)
        ttft_s += _DAMPING * (new_ttft - ttft_s)
        rate += _DAMPING * (new_rate - rate)
        queue += _DAMPING * (min(new_queue, running) - queue)
        prefill_share = share
        if (
            abs(new_tpot - tpot_s) <= 1e-4 * max(tpot_s, 1e-9)
            and abs(new_ttft - ttft_s) <= 1e-4 * ttft_s
        ):
            break

    cycle_s = ttft_s + (osl - 1) * tpot_s
    rate = running / cycle_s
    if requests_per_client:
        # First wave: `running` prompts at once, no decodes yet; prompt i waits for i-1
        # others, packed into full iterations.
        burst = prefill_batch(min(sched.max_num_batched_tokens, isl * running))
        burst_work_s = step_s(burst) * isl / sum(burst.prefill_tokens)
        first_wave_wait_s = (running - 1) / 2.0 * burst_work_s
        ttft_s += first_wave_wait_s / max(1.0, requests_per_client)
    if concurrency > running:
        # Clients beyond what the engine runs wait in its queue: Little's law on all of them.
        ttft_s = concurrency / rate - (osl - 1) * tpot_s
    return ServingPrediction(
        concurrency=concurrency,
        ttft_s=ttft_s,
        tpot_s=tpot_s,
        requests_per_s=rate,
        output_tokens_per_s=rate * osl,
        e2e_latency_s=ttft_s + (osl - 1) * tpot_s,
        running_decodes=n_dec,
        prefill_share=prefill_share,
        prefill_s=alone_s,
    )


def batch_wait_iterations(
    timeout_iterations: int,
    threshold_tokens: int,
    input_tokens: int,
    num_decode: int,
    arrivals_per_iteration: float,
) -> float:
    """Mean iterations a prompt is held by batch waiting (TRT-LLM's PyExecutor
    `_waiting_requests`): a window opens when a prompt is held and closes, releasing every
    prompt held in it, after `timeout_iterations` or as soon as the held prompts' tokens
    plus the running decodes reach `threshold_tokens` (0: no threshold). Prompts arrive
    at `arrivals_per_iteration` (a closed loop well below saturation: evenly over the
    window), so the first waits the whole window, the last almost none."""
    window = float(timeout_iterations)
    lam = max(0.0, arrivals_per_iteration)
    if threshold_tokens > 0:
        # Prompts needed (the first included) to reach the threshold beside the decodes.
        needed = max(1, math.ceil((threshold_tokens - num_decode) / input_tokens))
        if needed <= 1:
            return 0.0
        if lam > 0.0:
            window = min(window, (needed - 1) / lam)
    return _mean_hold(window, lam)


def balance_wait_iterations(
    timeout_iterations: int, ranks: int, arrivals_per_iteration: float
) -> float:
    """Mean iterations a prompt is held by TRT-LLM's attention-DP balancing
    (`_balance_adp_requests` with batching_wait_iters 0): context requests wait while any
    of the `ranks` attention-DP ranks has none, released all together once every rank
    holds one or after `timeout_iterations` held iterations. A new request goes to the
    rank with the fewest active requests, in a closed loop the one whose client just
    finished, so the ranks prompts land on are random: every rank holds one after about
    ranks x H(ranks) prompts (coupon collector). `arrivals_per_iteration` counts all ranks'."""
    if ranks <= 1:
        return 0.0
    needed = ranks * sum(1.0 / k for k in range(1, ranks + 1))
    lam = max(0.0, arrivals_per_iteration)
    window = float(timeout_iterations)
    if lam > 0.0:
        window = min(window, (needed - 1.0) / lam)
    return _mean_hold(window, lam)


def _mean_hold(window: float, arrivals_per_iteration: float) -> float:
    """Mean hold of the prompts of one window: the first waits all of it, the prompts that
    join it (evenly, at `arrivals_per_iteration`) less and less."""
    arrived = arrivals_per_iteration * window
    return window * (1.0 + arrived / 2.0) / (1.0 + arrived)


@dataclass(frozen=True, slots=True)
class _OneMicroBatch:
    """A pipelined model seen by one of its micro-batches (no further pipelining)."""

    model: StepTimeModel
    pipeline_stages: int = 1

    def step_time_s(self, batch: StepBatch) -> float:
        return self.model.step_time_s(batch)


def _chunk_times(model: StepTimeModel, isl: int, budget: int) -> list[float]:
    """Iteration times of one prompt prefilled alone in chunks of at most `budget` tokens."""
    times = []
    done = 0
    while done < isl:
        n = min(budget, isl - done)
        times.append(
            model.step_time_s(StepBatch(prefill_tokens=(n,), prefill_context_tokens=(done,)))
        )
        done += n
    return times


def max_concurrency_within_slo(
    model: StepTimeModel,
    input_tokens: int,
    output_tokens: int,
    *,
    ttft_slo_s: float,
    tpot_slo_s: float,
    scheduler: SchedulerShape | None = None,
    max_concurrency: int = 1024,
    ttft_overhead_s: float = 0.0,
    queue_scale: float = 1.0,
    lockstep_ranks: int = 1,
) -> ServingPrediction | None:
    """The highest concurrency whose mean TTFT and TPOT both meet the SLOs (binary search:
    both grow with concurrency), or None when even one request misses them."""

    def predict(c: int) -> ServingPrediction:
        return predict_closed_loop(
            model,
            input_tokens,
            output_tokens,
            c,
            scheduler,
            ttft_overhead_s=ttft_overhead_s,
            queue_scale=queue_scale,
            lockstep_ranks=lockstep_ranks,
        )

    def meets(p: ServingPrediction) -> bool:
        return p.ttft_s <= ttft_slo_s and (output_tokens <= 1 or p.tpot_s <= tpot_slo_s)

    best = predict(1)
    if not meets(best):
        return None
    lo, hi = 1, max(1, max_concurrency)
    top = predict(hi)
    if meets(top):
        return top
    while hi - lo > 1:
        mid = (lo + hi) // 2
        p = predict(mid)
        if meets(p):
            lo, best = mid, p
        else:
            hi = mid
    return best
