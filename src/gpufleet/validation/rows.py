"""Measured-serving rows (aiconfigurator's silicon CSV format): reading them and resolving
their models. Their predictions are in `validation.measured`.

A row is one engine serving one model on one GPU kind at a fixed closed-loop concurrency.

Column conventions (checked on the data): `batch_size` is the concurrency per attention
data-parallel rank, so a row with attention_dp_size=8 and batch_size=32 runs 256 clients
(its id says c256); the group's GPUs are moe_tp_size x moe_ep_size for MoE models, and
GPUs / tp_size are the attention ranks (vLLM rows with tp_size=1, moe_tp_size=2 are two
data-parallel ranks even where attention_dp_size says 1). Empty quant modes mean bf16; `fp8_block` is fp8 with block scales.
"""

from __future__ import annotations

import csv
import functools
import re
from dataclasses import dataclass
from pathlib import Path

from gpufleet.errors import UserError
from gpufleet.shared_data import shared_file
from gpufleet.specs.catalog import load_model
from gpufleet.specs.config_parse import parse_config
from gpufleet.specs.models import ModelSpec
from gpufleet.specs.quant import (
    BF16,
    FP8,
    FP8_BLOCK,
    INT4,
    INT8,
    INT8_W8A16,
    MXFP4,
    NVFP4,
    NVFP4_W4A16,
    WeightFormat,
)

# The full measured-serving table is optional shared data (gpufleet.shared_data).
MEASURED_CSV = ("validation", "measured_serving_dev.csv")


def default_csv() -> Path:
    """The full measured-serving CSV under $GPUFLEET_SHARED (a UserError naming it if absent)."""
    return shared_file(*MEASURED_CSV)


REQUIRED_COLUMNS = (
    "backend", "model_path", "system", "isl", "osl", "batch_size", "tp_size", "pp_size",
    "silicon_ttft_ms", "silicon_tpot_ms",
)  # fmt: skip

# A quant-mode column value -> the weight format it names.
QUANT_MODES: dict[str, WeightFormat] = {
    "": BF16, "bf16": BF16, "fp16": BF16, "float16": BF16, "fp8": FP8, "fp8_block": FP8_BLOCK,
    "fp8_blockwise": FP8_BLOCK, "int8": INT8, "w8a8": INT8, "int8_wo": INT8_W8A16,
    "int4": INT4, "int4_wo": INT4, "w4a16": INT4, "awq": INT4, "gptq": INT4, "nvfp4": NVFP4,
    "fp4": NVFP4, "w4a16_nvfp4": NVFP4_W4A16, "mxfp4": MXFP4,
    "w4a8_mxfp4_fp8": MXFP4, "w4afp8": WeightFormat("int4", 0.5 + 2.0 / 128, "fp8"),
}  # fmt: skip


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


@functools.cache
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
