"""Speculative decoding with multi-token prediction (DeepSeek-V3 / R1's MTP module), as
TensorRT-LLM runs it (`speculative_config: {decoding_type: MTP, num_nextn_predict_layers:
k}`): every decode iteration verifies, for each running sequence, its last token plus the
k draft tokens the previous iteration proposed (k + 1 query tokens attending over the same
cached context: the GEMMs and experts see k + 1 tokens per sequence, the KV cache is read
once), then runs the MTP module k times, one draft token per pass (TensorRT-LLM's default
"MTP Eagle" path reuses the single MTP layer sequentially, inside the same CUDA graph). A
sequence emits the accepted drafts plus one token per iteration.

Acceptance: with each draft accepted with probability `a` given the one before it was,
a sequence emits 1 + a + a^2 + ... + a^k tokens per iteration (the expected accepted
prefix plus the target model's own token). `Calibration.mtp_acceptance_rate` holds `a`.
"""

from __future__ import annotations

from gpufleet.perf.step_time import StepBatch, StepTimeModel


def accepted_tokens(draft_tokens: int, acceptance_rate: float) -> float:
    """Mean tokens a sequence emits per iteration with `draft_tokens` drafts, each accepted
    with probability `acceptance_rate` when every draft before it was (1 without drafts)."""
    if draft_tokens < 0 or not 0.0 <= acceptance_rate <= 1.0:
        raise ValueError("draft_tokens must be >= 0 and acceptance_rate in [0, 1]")
    return sum(acceptance_rate**i for i in range(draft_tokens + 1))


class SpeculativeStepModel:
    """A step-time model whose decode iterations verify `draft_tokens` drafts per sequence
    and propose the next ones (`base` prices a plain iteration).

    Verification: the iteration's time plus the marginal cost of k more tokens per decoding
    sequence at no extra context (weights and cache are read once; GEMMs, experts, the
    lm_head and the per-token collectives see the extra tokens), without the base model's
    per-iteration overheads (the engine's CUDA graphs cover a batch of sequences however
    many tokens each verifies). Drafting: k passes of one decoder layer (the MTP module)
    over the decoding sequences, each priced as one layer's share of a plain decode
    iteration of them (`layers`: the target model's decoder layers)."""

    def __init__(self, base: StepTimeModel, draft_tokens: int, layers: int) -> None:
        if draft_tokens < 0 or layers < 1:
            raise ValueError("draft_tokens must be >= 0 and layers >= 1")
        self.base = base
        self.draft_tokens = draft_tokens
        self.layers = layers
        self.pipeline_stages = max(1, int(getattr(base, "pipeline_stages", 1)))

    def _without_overheads_s(self, batch: StepBatch) -> float:
        t = self.base.step_time_s(batch)
        breakdown = getattr(self.base, "breakdown_s", None)
        return t - breakdown(batch)["overhead_s"] if breakdown is not None else t

    def step_time_s(self, batch: StepBatch) -> float:
        t = self.base.step_time_s(batch)
        n, k = batch.num_decode, self.draft_tokens
        if n == 0 or k == 0:
            return t
        verify_s = self._without_overheads_s(StepBatch(num_decode=n * (k + 1)))
        verify_s -= self._without_overheads_s(StepBatch(num_decode=n))
        plain = StepBatch(num_decode=n, decode_context_tokens=batch.decode_context_tokens)
        draft_s = k * self._without_overheads_s(plain) / self.layers
        return t + max(0.0, verify_s) + draft_s
