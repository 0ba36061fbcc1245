"""Disaggregated prefill / decode as a planned option: x prefill replicas and y decode
replicas of their own layouts, the KV cache of each prompt sent from one to the other.

* A prefill replica runs prompt batches back to back (no decodes beside them). Its TTFT at
  a utilisation ρ is the wait for the batch in progress and the ones queued ahead (an
  M/D/1 queue: ρ / (2(1 - ρ)) batches), its own prefill, the KV transfer and the decode
  replica's first step; the highest ρ meeting the TTFT SLO sets its prompts per second.
* A decode replica runs decode iterations only, so TPOT is its step time: the most
  requests it runs within the TPOT SLO (and its KV cache) set its requests per second.
* The KV transfer moves every layer's cache of the prompt (MLA: the latent; GQA: all KV
  heads) from the prefill GPUs to the decode GPUs in parallel, one RDMA stream per GPU pair
  (NIXL over the NIC), or over NVLink when both sit in one NVLink domain (GB200 / GB300
  NVL72), plus a fixed per-request hand-off (registration, notification).

x = ceil(rps / prefill rate), y = ceil(rps / decode rate); the option is compared with
aggregated serving of the same traffic by GPUs needed and output tokens per second per GPU.
Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import replace

from gpufleet.perf.step_time import StepBatch, StepTimeModel
from gpufleet.plan.engines import engine_rules
from gpufleet.plan.layout import Layout
from gpufleet.plan.perf_serving import layout_step_model
from gpufleet.plan.types import Candidate, DisaggPlan, PlanRequest, Pool

KV_HANDOFF_S = 1e-3  # per request: block registration, the transfer's notifications


def kv_bytes_per_prompt(req: PlanRequest, kv_dtype_bytes: float) -> float:
    """The whole model's KV cache of one prompt (every layer, every KV head; MLA: the
    latent; sliding-window layers: their window)."""
    per_token = req.model.kv_breakdown(kv_dtype_bytes, tp=1)
    return per_token.bytes_for_sequence(req.input_tokens)


def _prefill_rate(
    req: PlanRequest, step: StepTimeModel, budget: int, extra_s: float, overhead_s: float
) -> tuple[float, float] | None:
    """(prompts/s per replica, TTFT there) at the highest load meeting the TTFT SLO."""
    isl = req.input_tokens
    per_batch = max(1, budget // isl)
    if budget >= isl:
        batch = StepBatch(
            prefill_tokens=(isl,) * per_batch, prefill_context_tokens=(0,) * per_batch
        )
        batch_s = step.step_time_s(batch)
        own_s = step.step_time_s(StepBatch(prefill_tokens=(isl,), prefill_context_tokens=(0,)))
    else:
        chunks = math.ceil(isl / budget)
        chunk = StepBatch(prefill_tokens=(budget,), prefill_context_tokens=(isl // 2,))
        own_s = batch_s = chunks * step.step_time_s(chunk)
        per_batch = 1
    capacity = per_batch / batch_s
    base = overhead_s + own_s + extra_s
    if base > req.ttft_slo_s:
        return None
    lo, hi = 0.0, 0.999
    for _ in range(30):  # the highest utilisation whose queueing keeps TTFT in the SLO
        mid = (lo + hi) / 2
        wait = mid / (2 * (1 - mid)) * batch_s
        if base + wait <= req.ttft_slo_s:
            lo = mid
        else:
            hi = mid
    wait = lo / (2 * (1 - lo)) * batch_s
    return capacity * lo, base + wait


def _decode_rate(
    req: PlanRequest, step: StepTimeModel, max_running: int
) -> tuple[float, float] | None:
    """(requests/s per replica, TPOT) at the most requests meeting the TPOT SLO."""
    ctx = req.input_tokens + req.output_tokens / 2

    def tpot(n: int) -> float:
        return step.step_time_s(StepBatch(num_decode=n, decode_context_tokens=int(n * ctx)))

    if max_running < 1 or tpot(1) > req.tpot_slo_s:
        return None
    lo, hi = 1, max_running
    if tpot(hi) <= req.tpot_slo_s:
        lo = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tpot(mid) <= req.tpot_slo_s:
            lo = mid
        else:
            hi = mid
    t = tpot(lo)
    return lo / (req.output_tokens * t), t


def _kv_transfer_s(req: PlanRequest, p: Layout, d: Layout, link_gbps: float) -> float:
    """One prompt's KV cache from its prefill GPUs to its decode GPUs, one stream per GPU
    pair in parallel, plus the hand-off."""
    kv_bytes = kv_bytes_per_prompt(req, d.kv_dtype_bytes)
    streams = min(p.stage_gpus // p.dp, d.stage_gpus // d.dp)  # one rank's GPUs each side
    return KV_HANDOFF_S + kv_bytes / (streams * link_gbps * 1e9)


def _pairing(
    req: PlanRequest, p: Candidate, d: Candidate, ttft_overhead_s: float
) -> DisaggPlan | None:
    """x prefill replicas of p and y decode replicas of d for --rps, or None."""
    rules_p = engine_rules(req.engine, req.gpu, tp=p.layout.tp, dp=p.layout.dp)
    rules_d = engine_rules(req.engine, req.gpu, tp=d.layout.tp, dp=d.layout.dp)
    step_p = layout_step_model(req.model, req.gpu, p.layout, backend=req.engine)
    step_d = layout_step_model(req.model, req.gpu, d.layout, backend=req.engine)
    first_decode_s = step_d.step_time_s(
        StepBatch(num_decode=1, decode_context_tokens=req.input_tokens)
    )
    running = max(1, d.kv_concurrent_requests // d.layout.dp)
    dec = _decode_rate(req, step_d, min(running, rules_d.max_num_seqs))
    if dec is None:
        return None
    # NVLink when both pools fit one NVLink domain (GB200 / GB300 NVL72), else the NIC.
    links = [req.gpu.network_gbps]
    if p.layout.num_gpus + d.layout.num_gpus <= req.gpu.domain_gpus:
        links.insert(0, req.gpu.intra_node_gbps)
    for link in links:
        kv_s = _kv_transfer_s(req, p.layout, d.layout, link)
        pre = _prefill_rate(
            req, step_p, rules_p.max_num_batched_tokens, kv_s + first_decode_s, ttft_overhead_s
        )
        if pre is None or pre[0] <= 0:
            continue
        prefill_rps = pre[0] * p.layout.dp  # each attention-DP rank prefills its own prompts
        decode_rps = dec[0] * d.layout.dp
        x = max(1, math.ceil(req.rps / prefill_rps))
        y = max(1, math.ceil(req.rps / decode_rps))
        gpus = x * p.layout.num_gpus + y * d.layout.num_gpus
        if link != req.gpu.network_gbps and gpus > req.gpu.domain_gpus:
            continue  # the pools outgrow the NVLink domain: the NIC carries the KV
        if req.max_gpus is not None and gpus > req.max_gpus:
            return None
        agg = req.rps * req.output_tokens
        return DisaggPlan(
            prefill=Pool(p.layout, x, prefill_rps, pre[1]),
            decode=Pool(d.layout, y, decode_rps, dec[1]),
            kv_bytes_per_request=kv_bytes_per_prompt(req, d.layout.kv_dtype_bytes),
            kv_link_gbps=link,
            kv_transfer_s=kv_s,
            ttft_s=pre[1],
            tpot_s=dec[1],
            total_gpus=gpus,
            output_tokens_per_s_per_gpu=agg / gpus,
            aggregated_gpus=None,
            aggregated_tokens_per_s_per_gpu=0.0,
            wins=False,
            reason="",
        )
    return None


def plan_disaggregated(
    req: PlanRequest,
    aggregated: Candidate | None,
    candidates: list[Candidate],
    ttft_overhead_s: float,
) -> DisaggPlan | None:
    """The pairing of prefill and decode layouts (among `candidates`, the layouts the search
    found useful) that serves --rps on the fewest GPUs, compared with `aggregated` (the
    aggregated plan's choice; None when none meets the SLOs). None when no pairing meets
    the SLOs."""
    pool = [c for c in candidates if c.layout.pp == 1]
    best: DisaggPlan | None = None
    for p in pool:
        for d in pool:
            found = _pairing(req, p, d, ttft_overhead_s)
            if found is not None and (best is None or found.total_gpus < best.total_gpus):
                best = found
    if best is None:
        return None
    agg_gpus = aggregated.total_gpus if aggregated is not None else None
    perf = aggregated.performance if aggregated is not None else None
    if perf is None or not perf.slo_met or agg_gpus is None:
        wins = True
        reason = (
            f"aggregated serving misses the SLOs; {best.prefill.replicas} prefill + "
            f"{best.decode.replicas} decode replicas meet them on {best.total_gpus} GPUs"
        )
        agg_gpus = None
    else:
        wins = best.total_gpus < agg_gpus
        verdict = "disaggregated wins" if wins else "aggregated needs no more"
        reason = (
            f"{best.total_gpus} vs {agg_gpus} GPUs for --rps {req.rps:g} ({verdict}): decode "
            f"replicas free of prefills run {best.decode.requests_per_s_per_replica:.2f} req/s "
            f"each at TPOT {best.tpot_s * 1e3:.1f} ms; each prompt's KV "
            f"({best.kv_bytes_per_request / 2**20:.0f} MiB) crosses "
            f"{'NVLink' if best.kv_link_gbps == req.gpu.intra_node_gbps else 'the network'} "
            f"in {best.kv_transfer_s * 1e3:.1f} ms"
        )
    agg_rate = req.rps * req.output_tokens / agg_gpus if agg_gpus else 0.0
    return replace(
        best,
        aggregated_gpus=agg_gpus,
        aggregated_tokens_per_s_per_gpu=agg_rate,
        wins=wins,
        reason=reason,
    )
