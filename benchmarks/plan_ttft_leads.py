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
3. The first-token cost's form: per engine x dense / MoE, the TTFT median APE when the
   model's GPU part (as in 2) gets a constant, a number of the row's predicted decode
   iterations, or both, each the best on a grid (an upper bound on what one constant per
   group could do; it is scored on the rows it is chosen on), beside the shipped model.

Writes benchmarks/results/plan_ttft_leads.{json,md}.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpufleet.perf.calibration import Calibration, default_calibration
from gpufleet.plan.engines import EngineRules
from gpufleet.validation import measured
from gpufleet.validation.measured import MeasuredRow, RowPrediction, default_csv, read_rows
from gpufleet.validation.recipes import batch_wait_rules
from gpufleet.validation.what_if import SHIPPED, RowRules, WhatIf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import RESULTS, write_result

TRTLLM_OVERHEADS_S = (0.02, 0.04, 0.06, 0.08)


def is_l8_rc3(row: MeasuredRow) -> bool:
    """The TRT-LLM 1.0.0rc3 Llama-3.1-8B-Instruct campaign (aiconfigurator, H100)."""
    return row.backend == "trtllm" and row.id.startswith("meta_llama_llama_3_1_8b_instruct")


def one_slot_fewer(base: RowRules) -> RowRules:
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
    what_if = WhatIf(row_rules=one_slot_fewer(batch_wait_rules)) if slots else SHIPPED
    preds, _ = measured.predict_rows(rows, cal, what_if=what_if)  # unmodelled: count in main
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
    zero = _zeroed(cal)
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


def _zeroed(cal: Calibration) -> Calibration:
    """The calibration with every first-token constant at 0: TTFT is the GPU part."""
    backends = {
        k: dataclasses.replace(v, ttft_overhead_s=0.0, first_token_iterations=0.0)
        for k, v in cal.backends.items()
    }
    return dataclasses.replace(cal, moe_first_token_s=0.0, backends=backends)


def _median_ape(
    points: Sequence[tuple[float, float, float]], const_s: float, iters: float
) -> float:
    """Median APE % of TTFT = GPU part + const_s + iters x TPOT over (measured, GPU, TPOT)."""
    return 100.0 * statistics.median(
        abs((gpu + const_s + iters * tpot) / meas - 1.0) for meas, gpu, tpot in points
    )


def first_token_forms(rows: Sequence[MeasuredRow], cal: Calibration) -> list[dict[str, Any]]:
    shipped = {p.row.id: p.ttft_s for p in predict(rows, cal, slots=False)}
    groups: dict[str, list[tuple[float, float, float]]] = {}
    ship: dict[str, list[float]] = {}
    for p in predict(rows, _zeroed(cal), slots=False):
        r = p.row
        moe = any(m in r.model_path.lower() for m in ("qwen3", "deepseek"))
        key = f"{r.backend} {'MoE' if moe else 'dense'}"
        groups.setdefault(key, []).append((r.ttft_s, p.ttft_s, p.tpot_s))
        ship.setdefault(key, []).append(abs(shipped[r.id] / r.ttft_s - 1.0) * 100.0)
    consts = [i * 0.005 for i in range(81)]  # 0-0.4 s
    iters = [i * 0.5 for i in range(81)]  # 0-40 iterations
    out = []
    for key, pts in sorted(groups.items()):
        c = min((_median_ape(pts, s, 0.0), s) for s in consts)
        k = min((_median_ape(pts, 0.0, n), n) for n in iters)
        both = min((_median_ape(pts, s, n), s, n) for s in consts for n in iters)
        out.append({
            "group": key, "rows": len(pts), "shipped": statistics.median(ship[key]),
            "const": c[0], "const_s": c[1], "iters": k[0], "iters_n": k[1],
            "both": both[0], "both_s": both[1], "both_n": both[2],
        })  # fmt: skip
    return out


def render(
    slots: list[dict[str, Any]], gaps: list[dict[str, Any]], forms: Sequence[dict[str, Any]] = ()
) -> str:
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
    if forms:
        lines += [
            "",
            "First-token cost on top of the GPU part, best on a grid (TTFT median APE %):",
            "",
            "| group | rows | shipped | constant | iterations | both |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for f in forms:
            lines.append(
                f"| {f['group']} | {f['rows']} | {f['shipped']:.1f} "
                f"| {f['const']:.1f} ({f['const_s']:.3f} s) | {f['iters']:.1f} ({f['iters_n']:g}) "
                f"| {f['both']:.1f} ({f['both_s']:.3f} s + {f['both_n']:g}) |"
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
    forms = first_token_forms(rows, cal)
    unmodelled = len(rows) - len(predict(rows, cal, slots=False))
    table = f"{len(rows)} rows, {unmodelled} not modelled.\n\n" + render(slots, gaps, forms)
    print(table)
    data = {
        "rows": len(rows),
        "rows_unmodelled": unmodelled,
        "slots": slots,
        "moe_gaps": gaps,
        "first_token_forms": forms,
    }
    json_path, md_path = write_result(args.out, data, table)
    print(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
