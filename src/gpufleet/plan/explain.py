"""The words of the decision trail: why a layout was kept or rejected, in numbers."""

from __future__ import annotations

from gpufleet.plan.memory import GIB
from gpufleet.plan.types import MIN_USEFUL_CONCURRENCY, Candidate, PlanRequest


def gib(x: float) -> str:
    return f"{x / GIB:.1f} GiB"


def tokens(n: int) -> str:
    return f"{n / 1000:.0f}k" if n >= 10_000 else str(n)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def why_not(req: PlanRequest, max_model_len: int, c: Candidate) -> str:
    """Why a layout is not enough: weights that do not fit, no room for one sequence, or
    too few requests in the KV cache."""
    m = c.memory
    where = f"{c.layout.num_gpus} × {req.gpu.name}"
    if not m.weights_fit:
        room = m.usable_bytes - m.activation_bytes - m.framework_reserve_bytes
        return (
            f"{c.layout.weight_dtype} weights {gib(m.weights_bytes)} per GPU > "
            f"{gib(room)} left of {gib(m.usable_bytes)} usable on {where} "
            f"(activations {gib(m.activation_bytes)}, reserve "
            f"{gib(m.framework_reserve_bytes)})"
        )
    if not m.fits:
        return (
            f"weights {gib(m.weights_bytes)} leave {gib(m.kv_cache_bytes)} KV per GPU: "
            f"not one {max_model_len}-token sequence "
            f"({gib(m.kv_bytes_per_sequence)} each)"
        )
    return (
        f"weights {gib(m.weights_bytes)} leave {gib(m.kv_cache_bytes)} "
        f"{c.layout.kv_dtype} KV per GPU = {c.kv_concurrent_requests} requests of "
        f"{req.request_tokens} tokens (want ≥ {MIN_USEFUL_CONCURRENCY})"
    )


def why_yes(req: PlanRequest, max_model_len: int, c: Candidate) -> str:
    """What a fitting layout leaves for the KV cache and how many requests that holds."""
    m = c.memory
    return (
        f"weights {gib(m.weights_bytes)} + activations {gib(m.activation_bytes)} + "
        f"reserve {gib(m.framework_reserve_bytes)} leave {gib(m.kv_cache_bytes)} "
        f"{c.layout.kv_dtype} KV per GPU = {tokens(m.kv_capacity_tokens)} tokens, "
        f"{c.kv_concurrent_requests} requests of {req.request_tokens} tokens, "
        f"{m.max_concurrent_seqs} of {max_model_len}"
    )


def perf_summary(req: PlanRequest, c: Candidate) -> str:
    """A layout's SLO-meeting throughput, or by how much it misses the SLOs."""
    p = c.performance
    assert p is not None
    if not p.slo_met:
        return (
            f"misses the SLOs even with one request: TTFT {p.ttft_s:.2f} s "
            f"(SLO {req.ttft_slo_s} s), TPOT {p.tpot_s * 1e3:.1f} ms "
            f"(SLO {req.tpot_slo_s * 1e3:g} ms)"
        )
    return (
        f"{p.max_output_tokens_per_s:.0f} output tok/s per replica within the SLOs "
        f"({c.output_tokens_per_s_per_gpu:.0f} per GPU, {p.max_concurrency} in flight); "
        f"all-reduce {p.allreduce_share_of_decode:.0%} of the decode step"
    )
