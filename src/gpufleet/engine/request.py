"""One request as the engine tracks it (vLLM v1's `Request`, reduced to what scheduling needs)."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

from gpufleet.tokenizer import SPECIAL_TOKENS, VOCAB_SIZE

# Generated tokens are ordinary vocabulary words (never special tokens), so generated
# text re-tokenizes to exactly as many tokens as were generated.
if TYPE_CHECKING:
    from gpufleet.engine.lora import LoraAdapter

_FIRST_WORD_ID = len(SPECIAL_TOKENS)
_WORD_SPAN = VOCAB_SIZE - _FIRST_WORD_ID


class RequestStatus(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # back in the waiting queue, its KV dropped (recompute)
    FINISHED = "finished"
    ABORTED = "aborted"


class FinishReason(StrEnum):
    LENGTH = "length"  # max_tokens or max_model_len reached
    STOP = "stop"  # the model's natural end (EOS) or a stop string
    ABORT = "abort"


class EngineRequest:
    """Mutable scheduling state of one request. The engine owns it once added.

    `stop_after_tokens` models the model's own end of sequence: the request finishes
    with reason "stop" after that many tokens (None: only max_tokens ends it).
    Engine times (`arrival_s`, `first_scheduled_s`, `first_token_s`, `finished_s`) are on
    the engine's own clock, which the driver maps to wall time or to a virtual clock.
    """

    __slots__ = (
        "_rng",
        "all_token_ids",
        "arrival_s",
        "block_hashes",
        "blocks",
        "finish_reason",
        "finished_s",
        "first_scheduled_s",
        "first_token_s",
        "in_flight",
        "lora",
        "max_tokens",
        "num_cached_blocks",
        "num_computed_tokens",
        "num_output_tokens",
        "num_preemptions",
        "num_prefix_hit_tokens",
        "num_prompt_tokens",
        "prefix_hit_recorded",
        "request_id",
        "status",
        "stop_after_tokens",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        max_tokens: int,
        *,
        seed: int | None = None,
        stop_after_tokens: int | None = None,
        prompt_block_hashes: list[int] | None = None,
        arrival_s: float | None = None,
        lora: LoraAdapter | None = None,
    ):
        if not prompt_token_ids:
            raise ValueError("prompt_token_ids must not be empty")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.request_id = request_id
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.max_tokens = max_tokens
        self.stop_after_tokens = stop_after_tokens
        # Chained hashes of the full blocks of all_token_ids computed so far (the engine
        # extends them as generated tokens fill blocks).
        self.block_hashes: list[int] = list(prompt_block_hashes or [])
        self._rng = seed  # the engine fills in a seed if None
        self.arrival_s = arrival_s
        self.lora = lora  # the LoRA adapter it runs with (None: the base model)
        self.status = RequestStatus.WAITING
        self.blocks: list[int] = []
        self.num_cached_blocks = 0  # blocks[:n] are registered in the prefix cache
        self.num_computed_tokens = 0
        self.num_output_tokens = 0
        self.num_prefix_hit_tokens = 0  # prompt tokens served from the prefix cache
        self.prefix_hit_recorded = False
        self.num_preemptions = 0
        self.in_flight = 0  # micro-batches holding this request (pipeline parallel)
        self.first_scheduled_s: float | None = None
        self.first_token_s: float | None = None
        self.finished_s: float | None = None
        self.finish_reason: FinishReason | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED or self.status is RequestStatus.ABORTED

    def next_token_id(self) -> int:
        """The next generated token: a deterministic sequence from the request's seed."""
        x = ((self._rng or 0) * 1103515245 + 12345) & 0x7FFFFFFF
        self._rng = x
        return _FIRST_WORD_ID + x % _WORD_SPAN

    def seed_if_unset(self, seed: int) -> None:
        if self._rng is None:
            self._rng = seed & 0xFFFFFFFF

    def __repr__(self) -> str:
        return (
            f"EngineRequest({self.request_id!r}, status={self.status}, "
            f"tokens={self.num_tokens}, computed={self.num_computed_tokens}, "
            f"out={self.num_output_tokens}/{self.max_tokens})"
        )
