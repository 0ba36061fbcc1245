"""The activation bytes an MoE layer moves per token-expert assignment, beside its weights.

The engines' fused-MoE paths (vLLM's and SGLang's Triton `fused_experts`, vLLM's DeepGEMM
path, TRT-LLM's CUTLASS MoE) run, per assignment: GEMM1 reads the token's hidden vector and
writes its gate and up rows (2 x inter); a gated-activation kernel reads those and writes
inter; GEMM2 reads inter and writes a hidden-wide partial output per assignment (vLLM's
`intermediate_cache3`, tokens x top_k x hidden); a combine kernel reads each token's top_k
partials and writes their sum. inter is the expert's intermediate size over moe_tp (each
GPU computes its slice for every assignment its EP rank receives); the hidden-wide vectors
are whole on every GPU. In decode this is small beside the expert weights; in a prefill of
thousands of tokens under MoE TP it rivals them (DeepSeek-V3 at MoE TP 8: 18 KB between the
GEMMs per assignment, 65k assignments per GPU for an 8k-token prompt, 1.2 GB a layer).
"""

from __future__ import annotations

# Whether the traffic beyond the tokens' hidden vectors in and out is modelled. Off:
# measured in wave 16 and not kept, the fit's training objective rose with it from every
# start (docs/performance-model.md, "Wave 16: MoE"; `benchmarks/plan_moe_physics.py`).
MOE_ACTIVATION_TRAFFIC = False


def moe_activation_bytes(
    hidden: int, inter_per_gpu: float, top_k: int, act_bytes: float
) -> tuple[float, float]:
    """(bytes inside the two grouped GEMMs, bytes in the kernels between them) for one
    assignment on one GPU, activations of `act_bytes` each. Off
    (`MOE_ACTIVATION_TRAFFIC`): the token's hidden vector in and out, inside the GEMMs."""
    if not MOE_ACTIVATION_TRAFFIC:
        return 2.0 * hidden * act_bytes, 0.0
    in_gemms = (2.0 * hidden + 3.0 * inter_per_gpu) * act_bytes
    between = (hidden + hidden / max(1, top_k) + 3.0 * inter_per_gpu) * act_bytes
    return in_gemms, between
