"""Jumping over runs of decode iterations, exactly as stepping one by one would. Pure.

Between events that change the batch (an arrival, an admission, a finish, a preemption, a
prefill chunk ending, a first token), the engine's steps differ only in context length:
each running request decodes one token, blocks are handed out as requests cross block
boundaries, and full blocks are registered in the prefix cache. `plan_decode_run` finds how
many coming `step()` calls are such plain decode steps and when each ends; `apply_decode_run`
(in `decode_apply`) performs them in one call: every request gets its tokens at once, the KV manager gets the
block requests in the order the steps would have made them, and the clock moves to the
last step's end. The result equals that many `step()` calls bit for bit (the step-time
model prices the run with `decode_step_times_s`, the same floats as `step_time_s`).

A run ends where stepping could do something else: before a step in which the free
blocks would run out (a preemption), before a step that could admit a waiting request,
before micro-batches merge (PP), and after the step in which a request finishes. With
pp > 1 the run follows the pipeline's micro-batches ("groups" of requests that decode
together) through the same start / end arithmetic as `Engine.step`.

With LoRA the batch's adapters cannot change inside a run (nobody is admitted, and a
finish ends the run), so every step pays the same SGMV cost on top of its base time. No
run starts while an adapter load would be paid (a runtime load holding the engine, or one
an admission triggered), and none with pp > 1 (kept simple: those engines step).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpufleet.engine.request import EngineRequest, RequestStatus
from gpufleet.perf.step_ends import steps_ended_by

if TYPE_CHECKING:
    from gpufleet.engine.engine import Engine


class DecodeGroup:
    """Requests that decode together: one micro-batch after another. (A plain class: built
    per run, and mypyc compiles only an explicit `__init__`.)"""

    __slots__ = (
        "computed", "context_tokens", "finish_after", "in_flight", "members",
        "new_blocks_by_phase",
    )  # fmt: skip

    def __init__(
        self,
        members: list[EngineRequest],  # in running order
        computed: list[int],  # each member's computed tokens when the run was planned
        in_flight: bool,  # its micro-batch was in flight when the run was planned
        # blocks the group's k-th step hands out, by phase k % block_size (a member needs
        # one when computed + k is a multiple of the block size)
        new_blocks_by_phase: list[int],
        context_tokens: int,  # summed KV length at its next step
        finish_after: int,  # steps (completions) until its first member finishes
    ) -> None:
        self.members = members
        self.computed = computed
        self.in_flight = in_flight
        self.new_blocks_by_phase = new_blocks_by_phase
        self.context_tokens = context_tokens
        self.finish_after = finish_after

    def slots_by_phase(
        self, block_size: int, caching: bool
    ) -> list[list[tuple[EngineRequest, int]]]:
        """Phase -> (member, computed) whose blocks change at a step of that phase: a block
        handed out, or (with prefix caching) one filled and registered."""
        phases: list[list[tuple[EngineRequest, int]]] = [[] for _ in range(block_size)]
        computed = self.computed
        for i, r in enumerate(self.members):  # (compiled, a zip with strict= is a generic call)
            c = computed[i]
            new_block_phase = -c % block_size
            phases[new_block_phase].append((r, c))
            full_block_phase = (-c - 1) % block_size
            if caching and full_block_phase != new_block_phase:
                phases[full_block_phase].append((r, c))
        return phases


@dataclass(slots=True)
class PipelineCall:
    """A micro-batch scheduled during a pipelined run."""

    group: int
    index: int  # the group's k-th micro-batch in the run
    step: int  # the step() call that scheduled it
    start_s: float
    end_s: float
    context_tokens: int
    blocks_after: int  # blocks handed out in the run up to and including this one
    next_start_s: float  # the pipeline's next start once it is scheduled


class DecodeRun:
    """A plan of `num_steps` plain decode `step()` calls; `Engine.run_decode` applies it.

    Step j starts when step j-1 ends (step 0 at `start_s`) and ends at `step_end_s[j]`.
    `finishes`: the last step finishes a request. Until some steps are applied the engine
    shows its state before the run; `kv_cache_usage_after` tells what it would show.

    (Not a dataclass: compiled with mypyc (tools/compile_sim.py), a dataclass field typed
    by a class its module imports only for type checking breaks the module's import.)
    """

    __slots__ = (
        "calls", "engine", "engine_version", "finishes", "groups", "start_s", "step_end_s",
        "step_group",
    )  # fmt: skip

    def __init__(
        self,
        *,
        engine: Engine,
        engine_version: int,
        start_s: float,
        step_end_s: Sequence[float],  # (a `StepEnds` or a list)
        groups: list[DecodeGroup],
        finishes: bool,
        calls: list[PipelineCall],  # pp > 1: every micro-batch scheduled, in order
        step_group: list[int],  # pp > 1: the group each step completes
    ) -> None:
        self.engine = engine
        self.engine_version = engine_version
        self.start_s = start_s
        self.step_end_s = step_end_s
        self.groups = groups
        self.finishes = finishes
        self.calls = calls
        self.step_group = step_group

    @property
    def num_steps(self) -> int:
        return len(self.step_end_s)

    def num_steps_started_by(self, t_s: float) -> int:
        """How many of the steps start at or before `t_s` (what stepping has run by then)."""
        if t_s < self.start_s:
            return 0
        ends = self.step_end_s
        return 1 + steps_ended_by(ends, t_s, len(ends) - 1)

    def blocks_after(self, num_steps: int) -> int:
        """KV blocks the first `num_steps` steps hand out."""
        if self.calls:
            done = [c.blocks_after for c in self.calls if c.step < num_steps]
            return done[-1] if done else 0
        group = self.groups[0]
        bs = len(group.new_blocks_by_phase)
        full, part = divmod(num_steps, bs)
        return full * len(group.members) + sum(group.new_blocks_by_phase[:part])

    def kv_cache_usage_after(self, num_steps: int) -> float:
        """The engine's KV usage once `num_steps` steps ran (before any request finishes:
        for the run's last step when `finishes`, apply the run instead)."""
        return self.engine.kv.usage_with(self.blocks_after(num_steps))


def plan_decode_run(
    engine: Engine, max_steps: int | None, until_s: float | None
) -> DecodeRun | None:
    sched = engine.scheduler
    if not sched.running or sched.preempted:
        return None
    if (max_steps is not None and max_steps < 1) or (
        until_s is not None and engine.now_s > until_s
    ):
        return None
    lora = engine.lora
    if lora is not None and (engine.config.pipeline_stages > 1 or lora.loads_pending(engine.now_s)):
        return None
    if sched.waiting and not _admission_stays_blocked(engine):  # (no call when none waits)
        return None
    if engine.config.pipeline_stages == 1:
        return _plan_one_stage(engine, max_steps, until_s)
    return _plan_pipelined(engine, max_steps, until_s)


def _make_group(
    engine: Engine, members: list[EngineRequest], in_flight: bool
) -> DecodeGroup | None:
    """The group of `members`, or None if one of them is not in a plain decode state."""
    cfg = engine.config
    if len(members) > cfg.max_num_batched_tokens:
        return None  # the token budget would split them
    bs = cfg.block_size
    max_len = cfg.max_model_len
    new_blocks = [0] * bs
    computed: list[int] = []
    finish_after = 1 << 62
    lag = 0 if in_flight else 1
    flights = int(in_flight)
    for r in members:  # (one pass per run over the batch: kept free of calls)
        c = r.num_computed_tokens
        n_tokens = r.num_prompt_tokens + r.num_output_tokens
        if c != n_tokens - lag or r.in_flight != flights or r.first_token_s is None:
            return None
        computed.append(c)  # (compiled: a bound method kept in a local is a generic call)
        out = r.num_output_tokens
        # tokens it still produces before `scheduler.finish_reason` ends it
        left = r.max_tokens - out
        if max_len - n_tokens < left:
            left = max_len - n_tokens
        stop = r.stop_after_tokens
        if stop is not None and stop - out < left:
            left = stop - out
        if left < finish_after:
            finish_after = left
        new_blocks[-c % bs] += 1  # its step k needs a block when (c + k) % bs == 0
    return DecodeGroup(
        members=members,
        computed=computed,
        in_flight=in_flight,
        new_blocks_by_phase=new_blocks,
        context_tokens=sum(computed),
        finish_after=finish_after,
    )


def _admission_stays_blocked(engine: Engine) -> bool:
    """True if no waiting request can be admitted in any step of a decode run from here.

    The limits on running requests and the token budget do not change during a run. A head
    held back by KV stays held back while the free blocks only shrink, provided its cached
    prefix cannot grow (no running request fills a block of the same chain) and either it
    needs more blocks than are free at all or its whole prompt fits one chunk (then losing
    cached blocks to eviction costs it as many new blocks as it frees).
    """
    sched = engine.scheduler
    cfg = engine.config
    if not sched.waiting:
        return True
    num_running = len(sched.running)
    if num_running >= cfg.max_num_seqs:
        return True
    budget_left = cfg.max_num_batched_tokens - num_running
    if cfg.pipeline_stages == 1 and budget_left <= 0:
        return True
    # With pp > 1 a micro-batch may hold fewer requests: the smallest chunk cap is a bound.
    cap = max(1, budget_left)
    if cfg.long_prefill_token_threshold:
        cap = min(cap, cfg.long_prefill_token_threshold)
    kv = engine.kv
    bs = kv.block_size
    head = _first_admissible(engine)
    if head is None:
        return True  # every waiting request's adapter is over max_loras until a finish
    free = kv.num_free_blocks
    num_tokens = head.num_tokens
    if free >= -(-num_tokens // bs) + -(-cap // bs):
        # Admissible now whatever its cached prefix: the blocks it needs (at most its
        # uncached tokens' or a chunk's) plus the cached ones it would take off the free
        # list (at most its whole prompt's) fit. (Spares the lookup below.)
        return False
    hits = kv.get_computed_blocks(head, peek=True)  # stepping might not look at it
    num_hits = len(hits)
    chunk = min(num_tokens - num_hits * bs, cap)
    need = -(-chunk // bs)
    if need <= free - kv.pool.num_evictable(hits):
        return False  # it may be admitted now
    if need <= free and num_tokens > cap:
        return False
    if not kv.enable_caching or num_hits >= (num_tokens - 1) // bs:
        return True
    head_hashes = head.block_hashes
    if len(head_hashes) < num_hits:  # (not stored yet: hashing them would change the head)
        head_hashes = head_hashes + head.next_block_hashes(bs, num_hits)
    for r in sched.running:
        full = r.num_computed_tokens // bs  # blocks it filled before the run
        if full > num_hits:
            continue  # the blocks it fills in the run lie past the head's next one
        if full == 0 or len(r.block_hashes) < full:
            return False
        if r.block_hashes[full - 1] == head_hashes[full - 1]:
            return False  # same chain so far: it might fill the head's next block
    return True


def _first_admissible(engine: Engine) -> EngineRequest | None:
    """The waiting request the scheduler would try first: with LoRA it skips requests whose
    adapter does not fit max_loras (and the running batch's adapters stay put in a run)."""
    lora = engine.lora
    for req in engine.scheduler.waiting:
        if lora is None or req.lora is None or lora.can_admit(req.lora):
            return req
    return None


def _steps_until_blocks_run_out(group: DecodeGroup, free_blocks: int) -> int:
    """Steps of a lone group whose block requests all fit in `free_blocks`."""
    n = len(group.members)
    full, rest = divmod(free_blocks, n)  # every member takes one block per bs steps
    k = 0
    for need in group.new_blocks_by_phase:
        if need > rest:
            break
        rest -= need
        k += 1
    return full * len(group.new_blocks_by_phase) + k


def _plan_one_stage(
    engine: Engine, max_steps: int | None, until_s: float | None
) -> DecodeRun | None:
    running = engine.scheduler.running
    group = _make_group(engine, list(running), in_flight=False)
    if group is None:
        return None
    free = engine.kv.num_free_blocks
    steps = group.finish_after
    # (the blocks run out first only if the run's members could need more than are free:
    # at most one block per member every block_size steps)
    if free < len(group.members) * -(-steps // len(group.new_blocks_by_phase)):
        steps = min(steps, _steps_until_blocks_run_out(group, free))
    if max_steps is not None:
        steps = min(steps, max_steps)
    if steps < 1:
        return None
    lora = engine.lora
    lora_s = None
    if lora is not None and lora.running:  # the same adapters every step: the same SGMV cost
        lora_s = lora.step_lora_s(len(running))
    ends = engine.decode_step_ends_s(len(running), group.context_tokens, steps, engine.now_s,
                                     lora_s)  # fmt: skip
    if until_s is not None:
        steps = min(steps, 1 + steps_ended_by(ends, until_s, steps - 1))
        ends = ends[:steps]
    return DecodeRun(
        engine=engine,
        engine_version=engine.version,
        start_s=engine.now_s,
        step_end_s=ends,
        groups=[group],
        finishes=steps == group.finish_after,
        calls=[],
        step_group=[],
    )


def _plan_pipelined(
    engine: Engine, max_steps: int | None, until_s: float | None
) -> DecodeRun | None:
    """Follow `Engine.step`'s pipeline arithmetic group by group (no per-request work)."""
    groups: list[DecodeGroup] = []
    for mb in engine.in_flight:
        if mb.batch.prefill_tokens:
            return None
        members = [r for r, _ in mb.entries if r.status is RequestStatus.RUNNING]
        group = _make_group(engine, members, in_flight=True)
        if group is None:
            return None
        groups.append(group)
    idle = [r for r in engine.scheduler.running if r.in_flight == 0]
    if sum(len(g.members) for g in groups) + len(idle) != len(engine.scheduler.running):
        return None
    ready: list[int] = []
    if idle:
        group = _make_group(engine, idle, in_flight=False)
        if group is None:
            return None
        groups.append(group)
        ready.append(len(groups) - 1)

    pp = engine.config.pipeline_stages
    bs = engine.config.block_size
    free = engine.kv.num_free_blocks
    times = engine.decode_step_times_s
    now = engine.now_s
    next_start = engine.next_start_s
    in_flight = deque((mb.end_s, g) for g, mb in enumerate(engine.in_flight))
    scheduled = [0] * len(groups)
    completed = [0] * len(groups)
    context = [g.context_tokens for g in groups]
    blocks = 0
    calls: list[PipelineCall] = []
    ends: list[float] = []
    step_group: list[int] = []
    finishes = False
    limit = max_steps if max_steps is not None else 1 << 62
    while len(ends) < limit and not finishes:
        step = len(ends)
        if step and until_s is not None and now > until_s:
            break
        stop = False
        while len(in_flight) < pp:  # Engine.step's fill loop
            start = max(now, next_start)
            if in_flight and start >= in_flight[0][0]:
                break
            if not ready:
                break
            g = ready[0]
            need = groups[g].new_blocks_by_phase[scheduled[g] % bs]
            if len(ready) > 1 or blocks + need > free:
                stop = True  # micro-batches merge, or the blocks run out: not a plain step
                break
            size = len(groups[g].members)
            step_s = times(size, context[g], 1)[0]
            end = start + step_s
            if in_flight and end < in_flight[-1][0]:
                end = in_flight[-1][0]
            next_start = start + step_s / pp
            in_flight.append((end, g))
            ready = []
            blocks += need
            calls.append(
                PipelineCall(g, scheduled[g], step, start, end, context[g], blocks, next_start)
            )
            scheduled[g] += 1
            context[g] += size
        if stop or not in_flight:
            break
        now, g = in_flight.popleft()
        ends.append(now)
        step_group.append(g)
        if groups[g].members:
            completed[g] += 1
            ready.append(g)
            finishes = completed[g] == groups[g].finish_after
    if not ends:
        return None
    return DecodeRun(
        engine=engine,
        engine_version=engine.version,
        start_s=engine.now_s,
        step_end_s=ends,
        groups=groups,
        finishes=finishes,
        calls=[c for c in calls if c.step < len(ends)],
        step_group=step_group,
    )
