"""One request as the engine tracks it (vLLM v1's `Request`, reduced to what scheduling needs)."""

from __future__ import annotations

from enum import StrEnum
from itertools import groupby
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import numpy.typing as npt

from gpufleet.hash_runs import HashChain, Runs, runs_known
from gpufleet.native import mypyc_attr
from gpufleet.tokenizer import SPECIAL_TOKENS, VOCAB_SIZE

# Generated tokens are ordinary vocabulary words (never special tokens), so generated
# text re-tokenizes to exactly as many tokens as were generated.
if TYPE_CHECKING:
    from gpufleet.engine.lora import LoraAdapter

_FIRST_WORD_ID = len(SPECIAL_TOKENS)
_WORD_SPAN = VOCAB_SIZE - _FIRST_WORD_ID
# The token generator: x <- (x * _LCG_MUL + _LCG_ADD) mod 2^31.
_LCG_MUL = 1103515245
_LCG_ADD = 12345
_LCG_MASK = 0x7FFFFFFF
# Runs of at least this many tokens are generated with numpy (k steps at once: x_k =
# (MUL^k * x + ADD_k) mod 2^31 from precomputed tables), shorter ones in a Python loop.
_VECTOR_MIN_TOKENS = 48
_ANSWER_BLOCK = -0x5EED  # tags a `CountedOutputRequest`'s answer blocks in their hashes


class _LcgJumps:
    """MUL^k and ADD_k = ADD * (MUL^(k-1) + ... + 1), both mod 2^31, for k = 0..len-1."""

    mul: ClassVar[npt.NDArray[np.uint64]] = np.ones(1, dtype=np.uint64)
    add: ClassVar[npt.NDArray[np.uint64]] = np.zeros(1, dtype=np.uint64)

    @classmethod
    def upto(cls, n: int) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
        have = len(cls.mul)
        if have <= n:
            size = max(n + 1, 2 * have)
            mul, add = cls.mul.tolist(), cls.add.tolist()
            m, a = mul[-1], add[-1]
            for _ in range(size - have):
                m = (m * _LCG_MUL) & _LCG_MASK
                a = (a * _LCG_MUL + _LCG_ADD) & _LCG_MASK
                mul.append(m)
                add.append(a)
            cls.mul = np.array(mul, dtype=np.uint64)
            cls.add = np.array(add, dtype=np.uint64)
        return cls.mul, cls.add


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


@mypyc_attr(allow_interpreted_subclasses=True)  # (compiled: the replica's requests are not)
class EngineRequest:
    """Mutable scheduling state of one request. The engine owns it once added.

    `stop_after_tokens` models the model's own end of sequence: the request finishes
    with reason "stop" after that many tokens (None: only max_tokens ends it).
    Engine times (`arrival_s`, `first_scheduled_s`, `first_token_s`, `finished_s`) are on
    the engine's own clock, which the driver maps to wall time or to a virtual clock.
    """

    __slots__ = (
        "_rng",
        "_token_ids",
        "answer_base",
        "arrival_s",
        "block_hashes",
        "finish_reason",
        "finished_s",
        "first_scheduled_s",
        "first_token_s",
        "in_flight",
        "lora",
        "max_tokens",
        "num_computed_tokens",
        "num_output_tokens",
        "num_preemptions",
        "num_prefix_hit_tokens",
        "num_prompt_tokens",
        "prefix_hit_recorded",
        "prompt_runs",
        "request_id",
        "status",
        "stop_after_tokens",
    )

    counted_output = False  # `CountedOutputRequest`: generated token ids are placeholders

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
        copy: bool = True,
        prompt_block_runs: Runs | None = None,
    ):
        if not prompt_token_ids:
            raise ValueError("prompt_token_ids must not be empty")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.request_id = request_id
        # (copy=False: the caller hands the list over and never changes it again)
        self.all_token_ids = list(prompt_token_ids) if copy else prompt_token_ids
        self.num_prompt_tokens = len(prompt_token_ids)
        self.max_tokens = max_tokens
        self.stop_after_tokens = stop_after_tokens
        # Chained hashes of the full blocks of all_token_ids computed so far (the engine
        # extends them as generated tokens fill blocks).
        # Their runs of consecutive ints, when the maker knows them (`RunList`, or the
        # runs alone: the chain is then held as its runs, `HashChain`; never changed).
        if prompt_block_runs:
            self.block_hashes: list[int] | HashChain = HashChain(prompt_block_runs)
            self.prompt_runs: Runs | None = prompt_block_runs
        else:
            self.block_hashes = list(prompt_block_hashes or [])
            self.prompt_runs = runs_known(prompt_block_hashes) if prompt_block_hashes else None
        self._rng = seed  # the engine fills in a seed if None
        self.answer_base: int | None = None  # (a `CountedOutputRequest`'s, once known)
        self.arrival_s = arrival_s
        self.lora = lora  # the LoRA adapter it runs with (None: the base model)
        self.status = RequestStatus.WAITING
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
        """Prompt + generated tokens (the engine keeps `num_prompt_tokens +
        num_output_tokens` equal to it, and reads that sum in its hottest loops)."""
        return len(self.all_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        """The prompt's ids, then the generated ones. (A property, not a slot, so that a
        counted request's own one is read in compiled code too: mypyc reads a slot
        directly, past a subclass's property.)"""
        return self._token_ids

    @all_token_ids.setter
    def all_token_ids(self, tokens: list[int]) -> None:
        self._token_ids = tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED or self.status is RequestStatus.ABORTED

    def next_token_id(self) -> int:
        """The next generated token: a deterministic sequence from the request's seed."""
        x = ((self._rng or 0) * _LCG_MUL + _LCG_ADD) & _LCG_MASK
        self._rng = x
        return _FIRST_WORD_ID + x % _WORD_SPAN

    def generate_tokens(self, n: int) -> None:
        """Append the next `n` generated tokens (`next_token_id` n times, in one call)."""
        if n <= 0:
            return
        x = self._rng or 0
        if n >= _VECTOR_MIN_TOKENS:
            mul, add = _LcgJumps.upto(n)
            states = (mul[1 : n + 1] * np.uint64(x) + add[1 : n + 1]) & np.uint64(_LCG_MASK)
            self.all_token_ids.extend((states % _WORD_SPAN + _FIRST_WORD_ID).tolist())
            self._rng = int(states[-1])
            return
        append = self.all_token_ids.append
        for _ in range(n):
            x = (x * _LCG_MUL + _LCG_ADD) & _LCG_MASK
            append(_FIRST_WORD_ID + x % _WORD_SPAN)
        self._rng = x

    def extend_block_hashes(self, block_size: int, max_blocks: int | None = None) -> None:
        """Hash the full blocks of the known tokens (prompt and generated) not hashed yet, up
        to `max_blocks` in all, chained as `gpufleet.tokenizer.block_hashes` chains them."""
        hashes = self.block_hashes
        stop = self.num_tokens // block_size
        if max_blocks is not None and max_blocks < stop:
            stop = max_blocks
        if len(hashes) < stop:
            hashes += self.next_block_hashes(block_size, stop)

    def next_block_hashes(self, block_size: int, stop: int) -> list[int]:
        """The chained hashes of blocks len(block_hashes)..stop-1 (all full), not stored."""
        hashes = self.block_hashes
        tokens = self.all_token_ids  # (a counted request asks for its prompt blocks only)
        h = hashes[-1] if hashes else 0
        out: list[int] = []
        append = out.append
        for first in range(len(hashes) * block_size, stop * block_size, block_size):
            h = hash((h, *tokens[first : first + block_size]))
            append(h)
        return out

    def seed_if_unset(self, seed: int) -> None:
        if self._rng is None:
            self._rng = seed & 0xFFFFFFFF

    def __repr__(self) -> str:
        return (
            f"EngineRequest({self.request_id!r}, status={self.status}, "
            f"tokens={self.num_tokens}, computed={self.num_computed_tokens}, "
            f"out={self.num_output_tokens}/{self.max_tokens})"
        )


def counted_tokens(n: int) -> list[int]:
    """The `n` placeholder tokens a `CountedOutputRequest` generates."""
    return [_FIRST_WORD_ID] * n


COUNTED_TOKEN = _FIRST_WORD_ID  # (what `counted_tokens` repeats)
# A prompt of repeated tokens as (token id, count) spans: the simulator's prompts are
# placeholders and earlier answers, so they are a few spans, not thousands of ids.
TokenSpans = tuple[tuple[int, int], ...]


def span_tokens(spans: TokenSpans) -> list[int]:
    """The token ids the spans stand for."""
    out: list[int] = []
    for token, count in spans:
        out += [token] * count
    return out


_SPANS_PENDING = [_FIRST_WORD_ID]  # (`of_spans` replaces it at once; never changed)


def generate_tokens_for(requests: list[EngineRequest], n: int) -> None:
    """`generate_tokens(n)` for each of `requests`, with one numpy pass when that is many
    tokens (a decode run of a whole batch)."""
    if n <= 0:
        return
    real: list[EngineRequest] = []
    for r in requests:  # (a counted answer is its count: nothing to store)
        if not r.counted_output:
            real.append(r)
    if not real:
        return
    requests = real
    if n * len(requests) < _VECTOR_MIN_TOKENS or n < 4:
        for r in requests:
            r.generate_tokens(n)
        return
    mul, add = _LcgJumps.upto(n)
    seeds = np.array([r._rng or 0 for r in requests], dtype=np.uint64)
    states = (mul[None, 1 : n + 1] * seeds[:, None] + add[None, 1 : n + 1]) & np.uint64(_LCG_MASK)
    rows = (states % _WORD_SPAN + _FIRST_WORD_ID).tolist()
    for r, tokens, x in zip(requests, rows, states[:, -1].tolist(), strict=True):
        r.all_token_ids.extend(tokens)
        r._rng = x


class CountedOutputRequest(EngineRequest):
    """A request whose answer only counts (the simulator's): its generated tokens are one
    placeholder word, and a block holding any of them hashes by (parent hash, seed,
    position) instead of by its token ids. Two answers' blocks are equal exactly when
    their prefixes and seeds are (as the seeded token ids would be), so the prefix cache
    behaves the same, while the cost of an answer no longer grows with its tokens.

    Its tokens are held virtually: the prompt list (never changed: with `copy=False` the
    caller's own list) and `num_output_tokens` placeholders after it, so decoding grows
    no list; `all_token_ids` builds the whole list when asked (the same values)."""

    __slots__ = ("_prompt",)
    counted_output = True
    _prompt: list[int] | TokenSpans  # the prompt's ids, or its spans (`of_spans`)

    @staticmethod
    def of_spans(
        request_id: str,
        spans: TokenSpans,
        max_tokens: int,
        *,
        seed: int | None = None,
        prompt_block_hashes: list[int] | None = None,
        arrival_s: float | None = None,
        prompt_block_runs: Runs | None = None,
    ) -> CountedOutputRequest:
        """A request whose prompt is `spans` (its ids are built only if read: the engine
        reads the prompt's length and block hashes, given here, not its ids).

        (The class named, not `cls`: compiled, `cls(...)` is a generic call through
        `type`, which ran the compiled `__init__` twice, once from `tp_new` and once as
        `tp_init`, parsing its keywords each time: ~15,000 instructions a request; named,
        it is one native call.)"""
        num_prompt_tokens = sum(count for _, count in spans if count > 0)
        if not num_prompt_tokens:
            raise ValueError("prompt_token_ids must not be empty")
        req = CountedOutputRequest(
            request_id,
            _SPANS_PENDING,
            max_tokens,
            seed=seed,
            prompt_block_hashes=prompt_block_hashes,
            arrival_s=arrival_s,
            copy=False,
            prompt_block_runs=prompt_block_runs,
        )
        req._prompt = spans
        req.num_prompt_tokens = num_prompt_tokens
        return req

    @property
    def prompt_token_ids(self) -> list[int]:
        prompt = self._prompt
        return prompt if isinstance(prompt, list) else span_tokens(prompt)

    @property
    def prompt_spans(self) -> TokenSpans:
        prompt = self._prompt
        if isinstance(prompt, tuple):
            return prompt
        return tuple((token, len(list(same))) for token, same in groupby(prompt))

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + counted_tokens(self.num_output_tokens)

    @all_token_ids.setter
    def all_token_ids(self, prompt: list[int]) -> None:
        # (only `__init__` sets it, to the prompt: generated tokens are counted)
        self._prompt = prompt

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return counted_tokens(self.num_output_tokens)

    def next_token_id(self) -> int:
        return _FIRST_WORD_ID

    def generate_tokens(self, n: int) -> None:
        pass  # (`num_output_tokens` counts them; the engine advances it)

    def next_block_hashes(self, block_size: int, stop: int) -> list[int]:
        # Blocks before `first_answer` hold prompt tokens only; block j from there on
        # hashes as base + j, base a hash of (the prompt's chain, answer tag, seed).
        hashes = self.block_hashes
        start = len(hashes)
        first_answer = self.num_prompt_tokens // block_size
        if start >= first_answer:  # (the usual case: the prompt is hashed, only answers)
            if stop <= start:
                return []
            base = self.answer_base
            if base is None:  # (kept once seeded: the prompt's hashes do not change)
                parent = hashes[first_answer - 1] if first_answer else 0
                base = hash((parent, _ANSWER_BLOCK, self._rng or 0))
                if self._rng is not None:
                    self.answer_base = base
            return list(range(base + start, base + stop))
        out = super().next_block_hashes(block_size, min(stop, first_answer))
        if stop > first_answer:
            last = first_answer - 1  # the prompt's last full block
            parent = (
                0 if last < 0 else out[last - start] if last >= start else self.block_hashes[last]
            )
            base = hash((parent, _ANSWER_BLOCK, self._rng or 0))
            out += range(base + max(start, first_answer), base + stop)
        return out
