"""Where the plan model's TTFT misses measured serving, and the shape of the miss (issue 14).

    python benchmarks/plan_residuals.py [CSV] [--model-configs DIR] [--out PATH] [--rows FILE]

Predicts every row as `plan_accuracy.py` does (shipped calibration, analytic closed loop)
and groups the rows by campaign: backend, backend version (the CSV's `backend_version`
column, read here only to label groups; the model never sees it), model, GPU and layout.
Per group it reports:

* rows, TTFT median APE and bias (median log(predicted / measured): + over-predicts);
* spread: TTFT median APE left once the group's bias is removed — the row-to-row shape a
  per-group constant cannot fix (its overall median is the "oracle" figure);
* TPOT median APE;
* low-load gap: median measured - predicted TTFT over the group's rows with at most
  LOW_LOAD_CLIENTS clients per rank (what the model misses when nothing queues: a fixed
  first-token cost); the same over all dense and over all MoE rows heads the table;
* osl_slope: within each (isl, concurrency) cell measured at two or more output lengths,
  the least-squares slope of measured TTFT against E2E/c = osl x TPOT / c (one request's
  decode time over the clients: the interval between completions). The closed loop says
  0 (a prompt's TTFT does not depend on how long the others decode); 1 means each
  request waits for one other to finish first, as when the engine admits one request
  fewer than there are clients. The median over the group's cells, and their count.

Writes benchmarks/results/plan_residuals.{json,md}; --rows also writes one line per row
(CSV: labels, measured and predicted TTFT / TPOT, log errors) for plotting.
"""

from __future__ import annotations

import csv
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gpufleet.perf.calibration import default_calibration
from gpufleet.validation.measured import (
    MeasuredRow,
    RowPrediction,
    predict_rows,
    read_rows,
    resolve_model,
)
from plan_rows_cli import rows_parser, write_report

sys.path.insert(0, str(Path(__file__).resolve().parent))

# A cell's slope is only read when its output lengths spread E2E/c this much (relative):
# below it the slope is noise over a near-constant x.
MIN_X_SPREAD = 0.5
# Rows with at most this many clients per rank are "low load": little queueing, so what
# the model misses there is a fixed first-token cost.
LOW_LOAD_CLIENTS = 8


def osl_slope(points: Iterable[tuple[float, float]]) -> float | None:
    """Least-squares slope of y on x over (x, y) points, or None when x barely varies."""
    pts = list(points)
    if len(pts) < 2:
        return None
    xs = [x for x, _ in pts]
    mx = statistics.fmean(xs)
    if mx <= 0 or (max(xs) - min(xs)) / mx < MIN_X_SPREAD:
        return None
    my = statistics.fmean(y for _, y in pts)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx


def cell_slopes(rows: Iterable[MeasuredRow]) -> list[float]:
    """osl_slope of measured TTFT against osl x TPOT / c in each (isl, c) cell."""
    cells: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for r in rows:
        cells[(r.isl, r.batch_size)].append((r.osl * r.tpot_s / r.batch_size, r.ttft_s))
    slopes = [osl_slope(pts) for pts in cells.values()]
    return [s for s in slopes if s is not None]


def _versions(csv_path: Path) -> dict[str, str]:
    """Each row id's backend_version (empty when the CSV has none)."""
    with csv_path.open(newline="") as f:
        return {r.get("id") or "": (r.get("backend_version") or "") for r in csv.DictReader(f)}


def group_label(row: MeasuredRow, version: str) -> str:
    model = row.model_path.split("/")[-1]
    layout = f"tp{row.tp} dp{row.attention_dp} moe{row.moe_tp}x{row.moe_ep}"
    return f"{row.backend} {version or '-'} {model} {row.system} {layout}"


def _log_err(pred: float, measured: float) -> float:
    return math.log(pred / measured)


def _ape(log_err: float) -> float:
    return abs(math.exp(log_err) - 1.0) * 100.0


def low_load_gap_ms(preds: Iterable[RowPrediction]) -> float | None:
    """Median measured - predicted TTFT (ms) over the low-load rows, or None without any."""
    gaps = [
        (p.row.ttft_s - p.ttft_s) * 1e3 for p in preds if p.serving.concurrency <= LOW_LOAD_CLIENTS
    ]
    return round(statistics.median(gaps), 1) if gaps else None


def summarize_group(preds: Sequence[RowPrediction]) -> dict[str, Any]:
    ttft = [_log_err(p.ttft_s, p.row.ttft_s) for p in preds]
    tpot = [_log_err(p.tpot_s, p.row.tpot_s) for p in preds]
    bias = statistics.median(ttft)
    slopes = cell_slopes(p.row for p in preds)
    return {
        "rows": len(preds),
        "ttft_median_ape_pct": round(statistics.median(_ape(e) for e in ttft), 1),
        "ttft_bias_log": round(bias, 3),
        "ttft_spread_ape_pct": round(statistics.median(_ape(e - bias) for e in ttft), 1),
        "tpot_median_ape_pct": round(statistics.median(_ape(e) for e in tpot), 1),
        "osl_slope": round(statistics.median(slopes), 2) if slopes else None,
        "osl_cells": len(slopes),
        "low_load_gap_ms": low_load_gap_ms(preds),
    }


def run(csv_path: Path, configs_dir: Path | None = None) -> tuple[dict[str, Any], list[Any]]:
    rows = read_rows(csv_path)
    versions = _versions(csv_path)
    preds, skipped = predict_rows(rows, default_calibration(), configs_dir)
    groups: dict[str, list[RowPrediction]] = defaultdict(list)
    for p in preds:
        groups[group_label(p.row, versions.get(p.row.id, ""))].append(p)
    per_group = {k: summarize_group(v) for k, v in sorted(groups.items())}
    bias = {k: s["ttft_bias_log"] for k, s in per_group.items()}
    label_of = {id(p): k for k, ps in groups.items() for p in ps}
    all_ttft = [_log_err(p.ttft_s, p.row.ttft_s) for p in preds]
    oracle = [e - bias[label_of[id(p)]] for p, e in zip(preds, all_ttft, strict=True)]
    moe = {p.row.model_path: resolve_model(p.row.model_path, configs_dir).moe is not None
           for p in preds}  # fmt: skip
    report: dict[str, Any] = {
        "csv": str(csv_path),
        "rows_modelled": len(preds),
        "rows_unmodelled": len(skipped),
        "ttft_median_ape_pct": round(statistics.median(_ape(e) for e in all_ttft), 1),
        "ttft_oracle_group_bias_ape_pct": round(statistics.median(_ape(e) for e in oracle), 1),
        "low_load_gap_ms": {
            kind: low_load_gap_ms(p for p in preds if moe[p.row.model_path] == is_moe)
            for kind, is_moe in (("dense", False), ("moe", True))
        },
        "per_group": per_group,
    }
    lines = [
        (p.row.id, label_of[id(p)], p.row.isl, p.row.osl, p.row.batch_size,
         round(p.row.ttft_s * 1e3, 2), round(p.ttft_s * 1e3, 2),
         round(p.row.tpot_s * 1e3, 3), round(p.tpot_s * 1e3, 3),
         round(e, 4), round(_log_err(p.tpot_s, p.row.tpot_s), 4))
        for p, e in zip(preds, all_ttft, strict=True)
    ]  # fmt: skip
    return report, lines


ROW_COLUMNS = ("id", "group", "isl", "osl", "concurrency", "ttft_ms", "pred_ttft_ms",
               "tpot_ms", "pred_tpot_ms", "ttft_log_err", "tpot_log_err")  # fmt: skip


def markdown(report: dict[str, Any]) -> str:
    out = [
        f"TTFT median APE {report['ttft_median_ape_pct']:.1f} % over "
        f"{report['rows_modelled']} rows; with each group's bias removed (the best a constant "
        f"per group could do) {report['ttft_oracle_group_bias_ape_pct']:.1f} %.",
        "",
        f"Low-load TTFT gap (measured - predicted, median over rows with <= {LOW_LOAD_CLIENTS} "
        f"clients per rank): dense models {_ms(report['low_load_gap_ms']['dense'])}, MoE "
        f"models {_ms(report['low_load_gap_ms']['moe'])}.",
        "",
        "| group (backend version model GPU layout) | rows | TTFT APE % | bias (log) "
        "| spread APE % | TPOT APE % | osl slope (cells) | low-load gap ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, s in sorted(report["per_group"].items(), key=lambda kv: -kv[1]["rows"]):
        slope = "–" if s["osl_slope"] is None else f"{s['osl_slope']:.2f} ({s['osl_cells']})"
        out.append(
            f"| {name} | {s['rows']} | {s['ttft_median_ape_pct']:.1f} | {s['ttft_bias_log']:+.2f}"
            f" | {s['ttft_spread_ape_pct']:.1f} | {s['tpot_median_ape_pct']:.1f} | {slope}"
            f" | {_ms(s['low_load_gap_ms'])} |"
        )
    return "\n".join(out)


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:+.0f} ms"


def main(argv: Sequence[str] | None = None) -> int:
    parser = rows_parser(__doc__, "plan_residuals")
    parser.add_argument("--rows", type=Path, default=None, help="also write one CSV line a row")
    args = parser.parse_args(argv)

    def report_writing_rows(csv_path: Path) -> dict[str, Any]:
        report, lines = run(csv_path, args.model_configs)
        if args.rows is not None:
            with args.rows.open("w", newline="") as f:
                w = csv.writer(f)
                w.writerow(ROW_COLUMNS)
                w.writerows(lines)
        return report

    return write_report(args, report_writing_rows, markdown)


if __name__ == "__main__":
    raise SystemExit(main())
