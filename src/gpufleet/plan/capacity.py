"""How many sequences one replica batches at once: the plan's "concurrent sequences".

concurrent sequences = min(max_num_seqs, KV capacity tokens // tokens per request), at
least 1. "Tokens per request" is the plan's notion of a request: its input plus output
tokens (a request holds KV for both by the time it finishes). When the expected traffic
is unknown we assume the plan's default request, 1024 in + 256 out = 1280 tokens
(`gpufleet plan`'s --input-tokens / --output-tokens defaults).

The autoscaler uses this as `capacity_per_replica`; the planner's scheduler shape
(`plan.perf_serving.scheduler_for`) caps running requests with the same function.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from gpufleet.errors import UserError

DEFAULT_INPUT_TOKENS = 1024
DEFAULT_OUTPUT_TOKENS = 256
DEFAULT_TOKENS_PER_REQUEST = DEFAULT_INPUT_TOKENS + DEFAULT_OUTPUT_TOKENS


def concurrent_sequences(
    max_num_seqs: int, kv_capacity_tokens: int, tokens_per_request: int
) -> int:
    """Requests of `tokens_per_request` tokens one replica runs at once: the scheduler's
    max_num_seqs, or fewer when the KV cache holds fewer. Pure; never below 1 (a replica
    that starts always runs one request)."""
    if max_num_seqs < 1:
        raise UserError("must be ≥ 1", field="max_num_seqs", fix="use e.g. 256")
    if tokens_per_request < 1:
        raise UserError(
            "must be ≥ 1",
            field="tokens_per_request",
            fix=f"expected input + output tokens, e.g. {DEFAULT_TOKENS_PER_REQUEST}",
        )
    if kv_capacity_tokens < 0:
        raise UserError("must be ≥ 0", field="kv_capacity_tokens", fix="from plan.memory")
    return max(1, min(max_num_seqs, kv_capacity_tokens // tokens_per_request))


@dataclass(frozen=True, slots=True)
class ReplicaCapacity:
    """A per-replica capacity and, in words, where it came from."""

    sequences: int
    source: str
    max_num_seqs: int | None = None
    kv_capacity_tokens: int | None = None
    tokens_per_request: int | None = None
    tokens_per_request_source: str | None = None

    def describe(self) -> str:
        """The source, plus where tokens per request came from (for the startup line)."""
        if self.tokens_per_request_source:
            return f"{self.source}; tokens per request: {self.tokens_per_request_source}"
        return self.source

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def replica_capacity(
    model: str,
    gpu: str,
    *,
    tp: int = 1,
    max_num_seqs: int = 256,
    max_model_len: int | None = None,
    tokens_per_request: int = DEFAULT_TOKENS_PER_REQUEST,
    tokens_source: str = "default request 1024 in + 256 out",
) -> ReplicaCapacity:
    """The concurrent sequences of one simulated replica (`gpufleet replica`'s profile)."""
    from gpufleet.plan.profile import replica_profile  # heavy-ish: model + GPU specs

    profile = replica_profile(
        model, gpu, tp=tp, max_num_seqs=max_num_seqs, max_model_len=max_model_len
    )
    kv_tokens = profile.num_gpu_blocks * profile.block_size
    seqs = concurrent_sequences(profile.max_num_seqs, kv_tokens, tokens_per_request)
    source = (
        f"plan: min(max_num_seqs {profile.max_num_seqs}, {kv_tokens} KV tokens / "
        f"{tokens_per_request} per request)"
    )
    return ReplicaCapacity(
        seqs, source, profile.max_num_seqs, kv_tokens, tokens_per_request, tokens_source
    )
