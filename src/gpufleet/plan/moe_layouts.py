"""Layouts of large MoE models as they are served today: experts TP-sharded or split whole
(EP) inside a node, and attention data parallelism with expert parallelism over 8 to 72
GPUs (DeepSeek-V3/R1, Kimi-K2, Qwen3-235B, GLM-4.5, MiniMax-M2, gpt-oss).

With DP attention each of dp ranks (tp GPUs each) runs attention on its own requests with
its own KV cache — attention weights and the KV of a sequence are not split further, so the
KV cache holds dp times the sequences and no all-reduce spans the group — while every MoE
layer exchanges the ranks' tokens with an all-to-all over all dp × tp GPUs (EP = the group),
at NVLink speed inside an NVLink domain (a node, or a GB200 / GB300 NVL72 rack) and over
the NIC beyond it. The search weighs each candidate by the GPUs it needs for --rps within
the SLOs, and says in numbers why the winner wins.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpufleet.perf.step_time import StepBatch
from gpufleet.plan import explain
from gpufleet.plan.layout import Layout
from gpufleet.plan.perf_serving import layout_step_model
from gpufleet.plan.types import Candidate

if TYPE_CHECKING:
    from gpufleet.plan.ladder import Ladder

GROUP_SIZES = (8, 16, 32, 64, 72)  # EP groups the search tries (GPUs per replica)
ATTENTION_TPS = (1, 2, 8)  # attention TP inside each DP rank (DP only, hybrid, TP-heavy)


def _candidate_layouts(ladder: Ladder, base: Layout) -> list[Layout]:
    req = ladder.req
    model = req.model
    assert model.moe is not None
    experts = model.moe.num_experts
    out: list[Layout] = []
    for group in GROUP_SIZES:
        if experts % group or (req.max_gpus is not None and group > req.max_gpus):
            continue
        for tp in ATTENTION_TPS:
            if group % tp or model.num_attention_heads % tp or tp > req.gpu.domain_gpus:
                continue
            if group // tp == 1:
                continue  # plain TP with EP: the in-node EP step covers it
            out.append(
                Layout(
                    tp=tp, dp=group // tp, ep=group, weight_dtype=base.weight_dtype,
                    kv_dtype=base.kv_dtype,
                )
            )  # fmt: skip
    return out


def exchange_share_of_decode(ladder: Ladder, c: Candidate) -> float:
    """The share of one decode step at the layout's best load spent exchanging tokens
    between the GPUs that hold experts (dispatch + combine), as the step-time model says."""
    req = ladder.req
    perf = c.performance
    if perf is None or not perf.slo_met:
        return 0.0
    step = layout_step_model(req.model, req.gpu, c.layout, backend=req.engine)
    n = max(1, perf.max_concurrency // c.layout.dp)
    batch = StepBatch(
        num_decode=n,
        decode_context_tokens=int(n * (req.input_tokens + req.output_tokens / 2)),
    )
    parts = step.breakdown_s(batch)
    return parts["exchange_s"] / parts["total_s"] if parts["total_s"] > 0 else 0.0


def choose_moe_layout(ladder: Ladder, chosen: Candidate) -> tuple[Candidate, list[Candidate]]:
    """Compare the layout chosen so far (TP, with experts TP-sharded or EP inside it) with
    DP-attention × EP groups of 8-72 GPUs; keep the one that serves --rps on the fewest
    GPUs (ties: fewer GPUs per replica)."""
    req = ladder.req
    model = req.model
    if model.moe is None:
        return chosen, []
    base = chosen.layout
    tried = _candidate_layouts(ladder, base) if base.pp == 1 else []
    evaluated: list[Candidate] = []
    one_replica_at = min([chosen.layout.num_gpus] if chosen.replicas == 1 else [], default=None)
    for layout in tried:
        if one_replica_at is not None and layout.num_gpus > one_replica_at:
            break  # one replica of a smaller group already serves --rps: larger cost more
        c = ladder.evaluate(layout)
        if not ladder.useful(c):
            ladder.note("moe", layout.label, False, explain.why_not(req, ladder.max_model_len, c))
            continue
        c = ladder.with_performance(c)
        evaluated.append(c)
        if c.replicas == 1 and (one_replica_at is None or c.layout.num_gpus < one_replica_at):
            one_replica_at = c.layout.num_gpus
    meeting = [c for c in [chosen, *evaluated] if c.performance and c.performance.slo_met]
    if not meeting:
        return chosen, evaluated
    # Fewest GPUs for --rps; then the most headroom per GPU; then the smaller group.
    best = min(
        meeting,
        key=lambda c: (c.total_gpus or 0, -c.output_tokens_per_s_per_gpu, c.layout.num_gpus),
    )
    base_rate = chosen.output_tokens_per_s_per_gpu
    for c in evaluated:
        if c is best:
            continue
        ladder.note("moe", c.layout.label, False, _why(req, c, best))
    if best is chosen:
        if evaluated:
            ladder.note(
                "moe", chosen.layout.label, True,
                f"experts {'whole per GPU (EP)' if base.ep > 1 else 'TP-sharded'} inside "
                f"{base.num_gpus} GPUs serve --rps {req.rps:g} on {chosen.total_gpus} GPUs, "
                f"no larger group serves it on fewer ({base_rate:.0f} output tok/s per GPU)",
            )  # fmt: skip
        return chosen, evaluated
    share = exchange_share_of_decode(ladder, best)
    fabric = "NVLink" if best.layout.stage_gpus <= req.gpu.domain_gpus else "NVLink + network"
    ladder.note(
        "moe",
        best.layout.label,
        True,
        f"{_shape(best.layout)}: {best.output_tokens_per_s_per_gpu:.0f} vs {base_rate:.0f} output "
        f"tok/s per GPU within the SLOs ({best.total_gpus} vs {chosen.total_gpus} GPUs for "
        f"--rps {req.rps:g}); each rank's KV cache holds its own requests "
        f"({best.kv_concurrent_requests} in all), the token exchange over {fabric} is "
        f"{share:.0%} of a decode step",
    )
    return best, [chosen, *[c for c in evaluated if c is not best]]


def _shape(layout: Layout) -> str:
    if layout.dp > 1:
        return (
            f"DP-attention {layout.dp} × TP {layout.tp} with EP {layout.ep} "
            f"({layout.num_gpus} GPUs)"
        )
    return f"EP {layout.ep} inside TP {layout.tp}"


def _why(req: object, c: Candidate, best: Candidate) -> str:
    from gpufleet.plan.types import PlanRequest

    assert isinstance(req, PlanRequest)
    if not (c.performance and c.performance.slo_met):
        return f"{_shape(c.layout)} {explain.perf_summary(req, c)}"
    return (
        f"{_shape(c.layout)}: --rps {req.rps:g} needs {c.total_gpus} GPUs vs "
        f"{best.total_gpus} for {best.layout.label} "
        f"({c.output_tokens_per_s_per_gpu:.0f} vs {best.output_tokens_per_s_per_gpu:.0f} "
        "output tok/s per GPU)"
    )
