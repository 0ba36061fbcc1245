"""Layout search with a decision trail (DESIGN.md: "Decision order"): `plan(request)`.

The steps and their order are in `ladder`; the words of every decision in `explain`; the
request, candidates and plan types in `types`. Pure: no clock, no I/O.
"""

from __future__ import annotations

import math

from gpufleet.errors import UserError
from gpufleet.perf.calibration import default_calibration
from gpufleet.plan import explain
from gpufleet.plan.disagg import DisaggPlan, plan_disaggregated
from gpufleet.plan.ladder import Ladder
from gpufleet.plan.moe_layouts import choose_moe_layout
from gpufleet.plan.render import render_disagg_commands, render_launch_commands
from gpufleet.plan.types import (
    DEFAULT_MAX_MODEL_LEN,
    MAX_NODES,
    MIN_USEFUL_CONCURRENCY,
    Candidate,
    Decision,
    LayoutPerformance,
    Plan,
    PlanRequest,
)

__all__ = [
    "DEFAULT_MAX_MODEL_LEN",
    "MIN_USEFUL_CONCURRENCY",
    "Candidate",
    "Decision",
    "LayoutPerformance",
    "Plan",
    "PlanRequest",
    "plan",
]


def plan(req: PlanRequest) -> Plan:
    """Search layouts for `req` and explain every choice. Raises UserError when nothing
    fits the limits, naming what the smallest fitting layout would need."""
    _validate(req)
    search = Ladder(req)
    weight_dtype, tp1 = search.choose_precision()
    if tp1 is not None:
        tp1 = search.quantize_for_slo(tp1)
        weight_dtype = tp1.layout.weight_dtype
    fitting = search.smallest_fit(weight_dtype, tp1, req.max_gpus)
    if fitting is None:
        raise _nothing_fits(req, search, weight_dtype, tp1)
    chosen, evaluated = search.choose_by_performance(fitting)
    chosen, alternative = search.choose_ep(chosen)
    if alternative is not None and alternative.performance is not None:
        evaluated.append(alternative)
    chosen, others = choose_moe_layout(search, chosen)
    evaluated += others
    # One row per layout: the EP step's alternative and the MoE step's candidates repeat
    # layouts the performance step already evaluated (the chosen one's figures win).
    by_layout = {c.layout: c for c in evaluated}
    by_layout[chosen.layout] = chosen
    evaluated = list(by_layout.values())
    search.note_replicas(chosen)
    if (
        req.max_gpus is not None
        and chosen.total_gpus is not None
        and chosen.total_gpus > req.max_gpus
        and chosen.performance is not None
    ):
        per_replica = chosen.performance.max_requests_per_s
        allowed = req.max_gpus // chosen.layout.num_gpus
        raise UserError(
            f"--rps {req.rps:g} needs {chosen.replicas} replicas of {chosen.layout.label} = "
            f"{chosen.total_gpus} × {req.gpu.name}; --max-gpus {req.max_gpus} allows "
            f"{allowed} replicas = {allowed * per_replica:.1f} req/s within the SLOs",
            field="--max-gpus",
            fix=f"raise --max-gpus to {chosen.total_gpus} or lower --rps to "
            f"{allowed * per_replica:.1f}",
        )
    evaluated.sort(key=lambda c: (c.layout.num_gpus, c.layout.ep))
    disagg = _disaggregated(req, search, chosen, evaluated)
    return Plan(
        request=req,
        chosen=chosen,
        candidates=tuple(evaluated),
        decisions=tuple(search.decisions),
        max_model_len=search.max_model_len,
        launch=render_launch_commands(
            req.model,
            req.gpu,
            chosen.layout,
            max_model_len=search.max_model_len,
            gpu_memory_utilization=req.gpu_memory_utilization,
            gpus_per_node=req.node_gpus,
        ),
        warnings=tuple(search.warnings),
        disaggregated=disagg,
        disagg_launch=(
            render_disagg_commands(
                req.model,
                req.gpu,
                disagg.prefill.layout,
                disagg.decode.layout,
                max_model_len=search.max_model_len,
                gpu_memory_utilization=req.gpu_memory_utilization,
            )
            if disagg is not None
            else None
        ),
    )


def _disaggregated(
    req: PlanRequest, search: Ladder, chosen: Candidate, evaluated: list[Candidate]
) -> DisaggPlan | None:
    """Disaggregated prefill / decode over the layouts the search found useful, with its
    verdict against the aggregated choice in the decision trail."""
    if req.disaggregation == "off":
        return None
    useful = [c for c in evaluated if search.useful(c)]
    # The same first-token time the aggregated prediction pays (MoE models' included).
    ttft_overhead_s = default_calibration().first_token_overhead_s(
        req.engine, req.model.moe is not None
    )
    found = plan_disaggregated(req, chosen, useful, ttft_overhead_s)
    if found is None:
        search.note("disagg", "prefill / decode pools", False,
                    "no pairing of the useful layouts meets the SLOs with the KV transfer")  # fmt: skip
        return None
    option = (
        f"{found.prefill.replicas} × {found.prefill.layout.label} prefill + "
        f"{found.decode.replicas} × {found.decode.layout.label} decode"
    )
    search.note("disagg", option, found.wins, found.reason)
    return found


def _validate(req: PlanRequest) -> None:
    def bad(field_name: str, message: str, fix: str) -> UserError:
        return UserError(message, field=field_name, fix=fix)

    for flag, value in (("--rps", req.rps), ("--ttft-slo", req.ttft_slo_s),
                        ("--tpot-slo", req.tpot_slo_s),
                        ("--gpu-price", req.gpu_price_per_hour_usd or 0.0),
                        ("--gpu-memory-utilization", req.gpu_memory_utilization or 0.5)):  # fmt: skip
        if not math.isfinite(value):
            raise bad(flag, f"must be a finite number, got {value}", f"pass a number for {flag}")
    if req.input_tokens < 1:
        raise bad("--input-tokens", "must be >= 1", "pass a prompt length in tokens")
    if req.output_tokens < 1:
        raise bad("--output-tokens", "must be >= 1", "pass an output length in tokens")
    if req.rps <= 0:
        raise bad("--rps", "must be > 0", "pass the requests per second to serve")
    if req.ttft_slo_s <= 0 or req.tpot_slo_s <= 0:
        raise bad(
            "--ttft-slo/--tpot-slo",
            "SLOs must be > 0 seconds",
            "e.g. --ttft-slo 1.0 --tpot-slo 0.05",
        )
    if req.node_gpus < 1:
        raise bad("--gpus-per-node", "must be >= 1", "e.g. --gpus-per-node 8")
    if req.max_gpus is not None and req.max_gpus < 1:
        raise bad("--max-gpus", "must be >= 1", "omit it for no limit")
    mml = req.resolved_max_model_len()
    limit = req.model.max_position_embeddings
    if req.request_tokens > limit:  # no --max-model-len can hold it: name the lengths
        raise bad(
            "--input-tokens/--output-tokens",
            f"input + output tokens ({req.request_tokens}) > the model's "
            f"max_position_embeddings ({limit})",
            f"keep --input-tokens + --output-tokens within {limit}",
        )
    if mml < req.request_tokens:
        raise bad(
            "--max-model-len",
            f"{mml} < input + output tokens ({req.request_tokens})",
            f"pass --max-model-len {req.request_tokens} or more",
        )
    if mml > req.model.max_position_embeddings:
        raise bad(
            "--max-model-len",
            f"{mml} > the model's max_position_embeddings ({req.model.max_position_embeddings})",
            f"pass --max-model-len {req.model.max_position_embeddings} or less",
        )


def _nothing_fits(
    req: PlanRequest, search: Ladder, weight_dtype: str, tp1: Candidate | None
) -> UserError:
    """Name the smallest layout that would fit without --max-gpus."""
    unlimited = Ladder(req)
    fit = unlimited.smallest_fit(weight_dtype, tp1, None)
    short = req.model.name.rsplit("/", 1)[-1]
    if fit is None:
        return UserError(
            f"{short} at {weight_dtype} does not fit even {MAX_NODES} nodes of "
            f"{req.node_gpus} × {req.gpu.name} with a useful KV cache",
            field="--gpu",
            fix="use a GPU with more memory, a lower precision (--quant) or a shorter --max-model-len",
        )
    layout = fit.layout
    if layout.pp > 1:
        need = (
            f"{layout.pp} nodes of {layout.tp} × {req.gpu.name} with PP={layout.pp} "
            f"({layout.num_gpus} GPUs)"
        )
    else:
        need = f"TP={layout.tp} ({layout.num_gpus} × {req.gpu.name})"
    fix = f"raise --max-gpus to {layout.num_gpus}"
    for lower in ("fp8", "int4"):
        if lower == weight_dtype or (weight_dtype in ("fp8", "fp4") and lower == "fp8"):
            continue
        alt_search = Ladder(req)
        alt, _ = alt_search.first_useful(1, 1, lower)
        alt = alt or alt_search.smallest_fit(lower, None, req.max_gpus)
        if alt is not None:
            fix += f", or --quant {lower} fits {alt.layout.label} on {explain.plural(alt.layout.num_gpus, 'GPU')}"
            break
    return UserError(
        f"{short} {weight_dtype} needs {need}; --max-gpus {req.max_gpus} allows none",
        field="--max-gpus",
        fix=fix,
    )
