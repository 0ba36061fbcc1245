"""The engine model: vLLM v1 continuous batching over paged KV with a prefix cache. Pure.

`Engine.step()` runs one scheduler iteration the way vLLM v1 does:

1. Running requests first, in order: each gets the tokens it still needs (1 for a decode,
   the rest of its prompt for a chunked prefill) within the token budget
   (`max_num_batched_tokens`). When the KV blocks run out, the newest running request is
   preempted back to the head of the waiting queue (its KV dropped, recomputed later).
2. If nothing was preempted, waiting requests are admitted first-come-first-served while
   `max_num_seqs` and the token budget allow; a new request first reuses the cached blocks
   of its longest cached prefix (never its last token), and only the rest is prefilled.
3. The batch's duration comes from the `StepTimeModel`; at its end every request whose
   scheduled tokens reached its last token emits one new token.

With pipeline parallelism (`pipeline_stages` = pp > 1) up to pp micro-batches are in
flight: a micro-batch takes `step_time_s` end to end and a new one may start every
`step_time_s / pp`, so a lone request pays the whole pipeline per token while a loaded
engine fills the bubble. A request cannot have two decode steps in flight (its next token
is not known yet), exactly as in vLLM.

There is no clock here: the engine keeps its own time `now_s`, advanced by step
durations, and a driver moves it forward across idle gaps with `advance_to`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from gpufleet.engine.kv_cache import BlockPool
from gpufleet.engine.lora import AdapterSlots, LoraAdapter
from gpufleet.engine.request import EngineRequest, FinishReason, RequestStatus
from gpufleet.perf.step_time import StepBatch, StepTimeModel
from gpufleet.tokenizer import block_hashes


@dataclass(frozen=True, slots=True)
class EngineConfig:
    num_gpu_blocks: int
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    pipeline_stages: int = 1
    enable_prefix_caching: bool = True
    # vLLM's long_prefill_token_threshold: cap one request's prefill chunk (0 = no cap).
    long_prefill_token_threshold: int = 0

    def __post_init__(self) -> None:
        for name in ("num_gpu_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.pipeline_stages < 1:
            raise ValueError(f"pipeline_stages must be >= 1, got {self.pipeline_stages}")
        if self.num_gpu_blocks * self.block_size < self.max_model_len:
            raise ValueError(
                f"the KV cache ({self.num_gpu_blocks} blocks x {self.block_size} tokens) "
                f"cannot hold one request of max_model_len={self.max_model_len} tokens"
            )


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """A read-only snapshot of the engine, in the units vLLM's /metrics uses."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float  # fraction of KV blocks held by requests, 0..1
    num_gpu_blocks: int
    block_size: int
    prefix_cache_queries_tokens: int  # tokens looked up in the prefix cache
    prefix_cache_hits_tokens: int  # of those, tokens found cached
    num_preemptions: int
    prompt_tokens: int  # prompt tokens of requests that produced their first token
    generation_tokens: int
    finished_by_reason: dict[str, int]
    num_steps: int
    now_s: float


@dataclass(slots=True)
class StepOutcome:
    """What one iteration did. `duration_s` is how far the engine clock moved.

    Every request in `emitted` produced exactly one token this step
    (`req.all_token_ids[-1]`). `finished` requests carry `finish_reason`.
    """

    duration_s: float
    now_s: float
    emitted: list[EngineRequest] = field(default_factory=list)
    finished: list[EngineRequest] = field(default_factory=list)
    preempted: list[EngineRequest] = field(default_factory=list)
    num_scheduled_tokens: int = 0


@dataclass(slots=True)
class _MicroBatch:
    # (request, token count at which this chunk ends) for each scheduled request
    entries: list[tuple[EngineRequest, int]]
    end_s: float
    num_tokens: int


class Engine:
    def __init__(
        self,
        config: EngineConfig,
        step_time_model: StepTimeModel,
        seed: int = 0,
        lora: AdapterSlots | None = None,
    ):
        self.config = config
        self.lora = lora  # LoRA adapter slots (engine.lora); None: LoRA not enabled
        self.step_time_model = step_time_model
        self.seed = seed
        self.now_s = 0.0
        self._pool = BlockPool(config.num_gpu_blocks, enable_caching=config.enable_prefix_caching)
        self._bs = config.block_size
        self._running: list[EngineRequest] = []
        self._waiting: deque[EngineRequest] = deque()
        self._requests: dict[str, EngineRequest] = {}
        self._in_flight: deque[_MicroBatch] = deque()
        self._next_start_s = 0.0  # earliest start of the next pipeline micro-batch
        self._preempted_pending: list[EngineRequest] = []
        self._num_added = 0
        # counters (monotonic)
        self._prefix_queries = 0
        self._prefix_hits = 0
        self._preemptions = 0
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._finished_by_reason: dict[str, int] = {r.value: 0 for r in FinishReason}
        self._num_steps = 0

    # ------------------------------------------------------------------ requests
    def add(self, request: EngineRequest) -> None:
        """Queue a request (FCFS). Its arrival defaults to the engine's current time."""
        if request.request_id in self._requests:
            raise ValueError(f"request id {request.request_id!r} is already in the engine")
        limit = self.config.max_model_len
        if request.num_prompt_tokens >= limit:
            raise ValueError(
                f"prompt of {request.num_prompt_tokens} tokens does not fit max_model_len={limit}"
            )
        if request.arrival_s is None:
            request.arrival_s = self.now_s
        request.seed_if_unset(self.seed * 1_000_003 + self._num_added)
        self._num_added += 1
        if self.config.enable_prefix_caching and not request.block_hashes:
            request.block_hashes = block_hashes(request.all_token_ids, self._bs)
        self._requests[request.request_id] = request
        self._waiting.append(request)

    def abort(
        self, request_id: str, reason: FinishReason = FinishReason.ABORT
    ) -> EngineRequest | None:
        """Drop a request at once, freeing its KV blocks. Unknown ids are ignored.

        `reason` is what it counts as: ABORT for a client that left, STOP when the server
        ended it on a stop string (the engine does not see text)."""
        req = self._requests.pop(request_id, None)
        if req is None:
            return None
        if req.status is RequestStatus.RUNNING:
            self._running.remove(req)
            self._release_lora(req)
        else:
            self._waiting.remove(req)
        self._pool.release(req.blocks)
        req.blocks = []
        req.status = RequestStatus.ABORTED
        req.finish_reason = reason
        req.finished_s = self.now_s
        self._finished_by_reason[reason.value] += 1
        return req

    def add_lora(self, adapter: LoraAdapter, now_s: float) -> float:
        """Load `adapter` (vLLM's add_lora) between iterations, at `now_s` or when the one
        in progress ends; the engine time when it is loaded. ValueError if it cannot be."""
        if self.lora is None:
            raise ValueError("LoRA is not enabled. Use --enable-lora to enable LoRA.")
        self.advance_to(now_s)
        self.lora.add(adapter, self.now_s)
        return self.lora.busy_until_s

    def remove_lora(self, name: str) -> bool:
        """Unregister an adapter (vLLM's remove_lora); False if it was not registered."""
        return self.lora is not None and self.lora.remove(name)

    def get(self, request_id: str) -> EngineRequest | None:
        return self._requests.get(request_id)

    @property
    def has_work(self) -> bool:
        return bool(self._running or self._waiting or self._in_flight)

    def advance_to(self, now_s: float) -> None:
        """Move the engine clock across an idle gap (never backwards, never mid-step)."""
        if not self._in_flight and now_s > self.now_s:
            self.now_s = now_s

    # ------------------------------------------------------------------ stats
    @property
    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_running=len(self._running),
            num_waiting=len(self._waiting),
            kv_cache_usage=self._pool.usage,
            num_gpu_blocks=self.config.num_gpu_blocks,
            block_size=self._bs,
            prefix_cache_queries_tokens=self._prefix_queries,
            prefix_cache_hits_tokens=self._prefix_hits,
            num_preemptions=self._preemptions,
            prompt_tokens=self._prompt_tokens,
            generation_tokens=self._generation_tokens,
            finished_by_reason=dict(self._finished_by_reason),
            num_steps=self._num_steps,
            now_s=self.now_s,
        )

    @property
    def num_running(self) -> int:
        return len(self._running)

    def waiting_requests(self) -> tuple[EngineRequest, ...]:
        return tuple(self._waiting)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_cache_usage(self) -> float:
        return self._pool.usage

    # ------------------------------------------------------------------ stepping
    def step(self) -> StepOutcome:
        """Run until the next micro-batch completes; return what it produced.

        With nothing to do, returns an outcome with duration 0 and no tokens.
        """
        pp = self.config.pipeline_stages
        in_flight = self._in_flight
        while len(in_flight) < pp:
            start_s = max(self.now_s, self._next_start_s)
            if in_flight and start_s >= in_flight[0].end_s:
                break  # the oldest micro-batch completes before another could start
            mb = self._schedule(start_s)
            if mb is None:
                break
            in_flight.append(mb)
        preempted = self._preempted_pending
        self._preempted_pending = []
        if not in_flight:
            return StepOutcome(duration_s=0.0, now_s=self.now_s, preempted=preempted)
        mb = in_flight.popleft()
        duration_s = mb.end_s - self.now_s
        self.now_s = mb.end_s
        self._num_steps += 1
        outcome = StepOutcome(
            duration_s=duration_s,
            now_s=self.now_s,
            preempted=preempted,
            num_scheduled_tokens=mb.num_tokens,
        )
        self._complete(mb, outcome)
        return outcome

    def _schedule(self, start_s: float) -> _MicroBatch | None:
        cfg = self.config
        bs = self._bs
        pool = self._pool
        running = self._running
        budget = cfg.max_num_batched_tokens
        threshold = cfg.long_prefill_token_threshold
        caching = pool.enable_caching
        free_list = pool.free_list  # its len() is the free block count
        entries: list[tuple[EngineRequest, int]] = []
        prefill_tokens: list[int] = []
        prefill_context: list[int] = []
        num_decode = 0
        decode_context = 0
        preempted_any = False

        # 1. running requests, oldest first
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            computed = req.num_computed_tokens
            n = len(req.all_token_ids) - computed
            if n <= 0:  # its last step is still in flight (pipeline parallel)
                i += 1
                continue
            if n > budget:
                n = budget
            if threshold and n > threshold:
                n = threshold
            end = computed + n
            need = -(-end // bs) - len(req.blocks)
            scheduled = True
            while need > len(free_list):
                victim = self._pick_victim()
                if victim is None:
                    scheduled = False
                    break
                self._preempt(victim)
                preempted_any = True
                if victim is req:
                    scheduled = False
                    break
            if not scheduled:
                break
            if need > 0:
                req.blocks.extend(pool.allocate(need))
            req.num_computed_tokens = end
            # (most steps are decodes that fill no new block: skip the call then)
            if caching and end // bs > req.num_cached_blocks:
                self._cache_full_blocks(req)
            req.in_flight += 1  # also keeps it from being chosen as a victim below
            entries.append((req, end))
            budget -= n
            if n == 1:
                num_decode += 1
                decode_context += computed
            else:
                prefill_tokens.append(n)
                prefill_context.append(computed)
            i += 1

        # 2. waiting requests, first come first served
        waiting = self._waiting
        lora = self.lora
        skipped: list[EngineRequest] = []  # over max_loras: kept in order, passed over
        # With pp > 1, spread simultaneous arrivals over the pipeline's micro-batches (as
        # vLLM's per-stage virtual engines did) instead of packing them into one.
        admit_left = len(waiting)
        if cfg.pipeline_stages > 1:
            admit_left = -(-(len(running) + len(waiting)) // cfg.pipeline_stages)
        if not preempted_any:
            while waiting and budget > 0 and len(running) < cfg.max_num_seqs and admit_left > 0:
                admit_left -= 1
                req = waiting[0]
                if req.lora is not None and lora is not None and not lora.can_admit(req.lora):
                    skipped.append(waiting.popleft())
                    continue
                hit_blocks: list[int] = []
                if pool.enable_caching:
                    hit_blocks = self._longest_cached_prefix(req)
                computed = len(hit_blocks) * bs
                n = len(req.all_token_ids) - computed
                if n > budget:
                    n = budget
                if threshold and n > threshold:
                    n = threshold
                need = -(-(computed + n) // bs) - len(hit_blocks)
                if need > pool.num_free - pool.num_evictable(hit_blocks):
                    break  # not enough KV for it now; FCFS keeps the rest waiting too
                waiting.popleft()
                pool.touch(hit_blocks)
                req.blocks = hit_blocks + pool.allocate(need)
                req.num_cached_blocks = len(hit_blocks)
                req.num_computed_tokens = computed + n
                if not req.prefix_hit_recorded:
                    # vLLM counts queries and hits in tokens at a request's first admission.
                    req.prefix_hit_recorded = True
                    req.num_prefix_hit_tokens = computed
                    if pool.enable_caching:
                        self._prefix_queries += len(req.all_token_ids)
                        self._prefix_hits += computed
                if pool.enable_caching:
                    self._cache_full_blocks(req)
                if req.first_scheduled_s is None:
                    req.first_scheduled_s = start_s
                req.status = RequestStatus.RUNNING
                if req.lora is not None and lora is not None:
                    lora.admit(req.lora)
                running.append(req)
                req.in_flight += 1
                entries.append((req, computed + n))
                budget -= n
                if n == 1:
                    num_decode += 1
                    decode_context += computed
                else:
                    prefill_tokens.append(n)
                    prefill_context.append(computed)

            if skipped:
                waiting.extendleft(reversed(skipped))

        if not entries:
            return None
        batch = StepBatch(
            prefill_tokens=tuple(prefill_tokens),
            prefill_context_tokens=tuple(prefill_context),
            num_decode=num_decode,
            decode_context_tokens=decode_context,
        )
        step_s = self.step_time_model.step_time_s(batch)
        if lora is not None:  # loads this iteration waits for, SGMV kernels of its adapters
            step_s += lora.step_extra_s(cfg.max_num_batched_tokens - budget, start_s)
        pp = cfg.pipeline_stages
        end_s = start_s + step_s
        if self._in_flight and end_s < self._in_flight[-1].end_s:
            end_s = self._in_flight[-1].end_s  # micro-batches leave the pipeline in order
        self._next_start_s = start_s + step_s / pp
        return _MicroBatch(
            entries=entries,
            end_s=end_s,
            num_tokens=cfg.max_num_batched_tokens - budget,
        )

    def _pick_victim(self) -> EngineRequest | None:
        """The newest running request that has no step in flight (vLLM: running.pop())."""
        running = self._running
        for j in range(len(running) - 1, -1, -1):
            if running[j].in_flight == 0:
                return running[j]
        return None

    def _preempt(self, req: EngineRequest) -> None:
        self._running.remove(req)
        self._release_lora(req)
        self._pool.release(req.blocks)
        req.blocks = []
        req.num_cached_blocks = 0
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.status = RequestStatus.PREEMPTED
        self._waiting.appendleft(req)
        self._preemptions += 1
        self._preempted_pending.append(req)

    def _release_lora(self, req: EngineRequest) -> None:
        if req.lora is not None and self.lora is not None:
            self.lora.release(req.lora)

    def _longest_cached_prefix(self, req: EngineRequest) -> list[int]:
        """Cached blocks of the request's longest cached prefix, never covering its last
        token (that one must be computed to produce the next token)."""
        pool = self._pool
        hashes = req.block_hashes
        self._extend_hashes(req)
        max_blocks = (len(req.all_token_ids) - 1) // self._bs
        out: list[int] = []
        for k in range(min(max_blocks, len(hashes))):
            b = pool.lookup(hashes[k])
            if b is None:
                break
            out.append(b)
        return out

    def _extend_hashes(self, req: EngineRequest) -> None:
        """Hash every full block of the request's known tokens (prompt and generated)."""
        bs = self._bs
        hashes = req.block_hashes
        tokens = req.all_token_ids
        while (len(hashes) + 1) * bs <= len(tokens):
            k = len(hashes)
            parent = hashes[-1] if hashes else 0
            hashes.append(hash((parent, *tokens[k * bs : (k + 1) * bs])))

    def _cache_full_blocks(self, req: EngineRequest) -> None:
        full = req.num_computed_tokens // self._bs
        if full <= req.num_cached_blocks:
            return
        if len(req.block_hashes) < full:
            self._extend_hashes(req)
        self._pool.cache_range(req.blocks, req.block_hashes, req.num_cached_blocks, full)
        req.num_cached_blocks = full

    def _complete(self, mb: _MicroBatch, outcome: StepOutcome) -> None:
        now = self.now_s
        max_len = self.config.max_model_len
        emitted = outcome.emitted
        finished = outcome.finished
        running_status = RequestStatus.RUNNING
        for req, ends_at in mb.entries:
            req.in_flight -= 1
            tokens = req.all_token_ids
            if req.status is not running_status or ends_at != len(tokens):
                continue  # aborted meanwhile, or a prefill chunk short of the last token
            tokens.append(req.next_token_id())
            req.num_output_tokens += 1
            if req.first_token_s is None:
                req.first_token_s = now
                self._prompt_tokens += req.num_prompt_tokens
            emitted.append(req)
            reason = None
            if req.num_output_tokens >= req.max_tokens or len(tokens) >= max_len:
                reason = FinishReason.LENGTH
            elif (
                req.stop_after_tokens is not None and req.num_output_tokens >= req.stop_after_tokens
            ):
                reason = FinishReason.STOP
            if reason is not None:
                req.finish_reason = reason
                req.finished_s = now
                req.status = RequestStatus.FINISHED
                self._finished_by_reason[reason.value] += 1
                self._pool.release(req.blocks)
                req.blocks = []
                del self._requests[req.request_id]
                self._release_lora(req)
                finished.append(req)
        self._generation_tokens += len(emitted)
        if finished:
            self._running = [r for r in self._running if r.status is running_status]
