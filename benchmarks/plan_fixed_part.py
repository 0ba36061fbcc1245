"""How much of each held-out fold's TTFT error is its fixed first-token part (issue 14).

    python benchmarks/plan_fixed_part.py [CSV] [--report JSON] [--model-configs DIR] [--out PATH]

Reads a `plan_accuracy.py` report (default: results/plan_accuracy.json), takes each
held-out fold's kept constants (leave-one-model-out and leave-one-GPU-out), predicts the
fold's rows with them, and scores their TTFT twice: as predicted, and with the fold's fixed
first-token part (the engine's `ttft_overhead_s`, plus `moe_first_token_s` on an MoE model:
`Calibration.first_token_overhead_s`) replaced by the shipped constants' (an additive
counterfactual: the rest of the prediction, queue included, stays the fold's). Beside each
fold: its TPOT and the fixed-part constants it reached. docs/performance-model.md, "Wave 18:
low-load first token, held out" and "Wave 19". No refit: about a minute.

Writes benchmarks/results/plan_fixed_part.{json,md}.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpufleet.errors import UserError
from gpufleet.perf.calibration import Calibration, calibration_from_dict, default_calibration
from gpufleet.validation.measured import (
    MeasuredRow,
    RowPrediction,
    predict_rows,
    read_rows,
    resolve_model,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_refits import arch_key, held_out_folds
from plan_rows_cli import rows_parser, write_report
from record import RESULTS

SCHEMES = ("leave_one_model_out", "leave_one_gpu_out")
ENGINES = ("sglang", "trtllm", "vllm")


def _ape(pred_s: float, measured_s: float) -> float:
    return abs(pred_s / measured_s - 1.0) * 100.0


def with_fixed_part(
    pred: RowPrediction, fold: Calibration, other: Calibration, configs_dir: Path | None = None
) -> float:
    """The row's predicted TTFT with `fold`'s fixed first-token part replaced by `other`'s."""
    row = pred.row
    moe = resolve_model(row.model_path, configs_dir).moe is not None
    fixed = fold.first_token_overhead_s(row.backend, moe)
    return pred.ttft_s - fixed + other.first_token_overhead_s(row.backend, moe)


def row_errors(
    pred: RowPrediction, fold: Calibration, shipped: Calibration, configs_dir: Path | None = None
) -> tuple[float, float, float]:
    """A row's APEs (%): TTFT as predicted, TTFT with the shipped fixed part, TPOT."""
    swapped = with_fixed_part(pred, fold, shipped, configs_dir)
    return pred.ttft_ape_pct, _ape(swapped, pred.row.ttft_s), pred.tpot_ape_pct


KEYS = ("ttft_ape_pct", "ttft_shipped_fixed_ape_pct", "tpot_ape_pct")


def score(errors: Sequence[tuple[float, float, float]]) -> dict[str, Any]:
    """The rows' median APEs (`row_errors`), NaN without rows."""
    if not errors:
        return {"rows": 0, **{k: float("nan") for k in KEYS}}
    medians = {k: round(statistics.median(e[i] for e in errors), 1) for i, k in enumerate(KEYS)}
    return {"rows": len(errors), **medians}


def _fixed_constants(cal: Calibration) -> dict[str, float]:
    out = {f"{b}_ttft_overhead_ms": round(cal.backend(b).ttft_overhead_s * 1e3, 1) for b in ENGINES}
    out["moe_first_token_ms"] = round(cal.moe_first_token_s * 1e3, 1)
    return out


def run(csv_path: Path, report: dict[str, Any], configs_dir: Path | None = None) -> dict[str, Any]:
    rows = read_rows(csv_path)
    shipped = default_calibration()
    out: dict[str, Any] = {"shipped": _fixed_constants(shipped)}
    for scheme in SCHEMES:
        if scheme not in report:
            continue
        groups = report[scheme]["per_group"]

        def group_of(r: MeasuredRow, scheme: str = scheme) -> Any:
            return arch_key(r, configs_dir) if scheme == "leave_one_model_out" else r.system

        folds: dict[str, Any] = {}
        every: list[tuple[float, float, float]] = []
        for name, held, _ in held_out_folds(rows, group_of):
            if name not in groups:
                continue
            g = groups[name]
            cal = calibration_from_dict(g["starts"][g["start"]]["constants"])
            preds, _ = predict_rows(held, cal, configs_dir)
            errors = [row_errors(p, cal, shipped, configs_dir) for p in preds]
            folds[name] = {**score(errors), "start": g["start"], **_fixed_constants(cal)}
            every += errors
        out[scheme] = {"overall": score(every), "per_group": folds}
    return out


def markdown(report: dict[str, Any]) -> str:
    head = (
        "| fold | rows | start | TTFT % | TTFT %, shipped fixed part | TPOT % | "
        + " | ".join(f"{b} ttft_overhead ms" for b in ENGINES)
        + " | moe_first_token ms |"
    )
    lines = [head, "| --- " * 3 + "| ---: " * (len(ENGINES) + 4) + "|"]
    s = report["shipped"]
    lines.append(
        "| shipped (all rows) | | | | | | "
        + " | ".join(str(s[f"{b}_ttft_overhead_ms"]) for b in ENGINES)
        + f" | {s['moe_first_token_ms']} |"
    )
    for scheme in SCHEMES:
        if scheme not in report:
            continue
        o = report[scheme]["overall"]
        lines.append(
            f"| **{scheme.replace('_', '-')}** | {o['rows']} | | {o.get('ttft_ape_pct')} | "
            f"{o.get('ttft_shipped_fixed_ape_pct')} | {o.get('tpot_ape_pct')} |"
            + " |"
            * (len(ENGINES) + 1)
        )
        for name, f in report[scheme]["per_group"].items():
            lines.append(
                f"| {name} | {f['rows']} | {f['start']} | {f['ttft_ape_pct']} | "
                f"{f['ttft_shipped_fixed_ape_pct']} | {f['tpot_ape_pct']} | "
                + " | ".join(str(f[f"{b}_ttft_overhead_ms"]) for b in ENGINES)
                + f" | {f['moe_first_token_ms']} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = rows_parser(__doc__ or "", "plan_fixed_part")
    parser.add_argument(
        "--report",
        type=Path,
        default=RESULTS / "plan_accuracy.json",
        help="a plan_accuracy.py report (its folds' kept constants)",
    )
    args = parser.parse_args(argv)

    def report(csv_path: Path) -> dict[str, Any]:
        try:
            data = json.loads(args.report.read_text())
        except (OSError, ValueError) as e:
            raise UserError(f"cannot read the report {args.report}: {e}") from e
        return run(csv_path, data, args.model_configs)

    return write_report(args, report, markdown)


if __name__ == "__main__":
    raise SystemExit(main())
