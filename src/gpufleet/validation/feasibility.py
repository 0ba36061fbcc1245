"""Rows whose measured rate the labelled work cannot reach (issue 14, wave 14).

A closed-loop row of c clients, each sending an isl-token prompt and reading osl tokens,
completes c / (TTFT + (osl - 1) x TPOT) requests a second (per attention rank), and each
request's prompt has to pass every layer once. `prompt_busy_fraction` is the share of
the GPUs' time those prompts alone take at the best rates any kernel reached on an H200
(`BEST_RATES`: the shared `h200_rates.csv`, PyTorch kernels: dense GEMMs 0.78 of the bf16
peak, 0.71 of the fp8 one, the higher taken; causal prefill attention 0.645; copies 0.875
of HBM peak), no per-step or per-request overhead, the TP all-reduces on the measured
NVLink curve (the engines here do not overlap them with the GEMMs), and the output
tokens' decode not counted at all. Above 1 the labels cannot be what ran. Such a row is
still modelled and scored (issue 14: no row of the shared data is left out); its
prediction carries the reason (`RowPrediction.infeasible`, from `infeasible_reason`) and
`infeasible_summary` reports those rows and their errors apart, for the accuracy report.

On the shared CSV only the vLLM 0.12 nvidia/Llama-3.1-8B-Instruct-FP8 campaign crosses it
(9 of its 21 rows, up to 1.57; two at TP 1, 1.18 and 1.03, without any all-reduce); every
other campaign stays at or under 0.65. Its prompts were presumably served in part from
vLLM's prefix cache (on by default in vLLM 1.x; InferenceMAX's vLLM recipe turns it off,
that campaign's launch is not published). H100 SXM and H200 SXM share the compute units,
so the same fractions of peak bound both.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any, Final, Protocol

from gpufleet.perf.calibration import BOUNDS, BackendCalibration, Calibration
from gpufleet.perf.step_batch import StepBatch
from gpufleet.plan.layout import Layout
from gpufleet.plan.perf_serving import layout_step_model
from gpufleet.specs.gpus import GpuSpec
from gpufleet.specs.models import ModelSpec
from gpufleet.specs.quant import QuantScheme
from gpufleet.validation.rows import MeasuredRow

_NO_OVERHEAD: Final = BackendCalibration(
    step_overhead_s=0.0,
    seq_overhead_s=0.0,
    eager_layer_overhead_s=0.0,
    moe_layer_overhead_s=0.0,
    ttft_overhead_s=0.0,
    moe_efficiency=BOUNDS["moe_efficiency"][1],
    moe_gemm_efficiency=BOUNDS["moe_gemm_efficiency"][1],
)

# The best rates measured on an H200 (h200_rates.csv), overheads nil: a lower bound on
# any engine's time for the same work.
BEST_RATES: Final = Calibration(
    gemm_efficiency=0.78,  # bf16 774 of 989 TFLOP/s (fp8: 1397 of 1979, 0.71)
    attention_efficiency=0.645,  # causal SDPA prefill, 638 TFLOP/s at 16k tokens
    memory_efficiency=0.875,  # device-to-device copy, 4.2 of 4.8 TB/s
    allreduce_latency_s=BOUNDS["allreduce_latency_s"][0],
    routing_skew=0.0,
    kernel_fixed_s=0.0,
    moe_first_token_s=0.0,
    backends=MappingProxyType(
        {name: _NO_OVERHEAD for name in ("default", "sglang", "trtllm", "vllm")}
    ),
)


def prompt_busy_fraction(
    row: MeasuredRow,
    model: ModelSpec,
    gpu: GpuSpec,
    layout: Layout,
    scheme: QuantScheme,
    clients_per_rank: int,
) -> float:
    """Share of one attention rank's GPU time the row's measured request rate needs for
    its prompts alone, at `BEST_RATES`."""
    step = layout_step_model(
        model, gpu, layout, backend=row.backend, calibration=BEST_RATES, scheme=scheme
    )
    prompt_s = step.step_time_s(StepBatch(prefill_tokens=(row.isl,), prefill_context_tokens=(0,)))
    return measured_requests_per_s(row, clients_per_rank) * prompt_s


def measured_requests_per_s(row: MeasuredRow, clients_per_rank: int) -> float:
    """Requests a second one attention rank completed in the closed loop the row measured:
    each client waits TTFT + (osl - 1) x TPOT a request."""
    return clients_per_rank / (row.ttft_s + (row.osl - 1) * row.tpot_s)


def infeasible_reason(
    row: MeasuredRow,
    model: ModelSpec,
    gpu: GpuSpec,
    layout: Layout,
    scheme: QuantScheme,
    clients_per_rank: int,
) -> str | None:
    """Why the row's measured rate is impossible as labelled, or None when it is not."""
    key = (row, layout)
    if key not in _CACHE:
        busy = prompt_busy_fraction(row, model, gpu, layout, scheme, clients_per_rank)
        _CACHE[key] = (
            None
            if busy <= 1.0
            else (
                f"its measured rate needs the GPUs {busy:.0%} busy on the {row.isl}-token "
                "prompts alone at the best H200 kernel rates (no overhead, no decode): "
                "not what the labels say ran (prefix-cache hits?)"
            )
        )
    return _CACHE[key]


_CACHE: dict[tuple[MeasuredRow, Layout], str | None] = {}


class _Predicted(Protocol):
    """What `infeasible_summary` reads of a `validation.measured.RowPrediction`."""

    @property
    def row(self) -> MeasuredRow: ...
    @property
    def ttft_ape_pct(self) -> float: ...
    @property
    def tpot_ape_pct(self) -> float: ...
    @property
    def infeasible(self) -> str: ...


def infeasible_summary(preds: Sequence[_Predicted]) -> dict[str, Any]:
    """The predicted rows whose measured rate is impossible as labelled: how many, their
    TTFT / TPOT median APE %, and (id, reason) for each. They stay in every median."""
    bad = [p for p in preds if p.infeasible]
    out: dict[str, Any] = {"rows": len(bad), "ids": [(p.row.id, p.infeasible) for p in bad]}
    if bad:
        out["ttft_median_ape"] = statistics.median(p.ttft_ape_pct for p in bad)
        out["tpot_median_ape"] = statistics.median(p.tpot_ape_pct for p in bad)
    return out
