"""Two TTFT leads on TRT-LLM's rows, measured in-sample (issue 14, wave 15).

    python benchmarks/plan_ttft_leads.py [CSV] [--out PATH]

1. "One slot fewer than clients": the TRT-LLM 1.0.0rc3 Llama-3.1-8B-Instruct rows (H100,
   177 rows) read TTFT ~= prefill + one inter-completion time (plan_residuals' osl slope
   0.92-1.02). The closed loop gives exactly that wait when the engine runs one request
   fewer than there are clients (Little's law on the one queued client). The table
   predicts those rows so (a diagnostic keyed on the campaign's labels, never a default:
   no engine rule found gives it to this model and not to Qwen3 on the same version and
   GPU) beside the shipped model, at several values of TRT-LLM's `ttft_overhead_s`
   (shipped 0.080 s), and gives the in-sample TTFT / TPOT median APE overall, per engine
   and for the campaign.
2. MoE first-token gap: per TRT-LLM 1.0.0rc3 Qwen3-235B row, measured TTFT less the shipped
   model's TTFT with every first-token constant at 0 (the GPU part: own prefill, queue,
   iterations ahead), by TP, prompt length and clients (shortest output of each cell).

Writes benchmarks/results/plan_ttft_leads.{json,md}.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

from gpufleet.perf.calibration import Calibration, default_calibration
from gpufleet.plan.engines import EngineRules
from gpufleet.validation import measured
from gpufleet.validation.measured import MeasuredRow, RowPrediction, default_csv, read_rows

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import RESULTS, write_result

TRTLLM_OVERHEADS_S = (0.02, 0.04, 0.06, 0.08)


def is_l8_rc3(row: MeasuredRow) -> bool:
    """The TRT-LLM 1.0.0rc3 Llama-3.1-8B-Instruct campaign (aiconfigurator, H100)."""
    return row.backend == "trtllm" and row.id.startswith("meta_llama_llama_3_1_8b_instruct")


def one_slot_fewer(
    base: Callable[[MeasuredRow, EngineRules], EngineRules],
) -> Callable[[MeasuredRow, EngineRules], EngineRules]:
    """The row rules with that campaign's engine running clients - 1 requests."""

    def rules(row: MeasuredRow, engine: EngineRules) -> EngineRules:
        engine = base(row, engine)
        if is_l8_rc3(row):
            return dataclasses.replace(engine, max_num_seqs=max(1, row.batch_size - 1))
        return engine

    return rules


def with_trtllm_overhead(cal: Calibration, overhead_s: float) -> Calibration:
    backends = dict(cal.backends)
    backends["trtllm"] = dataclasses.replace(backends["trtllm"], ttft_overhead_s=overhead_s)
    return dataclasses.replace(cal, backends=backends)


def predict(rows: Sequence[MeasuredRow], cal: Calibration, slots: bool) -> list[RowPrediction]:
    rules = one_slot_fewer(measured.batch_wait_rules) if slots else measured.batch_wait_rules
    with mock.patch.object(measured, "batch_wait_rules", rules):
        preds, _ = measured.predict_rows(rows, cal)  # rows it cannot model: count in main
    return preds


def medians(preds: Sequence[RowPrediction]) -> dict[str, float]:
    groups: dict[str, list[float]] = {}
    for p in preds:
        key = "trtllm L8 rc3" if is_l8_rc3(p.row) else p.row.backend
        groups.setdefault(key, []).append(p.ttft_ape_pct)
    out = {
        "ttft": statistics.median(p.ttft_ape_pct for p in preds),
        "tpot": statistics.median(p.tpot_ape_pct for p in preds),
    }
    out.update({k: statistics.median(v) for k, v in sorted(groups.items())})
    return out


def slot_table(rows: Sequence[MeasuredRow], cal: Calibration) -> list[dict[str, Any]]:
    table = []
    for slots in (False, True):
        for overhead_s in TRTLLM_OVERHEADS_S:
            m = medians(predict(rows, with_trtllm_overhead(cal, overhead_s), slots))
            table.append({"one_slot_fewer": slots, "trtllm_ttft_overhead_s": overhead_s, **m})
    return table


def moe_gaps(rows: Sequence[MeasuredRow], cal: Calibration) -> list[dict[str, Any]]:
    zero = dataclasses.replace(
        cal,
        moe_first_token_s=0.0,
        backends={k: dataclasses.replace(v, ttft_overhead_s=0.0) for k, v in cal.backends.items()},
    )
    qwen = [r for r in rows if r.backend == "trtllm" and r.id.startswith("qwen_qwen3_235b")]
    shortest: dict[tuple[int, int, int, int], MeasuredRow] = {}
    for r in qwen:
        key = (r.tp, r.moe_ep, r.isl, r.batch_size)
        if key not in shortest or r.osl < shortest[key].osl:
            shortest[key] = r
    picked = [shortest[k] for k in sorted(shortest)]
    return [
        {
            "tp": p.row.tp,
            "ep": p.row.moe_ep,
            "isl": p.row.isl,
            "clients": p.row.batch_size,
            "osl": p.row.osl,
            "measured_ttft_ms": p.row.ttft_s * 1e3,
            "gpu_part_ms": p.ttft_s * 1e3,
            "gap_ms": (p.row.ttft_s - p.ttft_s) * 1e3,
            "tpot_ms": p.row.tpot_s * 1e3,
        }
        for p in predict(picked, zero, slots=False)
    ]


def render(slots: list[dict[str, Any]], gaps: list[dict[str, Any]]) -> str:
    keys = [k for k in slots[0] if k not in ("one_slot_fewer", "trtllm_ttft_overhead_s")]
    lines = [
        "In-sample median APE % (shipped constants but TRT-LLM's `ttft_overhead_s`):",
        "",
        "| one slot fewer (L8 rc3) | TRT-LLM ttft_overhead_s | " + " | ".join(keys) + " |",
        "| --- | ---: | " + " | ".join("---:" for _ in keys) + " |",
    ]
    for t in slots:
        cells = " | ".join(f"{t[k]:.1f}" for k in keys)
        lines.append(
            f"| {'yes' if t['one_slot_fewer'] else 'no'} | {t['trtllm_ttft_overhead_s']:.2f} "
            f"| {cells} |"
        )
    lines += [
        "",
        "TRT-LLM 1.0.0rc3 Qwen3-235B: measured TTFT less the model's GPU part (first-token "
        "constants at 0):",
        "",
        "| tp | ep | isl | clients | osl | measured ms | GPU part ms | gap ms | TPOT ms |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for g in gaps:
        lines.append(
            f"| {g['tp']} | {g['ep']} | {g['isl']} | {g['clients']} | {g['osl']} "
            f"| {g['measured_ttft_ms']:.0f} | {g['gpu_part_ms']:.0f} | {g['gap_ms']:.0f} "
            f"| {g['tpot_ms']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("csv", nargs="?", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS / "plan_ttft_leads")
    args = parser.parse_args(argv)
    rows = read_rows(args.csv or default_csv())
    cal = default_calibration()
    slots = slot_table(rows, cal)
    gaps = moe_gaps(rows, cal)
    unmodelled = len(rows) - len(predict(rows, cal, slots=False))
    table = f"{len(rows)} rows, {unmodelled} not modelled.\n\n" + render(slots, gaps)
    print(table)
    data = {"rows": len(rows), "rows_unmodelled": unmodelled, "slots": slots, "moe_gaps": gaps}
    json_path, md_path = write_result(args.out, data, table)
    print(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
