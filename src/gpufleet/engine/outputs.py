"""The engine's configuration and what its calls return: plain data, no behaviour."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gpufleet.engine.request import EngineRequest
from gpufleet.perf.step_time import StepBatch


class SizedReplica(Protocol):
    """What a replica's profile (`gpufleet.plan.profile.ReplicaProfile`) says of its engine."""

    @property
    def num_gpu_blocks(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def max_num_seqs(self) -> int: ...
    @property
    def max_num_batched_tokens(self) -> int: ...
    @property
    def max_model_len(self) -> int: ...
    @property
    def pipeline_stages(self) -> int: ...


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

    @classmethod
    def of_replica(
        cls,
        profile: SizedReplica,
        *,
        enable_prefix_caching: bool = True,
        num_gpu_blocks: int | None = None,
    ) -> EngineConfig:
        """The engine of one replica as its profile sizes it: the one rule the live replica
        and the simulator share (`num_gpu_blocks` overrides the profile's KV cache)."""
        return cls(
            num_gpu_blocks=num_gpu_blocks or profile.num_gpu_blocks,
            block_size=profile.block_size,
            max_num_seqs=profile.max_num_seqs,
            max_num_batched_tokens=profile.max_num_batched_tokens,
            max_model_len=profile.max_model_len,
            pipeline_stages=profile.pipeline_stages,
            enable_prefix_caching=enable_prefix_caching,
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


class ScheduledBatch:
    """One iteration (with PP > 1: one micro-batch) as the scheduler planned it.

    `entries` holds (request, its computed tokens once this batch ends); a request whose
    count then reaches its known tokens emits one token at `end_s`. `batch` is the shape the
    step-time model priced.

    (This class and the two below are plain classes, not dataclasses: one is built per
    iteration or run, and mypyc compiles an explicit `__init__` but keeps a dataclass's
    generated one in Python, mypyc/mypyc#817.)
    """

    __slots__ = ("batch", "end_s", "entries", "num_tokens", "start_s")

    def __init__(
        self,
        entries: list[tuple[EngineRequest, int]],
        batch: StepBatch,
        start_s: float,
        end_s: float,
        num_tokens: int,
    ) -> None:
        self.entries = entries
        self.batch = batch
        self.start_s = start_s
        self.end_s = end_s
        self.num_tokens = num_tokens


class StepOutcome:
    """What one iteration did. `duration_s` is how far the engine clock moved.

    Every request in `emitted` produced exactly one token this step
    (`req.all_token_ids[-1]`). `finished` requests carry `finish_reason`.
    """

    __slots__ = ("duration_s", "emitted", "finished", "now_s", "num_scheduled_tokens", "preempted")

    def __init__(
        self,
        duration_s: float,
        now_s: float,
        emitted: list[EngineRequest] | None = None,
        finished: list[EngineRequest] | None = None,
        preempted: list[EngineRequest] | None = None,
        num_scheduled_tokens: int = 0,
    ) -> None:
        self.duration_s = duration_s
        self.now_s = now_s
        self.emitted: list[EngineRequest] = [] if emitted is None else emitted
        self.finished: list[EngineRequest] = [] if finished is None else finished
        self.preempted: list[EngineRequest] = [] if preempted is None else preempted
        self.num_scheduled_tokens = num_scheduled_tokens


class DecodeRunOutcome:
    """What a jump over `num_steps` decode steps did: the same as that many `StepOutcome`s.

    Step j ended at `step_end_s[j]`, and each request of `step_emitted(j)` produced one token
    then (with PP > 1 the pipeline's micro-batches take turns). Only the last step can
    finish requests (`finished`, at `now_s`); no request got its first token in a run.
    """

    __slots__ = (
        "duration_s",
        "finished",
        "groups",
        "now_s",
        "preempted",
        "step_end_s",
        "step_group",
    )

    def __init__(
        self,
        duration_s: float,
        now_s: float,
        step_end_s: Sequence[float],
        groups: list[list[EngineRequest]],  # requests that decode together
        step_group: list[int],  # per step, the group that emitted (empty: group 0 every step)
        finished: list[EngineRequest] | None = None,
        preempted: list[EngineRequest] | None = None,  # always empty
    ) -> None:
        self.duration_s = duration_s
        self.now_s = now_s
        self.step_end_s = step_end_s
        self.groups = groups
        self.step_group = step_group
        self.finished: list[EngineRequest] = [] if finished is None else finished
        self.preempted: list[EngineRequest] = [] if preempted is None else preempted

    @property
    def num_steps(self) -> int:
        return len(self.step_end_s)

    @property
    def emitted(self) -> list[EngineRequest]:
        """Every request that produced at least one token."""
        if not self.step_group:
            return list(self.groups[0]) if self.groups else []
        seen = sorted(set(self.step_group))
        return [r for g in seen for r in self.groups[g]]

    def step_emitted(self, step: int) -> list[EngineRequest]:
        return self.groups[self.step_group[step] if self.step_group else 0]

    def token_times_s(self, req: EngineRequest) -> list[float]:
        """When each token `req` produced in this run came out, in order."""
        out = []
        for j, end_s in enumerate(self.step_end_s):
            if req in self.step_emitted(j):
                out.append(end_s)
        return out
