"""Applying a planned decode run (see `gpufleet.engine.decode_run`). Pure.

Each request gets its run's tokens at once; the KV manager gets, in the order the steps
would have made them, only the block requests where something happens (a block handed
out at a boundary, a full block registered); the clock, the counters and (with PP > 1) the
micro-batches in flight end as the last applied `step()` would leave them.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from gpufleet.engine.decode_run import DecodeGroup, DecodeRun, PipelineCall
from gpufleet.engine.outputs import DecodeRunOutcome, ScheduledBatch
from gpufleet.engine.request import (
    EngineRequest,
    RequestStatus,
    generate_tokens_for,
)
from gpufleet.engine.scheduler import finish_reason
from gpufleet.perf.step_time import StepBatch

if TYPE_CHECKING:
    from gpufleet.engine.engine import Engine


def apply_decode_run(engine: Engine, run: DecodeRun, num_steps: int) -> DecodeRunOutcome:
    """Perform the first `num_steps` steps of `run`, a run of pipeline stages (validated
    by `Engine.run_decode`, which hands one-stage runs to `apply_one_stage`)."""
    assert run.calls or run.step_group, "a one-stage run: apply_one_stage"
    bs = engine.config.block_size
    groups = run.groups
    calls = [c for c in run.calls if c.step < num_steps]
    emitted = [0] * len(groups)
    for g in run.step_group[:num_steps]:
        emitted[g] += 1
    scheduled = [0] * len(groups)
    for call in calls:
        scheduled[call.group] += 1
    generated = 0
    for g, group in enumerate(groups):
        out, steps = emitted[g], scheduled[g]
        generate_tokens_for(group.members, out)
        in_flight = int(group.in_flight) + steps - out
        computed_of = group.computed
        for i, r in enumerate(group.members):  # (a zip with strict= is a generic call)
            r.num_output_tokens += out
            r.num_computed_tokens = computed_of[i] + steps
            r.in_flight = in_flight
        generated += out * len(group.members)
    if (
        calls
        or run.step_group
        or not engine.kv.allocate_decode_run(groups[0].members, groups[0].computed, num_steps)
    ):
        caching = engine.config.enable_prefix_caching
        engine.kv.allocate_decode_slots(_slots(run, calls, num_steps, bs, caching))

    now_s = run.step_end_s[num_steps - 1]
    if calls or run.step_group:
        _rebuild_pipeline(engine, run, calls, num_steps)
    else:
        engine.next_start_s = now_s  # start + step_s / 1
    sched = engine.scheduler
    sched.generation_tokens += generated
    engine.num_steps += num_steps
    engine.now_s = now_s
    finished: list[EngineRequest] = []
    if num_steps == run.num_steps and run.finishes:
        last = groups[run.step_group[-1] if run.step_group else 0]
        max_len = engine.config.max_model_len
        for r in last.members:
            reason = finish_reason(r, max_len)
            if reason is not None:
                sched.finish(r, reason, now_s)
                finished.append(r)
        sched.running = [r for r in sched.running if r.status is RequestStatus.RUNNING]
    whole = num_steps == run.num_steps  # (a plan is applied once: its lists are handed on)
    return DecodeRunOutcome(
        duration_s=now_s - run.start_s,
        now_s=now_s,
        step_end_s=run.step_end_s if whole else run.step_end_s[:num_steps],
        groups=[list(g.members) for g in groups],
        step_group=run.step_group if whole else run.step_group[:num_steps],
        finished=finished,
    )


def apply_one_stage(engine: Engine, run: DecodeRun, n: int) -> DecodeRunOutcome:
    """`apply_decode_run` without pipeline stages: one group decodes every step (the
    simulator's hot path, so written out lean)."""
    group = run.groups[0]
    members = group.members
    computed_of = group.computed
    for i, r in enumerate(members):  # (compiled, a zip with strict= is a generic call)
        r.num_output_tokens += n
        r.num_computed_tokens = computed_of[i] + n
        # (r.in_flight stays 0: nothing is in flight between steps without PP)
    generate_tokens_for(members, n)  # (token ids do not depend on the counters)
    kv = engine.kv
    if not kv.allocate_decode_run(members, group.computed, n):
        caching = engine.config.enable_prefix_caching
        kv.allocate_decode_slots(_slots(run, [], n, engine.config.block_size, caching))
    ends = run.step_end_s
    now_s = ends[n - 1]
    engine.next_start_s = now_s  # start + step_s / 1
    sched = engine.scheduler
    sched.generation_tokens += n * len(members)
    engine.num_steps += n
    engine.now_s = now_s
    finished: list[EngineRequest] = []
    whole = n == len(ends)
    if whole and run.finishes:
        max_len = engine.config.max_model_len
        for r in members:
            reason = finish_reason(r, max_len)
            if reason is not None:
                sched.finish(r, reason, now_s)
                finished.append(r)
        running = RequestStatus.RUNNING
        sched.running = [r for r in sched.running if r.status is running]
    return DecodeRunOutcome(
        duration_s=now_s - run.start_s,
        now_s=now_s,
        step_end_s=ends if whole else ends[:n],  # (a plan is applied once: handed on)
        groups=[members],  # (the plan's own list: nothing else holds it)
        step_group=[],
        finished=finished,
    )


def _slots(
    run: DecodeRun, calls: list[PipelineCall], num_steps: int, bs: int, caching: bool
) -> list[tuple[EngineRequest, int]]:
    """(request, computed tokens after the step) wherever a step hands out or fills a
    block, in the order the steps would have asked the KV manager."""
    out: list[tuple[EngineRequest, int]] = []
    phases_of = [g.slots_by_phase(bs, caching) for g in run.groups]
    if not calls and not run.step_group:
        phases = phases_of[0]
        for k in range(num_steps):
            for r, c in phases[k % bs]:
                out.append((r, c + k + 1))
        return out
    for call in calls:
        k = call.index
        for r, c in phases_of[call.group][k % bs]:
            out.append((r, c + k + 1))
    return out


def _rebuild_pipeline(
    engine: Engine, run: DecodeRun, calls: list[PipelineCall], num_steps: int
) -> None:
    """The micro-batches in flight after `num_steps` steps, as `Engine.step` leaves them."""
    before = list(engine.in_flight)
    for mb in before[:num_steps]:  # completed in the run: aborted entries drop their count
        for r, _ in mb.entries:
            if r.status is not RequestStatus.RUNNING:
                r.in_flight -= 1
    batches = before + [_batch_of(run.groups[c.group], c) for c in calls]
    engine.in_flight = deque(batches[num_steps:])
    if calls:
        engine.next_start_s = calls[-1].next_start_s


def _batch_of(group: DecodeGroup, call: PipelineCall) -> ScheduledBatch:
    size = len(group.members)
    return ScheduledBatch(
        entries=[(r, group.computed[i] + call.index + 1) for i, r in enumerate(group.members)],
        batch=StepBatch(num_decode=size, decode_context_tokens=call.context_tokens),
        start_s=call.start_s,
        end_s=call.end_s,
        num_tokens=size,
    )
