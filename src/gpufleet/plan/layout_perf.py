"""One layout's serving performance as the planner needs it: TTFT / TPOT at the traffic,
and the most it serves within the SLOs (gpufleet.perf.roofline + plan.perf_serving)."""

from __future__ import annotations

import math
from typing import Any

from gpufleet.perf.roofline import RooflineStepTimeModel
from gpufleet.perf.step_time import StepBatch
from gpufleet.plan.layout import Layout
from gpufleet.plan.memory import MemoryBreakdown
from gpufleet.plan.perf_serving import (
    ServingPrediction,
    layout_step_model,
    max_serving_concurrency_within_slo,
    predict_serving,
)
from gpufleet.plan.types import LayoutPerformance, PlanRequest


def layout_performance(
    req: PlanRequest, layout: Layout, memory: MemoryBreakdown
) -> LayoutPerformance:
    """TTFT / TPOT / SLO-meeting throughput of one replica, from gpufleet.perf.roofline
    with the engine's scheduler limits, its running requests capped by what the KV cache
    holds under its admission rule. With attention data parallelism the figures are one
    rank's latencies and the whole replica's throughput (every rank serves its clients)."""
    isl, osl = req.input_tokens, req.output_tokens
    dp = layout.dp
    common: dict[str, Any] = dict(backend=req.engine, kv_capacity_tokens=memory.kv_capacity_tokens)
    step = layout_step_model(req.model, req.gpu, layout, backend=req.engine)

    def at(concurrency: int) -> ServingPrediction:
        return predict_serving(
            req.model, req.gpu, layout, isl, osl, concurrency, step_model=step, **common
        )

    best = max_serving_concurrency_within_slo(
        req.model,
        req.gpu,
        layout,
        isl,
        osl,
        ttft_slo_s=req.ttft_slo_s,
        tpot_slo_s=req.tpot_slo_s,
        step_model=step,
        **common,
    )
    alone = at(1)
    if best is None:
        return LayoutPerformance(
            prefill_s=alone.prefill_s,
            ttft_s=alone.ttft_s,
            tpot_s=alone.tpot_s,
            steady_concurrency=1,
            max_concurrency=0,
            max_requests_per_s=0.0,
            max_output_tokens_per_s=0.0,
            allreduce_share_of_decode=_allreduce_share(step, 1, isl, osl),
            slo_met=False,
        )
    per_replica_rps = best.requests_per_s * dp
    replicas = max(1, math.ceil(req.rps / per_replica_rps))
    # Steady state at the traffic: the smallest concurrency that carries rps / replicas.
    target = req.rps / replicas / dp
    lo, hi, steady = 1, best.concurrency, best
    while lo <= hi:
        mid = (lo + hi) // 2
        p = at(mid)
        if p.requests_per_s >= target:
            steady, hi = p, mid - 1
        else:
            lo = mid + 1
    return LayoutPerformance(
        prefill_s=alone.prefill_s,
        ttft_s=steady.ttft_s,
        tpot_s=steady.tpot_s,
        steady_concurrency=steady.concurrency * dp,
        max_concurrency=best.concurrency * dp,
        max_requests_per_s=per_replica_rps,
        max_output_tokens_per_s=best.output_tokens_per_s * dp,
        allreduce_share_of_decode=_allreduce_share(step, best.concurrency, isl, osl),
        slo_met=True,
    )


def _allreduce_share(step_model: RooflineStepTimeModel, n: int, isl: int, osl: int) -> float:
    batch = StepBatch(num_decode=n, decode_context_tokens=int(n * (isl + osl / 2)))
    parts = step_model.breakdown_s(batch)
    return parts["allreduce_s"] / parts["total_s"] if parts["total_s"] > 0 else 0.0
