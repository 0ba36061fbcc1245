"""What the simulated model says: a deterministic function of the request's seed and its
context, so that continuing a partial answer gives the rest of the same answer.

A real engine decoding greedily (or sampling with a fixed seed) continues "prompt + the
first k tokens of its answer" with token k + 1 of that same answer; a gateway that
resumes a stream on another replica relies on it. The simulated replica does the same:
the next token is a hash of the request's seed, the position in the sequence and the
last 8 tokens, never of where the prompt ended. With a request `seed`, the answer is
the same on every replica and after every resume; without one, each request gets its own
seed from the engine, as sampling without a seed would.
"""

from __future__ import annotations

import zlib

from gpufleet.engine import EngineRequest
from gpufleet.tokenizer import SPECIAL_TOKENS, VOCAB_SIZE

_FIRST_WORD_ID = len(SPECIAL_TOKENS)  # generated tokens are ordinary words
_WORD_SPAN = VOCAB_SIZE - _FIRST_WORD_ID
_CONTEXT_TOKENS = 8


class ContextSeededRequest(EngineRequest):
    """An engine request whose next token depends on its seed and context only."""

    __slots__ = ()

    def next_token_id(self) -> int:
        ids = self.all_token_ids
        # tuple hashes of ints are the same in every process (no hash randomization)
        return _FIRST_WORD_ID + hash((self._rng, len(ids), *ids[-_CONTEXT_TOKENS:])) % _WORD_SPAN


def request_seed(seed: int | None) -> int | None:
    """The engine seed of a request with this `seed` (None: the engine picks one)."""
    return None if seed is None else zlib.crc32(b"gpufleet-seed:%d" % seed)


def expected_answer(prompt_ids: list[int], seed: int, max_tokens: int) -> list[int]:
    """The token ids a replica answers `prompt_ids` with, given this request `seed` and
    `max_tokens` (and no natural end: `ignore_eos`, or max_tokens below it): what a test
    compares a streamed, possibly resumed, answer with."""
    req = ContextSeededRequest("expected", prompt_ids, max_tokens, seed=request_seed(seed))
    for _ in range(max_tokens):
        req.all_token_ids.append(req.next_token_id())
    return req.all_token_ids[len(prompt_ids) :]
