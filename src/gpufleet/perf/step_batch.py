"""The shape of one engine iteration (`StepBatch`), what a step-time model prices.

Its own module so that tools/compile_sim.py can compile it with the engine that builds
one every iteration (step_time.py holds runtime-checkable Protocols, which mypyc cannot
compile); `gpufleet.perf.step_time` re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, init=False)  # (`__init__` below: compiled)
class StepBatch:
    """The shape of one engine iteration, in aggregates cheap to build every step.

    prefill_tokens[i] new tokens of prefill chunk i, which attend over
    prefill_context_tokens[i] tokens already cached plus themselves.
    num_decode sequences decode one token each; decode_context_tokens is the sum of their
    KV lengths (attention reads that many tokens' K and V).
    """

    prefill_tokens: tuple[int, ...] = ()
    prefill_context_tokens: tuple[int, ...] = ()
    num_decode: int = 0
    decode_context_tokens: int = 0

    def __init__(
        self,
        prefill_tokens: tuple[int, ...] = (),
        prefill_context_tokens: tuple[int, ...] = (),
        num_decode: int = 0,
        decode_context_tokens: int = 0,
    ) -> None:
        # The frozen dataclass's own `__init__`, written out: mypyc leaves a generated one
        # interpreted (mypyc/mypyc#817), ~7,000 instructions an iteration.
        setattr_ = object.__setattr__
        setattr_(self, "prefill_tokens", prefill_tokens)
        setattr_(self, "prefill_context_tokens", prefill_context_tokens)
        setattr_(self, "num_decode", num_decode)
        setattr_(self, "decode_context_tokens", decode_context_tokens)

    @property
    def num_tokens(self) -> int:
        return sum(self.prefill_tokens) + self.num_decode

    @property
    def num_seqs(self) -> int:
        return len(self.prefill_tokens) + self.num_decode
