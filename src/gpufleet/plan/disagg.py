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
from dataclasses import dataclass, replace

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


@dataclass(frozen=True)
class _PrefillSide:
    """A prefill replica's batches: `per_batch` prompts in `batch_s`; one alone `own_s`."""

    candidate: Candidate
    per_batch: int
    batch_s: float
    own_s: float


def _prefill_side(req: PlanRequest, c: Candidate) -> _PrefillSide:
    step = layout_step_model(req.model, req.gpu, c.layout, backend=req.engine)
    budget = engine_rules(
        req.engine, req.gpu, tp=c.layout.tp, dp=c.layout.dp
    ).max_num_batched_tokens
    isl = req.input_tokens
    if budget >= isl:
        per_batch = budget // isl
        batch = StepBatch(
            prefill_tokens=(isl,) * per_batch, prefill_context_tokens=(0,) * per_batch
        )
        alone = StepBatch(prefill_tokens=(isl,), prefill_context_tokens=(0,))
        return _PrefillSide(c, per_batch, step.step_time_s(batch), step.step_time_s(alone))
    chunks = math.ceil(isl / budget)
    chunk = StepBatch(prefill_tokens=(budget,), prefill_context_tokens=(isl // 2,))
    chunked_s = chunks * step.step_time_s(chunk)
    return _PrefillSide(c, 1, chunked_s, chunked_s)


def _prefill_rate(
    req: PlanRequest, side: _PrefillSide, extra_s: float, overhead_s: float
) -> tuple[float, float] | None:
    """(prompts/s per attention rank, TTFT there) at the highest load meeting the TTFT SLO:
    an M/D/1 queue of batches waits rho / (2 (1 - rho)) batch times, so with w the SLO left
    after the prompt's own prefill, rho = 2w / (batch + 2w)."""
    base = overhead_s + side.own_s + extra_s
    slack = req.ttft_slo_s - base
    if slack <= 0:
        return None
    rho = min(0.999, 2 * slack / (side.batch_s + 2 * slack))
    wait = rho / (2 * (1 - rho)) * side.batch_s
    return side.per_batch / side.batch_s * rho, min(req.ttft_slo_s, base + wait)


@dataclass(frozen=True)
class _DecodeSide:
    candidate: Candidate
    requests_per_s: float  # per replica (all attention ranks)
    tpot_s: float
    first_step_s: float  # the first decode step after the KV arrives


def _decode_side(req: PlanRequest, c: Candidate) -> _DecodeSide | None:
    step = layout_step_model(req.model, req.gpu, c.layout, backend=req.engine)
    rules = engine_rules(req.engine, req.gpu, tp=c.layout.tp, dp=c.layout.dp)
    running = max(1, c.kv_concurrent_requests // c.layout.dp)
    dec = _decode_rate(req, step, min(running, rules.max_num_seqs))
    if dec is None:
        return None
    first = step.step_time_s(StepBatch(num_decode=1, decode_context_tokens=req.input_tokens))
    return _DecodeSide(c, dec[0] * c.layout.dp, dec[1], first)


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
    req: PlanRequest, pre_side: _PrefillSide, dec: _DecodeSide, ttft_overhead_s: float
) -> DisaggPlan | None:
    """x prefill replicas and y decode replicas for --rps, or None."""
    p, d = pre_side.candidate.layout, dec.candidate.layout
    # NVLink when both pools fit one NVLink domain (GB200 / GB300 NVL72), else the NIC.
    links = [req.gpu.network_gbps]
    if p.num_gpus + d.num_gpus <= req.gpu.domain_gpus:
        links.insert(0, req.gpu.intra_node_gbps)
    for link in links:
        kv_s = _kv_transfer_s(req, p, d, link)
        pre = _prefill_rate(req, pre_side, kv_s + dec.first_step_s, ttft_overhead_s)
        if pre is None or pre[0] <= 0:
            continue
        prefill_rps = pre[0] * p.dp  # each attention-DP rank prefills its own prompts
        x = max(1, math.ceil(req.rps / prefill_rps))
        y = max(1, math.ceil(req.rps / dec.requests_per_s))
        gpus = x * p.num_gpus + y * d.num_gpus
        if link != req.gpu.network_gbps and gpus > req.gpu.domain_gpus:
            continue  # the pools outgrow the NVLink domain: the NIC carries the KV
        if req.max_gpus is not None and gpus > req.max_gpus:
            return None
        return DisaggPlan(
            prefill=Pool(p, x, prefill_rps, pre[1]),
            decode=Pool(d, y, dec.requests_per_s, dec.tpot_s),
            kv_bytes_per_request=kv_bytes_per_prompt(req, d.kv_dtype_bytes),
            kv_link_gbps=link,
            kv_transfer_s=kv_s,
            ttft_s=pre[1],
            tpot_s=dec.tpot_s,
            total_gpus=gpus,
            output_tokens_per_s_per_gpu=req.rps * req.output_tokens / gpus,
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
    prefills = [_prefill_side(req, c) for c in pool]
    decodes = [d for d in (_decode_side(req, c) for c in pool) if d is not None]
    best: DisaggPlan | None = None
    for p in prefills:
        for d in decodes:
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
