"""One layout's serving performance as the planner needs it: TTFT / TPOT at the traffic,
and the most it serves within the SLOs (gpufleet.perf.roofline + plan.perf_serving)."""

from __future__ import annotations

import math
from typing import Any

from gpufleet.perf.roofline import RooflineStepTimeModel
from gpufleet.perf.step_time import StepBatch
from gpufleet.plan.layout import Layout
from gpufleet.plan.memory import default_max_num_seqs
from gpufleet.plan.perf_serving import (
    ServingPrediction,
    layout_step_model,
    max_serving_concurrency_within_slo,
    predict_serving,
)
from gpufleet.plan.types import BACKEND, LayoutPerformance, PlanRequest


def layout_performance(
    req: PlanRequest, layout: Layout, kv_concurrent_requests: int
) -> LayoutPerformance:
    """TTFT / TPOT / SLO-meeting throughput of one replica, from gpufleet.perf.roofline
    (vLLM's scheduler limits; running requests capped by what the KV cache holds)."""
    isl, osl = req.input_tokens, req.output_tokens
    common: dict[str, Any] = dict(
        backend=BACKEND,
        max_num_seqs=default_max_num_seqs(req.gpu),
        kv_capacity_tokens=max(1, kv_concurrent_requests) * req.request_tokens,
    )
    step = layout_step_model(req.model, req.gpu, layout, backend=BACKEND)

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
    replicas = max(1, math.ceil(req.rps / best.requests_per_s))
    # Steady state at the traffic: the smallest concurrency that carries rps / replicas.
    lo, hi, steady = 1, best.concurrency, best
    while lo <= hi:
        mid = (lo + hi) // 2
        p = at(mid)
        if p.requests_per_s >= req.rps / replicas:
            steady, hi = p, mid - 1
        else:
            lo = mid + 1
    return LayoutPerformance(
        prefill_s=alone.prefill_s,
        ttft_s=steady.ttft_s,
        tpot_s=steady.tpot_s,
        steady_concurrency=steady.concurrency,
        max_concurrency=best.concurrency,
        max_requests_per_s=best.requests_per_s,
        max_output_tokens_per_s=best.output_tokens_per_s,
        allreduce_share_of_decode=_allreduce_share(step, best.concurrency, isl, osl),
        slo_met=True,
    )


def _allreduce_share(step_model: RooflineStepTimeModel, n: int, isl: int, osl: int) -> float:
    batch = StepBatch(num_decode=n, decode_context_tokens=int(n * (isl + osl / 2)))
    parts = step_model.breakdown_s(batch)
    return parts["allreduce_s"] / parts["total_s"] if parts["total_s"] > 0 else 0.0
