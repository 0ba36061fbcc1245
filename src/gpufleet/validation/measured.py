"""Measured-serving rows (aiconfigurator's silicon CSV format) and their predictions.

Shared by the calibration fit and `benchmarks/plan_accuracy.py`. A row is one engine
serving one model on one GPU kind at a fixed closed-loop concurrency; we model it with
the roofline step-time model and the closed-loop solver, and say why when we cannot.

Column conventions (checked on the data): `batch_size` is the concurrency per attention
data-parallel rank, so a row with attention_dp_size=8 and batch_size=32 runs 256 clients
(its id says c256); the group's GPUs are moe_tp_size x moe_ep_size for MoE models, and
GPUs / tp_size are the attention ranks (vLLM rows with tp_size=1, moe_tp_size=2 are two
data-parallel ranks even where attention_dp_size says 1). Empty quant modes mean bf16; `fp8_block` is fp8 with block scales.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpufleet.errors import UserError
from gpufleet.perf.calibration import BackendCalibration, Calibration, default_calibration
from gpufleet.perf.roofline import RooflineStepTimeModel
from gpufleet.plan.layout import Layout
from gpufleet.plan.memory import memory_breakdown
from gpufleet.plan.perf_serving import SchedulerShape, ServingPrediction, predict_closed_loop
from gpufleet.shared_data import shared_file
from gpufleet.specs.gpus import GpuSpec, load_gpu
from gpufleet.specs.models import ModelSpec, load_model, parse_config
from gpufleet.validation.engine_loop import EngineLoopResult, simulate_closed_loop

# The full measured-serving table is optional shared data (gpufleet.shared_data).
MEASURED_CSV = ("validation", "measured_serving_dev.csv")


def default_csv() -> Path:
    """The full measured-serving CSV under $GPUFLEET_SHARED (a UserError naming it if absent)."""
    return shared_file(*MEASURED_CSV)


REQUIRED_COLUMNS = (
    "backend", "model_path", "system", "isl", "osl", "batch_size", "tp_size", "pp_size",
    "silicon_ttft_ms", "silicon_tpot_ms",
)  # fmt: skip

_QUANT = {"": "bf16", "bf16": "bf16", "fp16": "bf16", "float16": "bf16", "fp8": "fp8",
          "fp8_block": "fp8", "fp8_blockwise": "fp8", "int8": "int8", "int8_wo": "int8",
          "w8a8": "int8", "int4": "int4", "int4_wo": "int4", "w4a16": "int4", "awq": "int4",
          "gptq": "int4", "nvfp4": "fp4", "fp4": "fp4", "mxfp4": "fp4", "w4a8_mxfp4_fp8": "fp4"}  # fmt: skip


@dataclass(frozen=True)
class MeasuredRow:
    id: str
    backend: str
    model_path: str
    system: str
    gemm_quant: str
    moe_quant: str
    isl: int
    osl: int
    batch_size: int
    tp: int
    pp: int
    attention_dp: int
    moe_tp: int
    moe_ep: int
    ttft_s: float
    tpot_s: float


@dataclass(frozen=True)
class RowLayout:
    tp: int
    pp: int
    ep: int
    weight_dtype: str
    kv_dtype: str = "auto"


def _int(value: str | None, default: int = 1) -> int:
    return int(float(value)) if value not in (None, "") else default


def read_rows(path: Path | str) -> list[MeasuredRow]:
    """Rows of a measured-serving CSV; a missing column is a UserError naming it."""
    p = Path(path)
    try:
        f = p.open(newline="")
    except OSError as e:
        raise UserError(
            f"cannot read {str(p)!r}: {e}", field="CSV", fix="pass an existing CSV"
        ) from e
    with f:
        reader = csv.DictReader(f)
        missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise UserError(
                f"{p.name} lacks column(s) {', '.join(missing)}",
                field="CSV",
                fix=f"use a CSV with the columns {', '.join(REQUIRED_COLUMNS)}",
            )
        rows = []
        for i, r in enumerate(reader):
            tp = _int(r.get("tp_size"))
            rows.append(
                MeasuredRow(
                    id=r.get("id") or f"row{i + 1}",
                    backend=(r.get("backend") or "").strip().lower(),
                    model_path=(r.get("model_path") or "").strip(),
                    system=(r.get("system") or "").strip(),
                    gemm_quant=(r.get("gemm_quant_mode") or r.get("precision") or "").strip(),
                    moe_quant=(r.get("moe_quant_mode") or r.get("gemm_quant_mode") or "").strip(),
                    isl=_int(r.get("isl")),
                    osl=_int(r.get("osl")),
                    batch_size=_int(r.get("batch_size")),
                    tp=tp,
                    pp=_int(r.get("pp_size")),
                    attention_dp=_int(r.get("attention_dp_size")),
                    moe_tp=_int(r.get("moe_tp_size"), tp),
                    moe_ep=_int(r.get("moe_ep_size")),
                    ttft_s=float(r["silicon_ttft_ms"]) / 1e3,
                    tpot_s=float(r["silicon_tpot_ms"]) / 1e3,
                )
            )
    return rows


# ---- model resolution ----------------------------------------------------------------

_SUFFIX = re.compile(r"(-(instruct|chat|it|base|hf|fp8|fp8-dynamic|awq|gptq|int4|int8|bf16))+$")


def _norm(name: str) -> str:
    short = name.strip().lower().replace("--", "/").rsplit("/", 1)[-1]
    return _SUFFIX.sub("", short).removeprefix("meta-")


def resolve_model(model_path: str, configs_dir: Path | None = None) -> ModelSpec:
    """A row's model: from `configs_dir` (files `ORG--NAME.json`, or any `*.json` whose
    name matches after dropping -Instruct / -FP8 style suffixes) first, else the catalog."""
    if configs_dir is not None:
        import json

        want = _norm(model_path)
        for f in sorted(configs_dir.glob("*.json")):
            if _norm(f.stem) == want:
                return parse_config(json.loads(f.read_text()), model_path, source=str(f))
    return load_model(model_path)


# ---- prediction ----------------------------------------------------------------------


@dataclass(frozen=True)
class RowPrediction:
    row: MeasuredRow
    ttft_s: float
    tpot_s: float
    serving: ServingPrediction
    engine: EngineLoopResult | None = None  # what the engine measured (engine mode only)


def model_row(
    row: MeasuredRow,
    cal: Calibration | None = None,
    configs_dir: Path | None = None,
    *,
    engine: bool = False,
) -> RowPrediction:
    """Predict one row; raises UserError (with the reason) when the row cannot be modelled.

    engine: play the closed loop out on `gpufleet.engine` (engine_loop) instead of the
    analytic mean-value solver; the same step-time model and constants either way."""
    cal = cal or default_calibration()
    model = resolve_model(row.model_path, configs_dir)
    gpu = load_gpu(row.system)
    weight_dtype = _QUANT.get(row.gemm_quant.lower())
    moe_dtype = _QUANT.get(row.moe_quant.lower())
    if weight_dtype is None or moe_dtype is None:
        raise UserError(
            f"unknown quant mode {row.gemm_quant!r}/{row.moe_quant!r}",
            field="gemm_quant_mode",
            fix=f"use one of {', '.join(sorted(k for k in _QUANT if k))}",
        )
    if row.tp > gpu.gpus_per_node:
        raise UserError(
            f"tp_size {row.tp} spans nodes of {gpu.gpus_per_node} x {gpu.name}; tensor "
            "parallelism beyond one NVLink domain is not modelled",
            field="tp_size",
            fix=f"use tp_size <= {gpu.gpus_per_node} (PP or EP across nodes)",
        )
    if row.isl < 1 or row.osl < 1 or row.batch_size < 1 or row.tp < 1 or row.pp < 1:
        raise UserError("non-positive isl/osl/batch_size/tp/pp", field="row")
    # Attention DP: the group's GPUs are moe_tp x moe_ep; each attention rank uses tp.
    dp = max(1, row.attention_dp)
    gpus = max(row.tp * dp, row.moe_tp * row.moe_ep) if model.moe else row.tp * dp
    if model.moe and row.moe_tp * row.moe_ep < row.tp * dp:
        gpus = row.moe_tp * row.moe_ep  # more DP ranks than GPUs: ranks share GPUs
    dp_eff = max(1, gpus // row.tp)
    per_rank = row.batch_size  # batch_size counts the clients of one attention rank
    layout = RowLayout(
        tp=row.tp, pp=row.pp, ep=row.moe_ep if model.moe else 1, weight_dtype=weight_dtype
    )
    step = RooflineStepTimeModel(
        model,
        gpu,
        layout,
        calibration=cal,
        backend=row.backend,
        attention_dp=dp_eff,
        moe_weight_dtype=moe_dtype,
    )
    b = cal.backend(row.backend)
    max_running = _kv_limited_running(model, gpu, row, weight_dtype, dp_eff)
    if engine:
        return _engine_row(row, step, b, max_running)
    serving = predict_closed_loop(
        step,
        row.isl,
        row.osl,
        per_rank,
        SchedulerShape(
            max_num_batched_tokens=b.max_num_batched_tokens,
            max_running=max_running,
            mixed_prefill=b.mixed_prefill,
        ),
        ttft_overhead_s=b.ttft_overhead_s,
        queue_scale=cal.queue_scale,
        requests_per_client=b.benchmark_requests_per_client,
        lockstep_ranks=1,
    )
    return RowPrediction(row=row, ttft_s=serving.ttft_s, tpot_s=serving.tpot_s, serving=serving)


def _engine_row(
    row: MeasuredRow, step: RooflineStepTimeModel, b: BackendCalibration, max_running: int
) -> RowPrediction:
    """The row's closed loop on the engine. The per-request overhead outside the engine is
    the clients' think time and adds to TTFT; the benchmark's first wave (all clients at
    once) weighs 1/requests_per_client in the mean TTFT, as in the analytic path."""
    sim = simulate_closed_loop(
        step,
        row.isl,
        row.osl,
        row.batch_size,
        max_num_batched_tokens=b.max_num_batched_tokens,
        max_running=max_running,
        mixed_prefill=b.mixed_prefill,
        think_s=b.ttft_overhead_s,
    )
    k = max(1.0, b.benchmark_requests_per_client)
    ttft_s = b.ttft_overhead_s + sim.ttft_s + (sim.first_wave_ttft_s - sim.ttft_s) / k
    tpot_s = sim.tpot_s
    rate = row.batch_size / (ttft_s + (row.osl - 1) * tpot_s)
    serving = ServingPrediction(
        concurrency=row.batch_size,
        ttft_s=ttft_s,
        tpot_s=tpot_s,
        requests_per_s=rate,
        output_tokens_per_s=rate * row.osl,
        e2e_latency_s=ttft_s + (row.osl - 1) * tpot_s,
        running_decodes=float("nan"),
        prefill_share=float("nan"),
        prefill_s=float("nan"),
    )
    return RowPrediction(row=row, ttft_s=ttft_s, tpot_s=tpot_s, serving=serving, engine=sim)


def _kv_limited_running(
    model: ModelSpec, gpu: GpuSpec, row: MeasuredRow, weight_dtype: str, dp: int
) -> int:
    """Requests one engine can hold with a full isl + osl KV reservation each (TRT-LLM's
    guaranteed-no-evict admission; vLLM's steady state is close). fp8 rows run an fp8 KV
    cache. Attention-DP layouts are outside plan.memory's accounting: no cap for them."""
    if dp > 1 or row.pp > 1 or (row.moe_ep not in (1, row.tp)):
        return _NO_CAP
    kv = "fp8" if weight_dtype == "fp8" else "bf16"
    ep = row.moe_ep if model.moe else 1
    layout = Layout(tp=row.tp, pp=row.pp, ep=ep, weight_dtype=weight_dtype, kv_dtype=kv)
    seq = row.isl + row.osl
    key = (model, gpu.name, layout, seq)
    if key not in _KV_CACHE:
        mem = memory_breakdown(model, gpu, layout, seq)
        _KV_CACHE[key] = max(1, min(_NO_CAP, mem.kv_capacity_tokens // seq))
    return _KV_CACHE[key]


_KV_CACHE: dict[tuple[ModelSpec, str, Layout, int], int] = {}


_NO_CAP = 4096


def predict_row(
    row: MeasuredRow, cal: Calibration | None = None, *, engine: bool = False
) -> RowPrediction | None:
    """Like model_row, but None for a row that cannot be modelled."""
    try:
        return model_row(row, cal, engine=engine)
    except UserError:
        return None


def predict_rows(
    rows: Sequence[MeasuredRow],
    cal: Calibration | None = None,
    configs_dir: Path | None = None,
    *,
    engine: bool = False,
) -> tuple[list[RowPrediction], list[tuple[MeasuredRow, str]]]:
    """Predictions for the rows it can model, and (row, reason) for those it cannot."""
    done: list[RowPrediction] = []
    skipped: list[tuple[MeasuredRow, str]] = []
    for row in rows:
        try:
            done.append(model_row(row, cal, configs_dir, engine=engine))
        except UserError as e:
            skipped.append((row, str(e)))
    return done, skipped
