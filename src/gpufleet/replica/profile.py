"""How a replica's engine is sized and timed for a layout: the ONE place that decides it.

`load_replica_profile` turns the replica's flags (model, GPU, TP, PP, EP, quantization,
KV dtype, limits) into a `ReplicaProfile` (step-time model, KV blocks, scheduler limits)
with the planner's memory math and roofline step-time model
(`gpufleet.plan.profile.replica_profile`), so a simulated replica is as fast and as big as
the layout `gpufleet plan` would choose.
"""

from __future__ import annotations

from gpufleet.plan.profile import ReplicaProfile, replica_profile

__all__ = ["ReplicaProfile", "load_replica_profile"]


def load_replica_profile(
    model: str,
    gpu: str,
    *,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    quant: str = "bf16",
    kv_dtype: str = "auto",
    max_model_len: int | None = 8192,
    gpu_memory_utilization: float = 0.9,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int | None = None,
) -> ReplicaProfile:
    return replica_profile(
        model,
        gpu,
        tp=tp,
        pp=pp,
        ep=ep,
        quant=quant,
        kv_dtype=kv_dtype,
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    )
