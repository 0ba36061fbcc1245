"""How well the plan's performance model predicts measured serving (issue 2).

    python benchmarks/plan_accuracy.py [CSV] [--model-configs DIR] [--json FILE] [--no-lomo]
                                       [--engine]

Predicts every row of a measured-serving CSV (default:
$GPUFLEET_SHARED/validation/measured_serving_dev.csv; any CSV with the same columns works) by
modelling its closed loop — batch_size concurrent clients of isl input and osl output
tokens — with the roofline step-time model and the closed-loop solver. Prints the median
and p90 absolute percentage error of TTFT and TPOT per backend, per model and overall as
a markdown table, and writes the same as JSON (default benchmarks/results/plan_accuracy.json).
Rows it cannot model (unknown GPU, model or quant mode) are counted and named.

--engine plays each row's closed loop out on `gpufleet.engine` (validation.engine_loop:
desynchronized clients, a warm-up, the benchmark's first wave, a capped number of
iterations) instead of the analytic solver, and reports the analytic scores beside it.

Guard against over-fitting: with --lomo (default on), it also refits the calibration with
each model left out and scores that model's rows with constants that never saw it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gpufleet.errors import UserError
from gpufleet.perf.calibration import default_calibration
from gpufleet.stats import percentile
from gpufleet.validation.fit import fit
from gpufleet.validation.measured import (
    MeasuredRow,
    RowPrediction,
    default_csv,
    predict_rows,
    read_rows,
    resolve_model,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import RESULTS, write_result

TARGET_TPOT_MEDIAN_PCT = 10.0
TARGET_TTFT_MEDIAN_PCT = 20.0


def _pct(pred: float, measured: float) -> float:
    return abs(pred - measured) / measured * 100.0


def _p90(values: Sequence[float]) -> float:
    return percentile(values, 90.0) or 0.0  # gpufleet.stats: numpy's linear


def summarize(preds: Iterable[RowPrediction]) -> dict[str, Any]:
    ps = list(preds)
    if not ps:
        return {"rows": 0}
    ttft = [_pct(p.ttft_s, p.row.ttft_s) for p in ps]
    tpot = [_pct(p.tpot_s, p.row.tpot_s) for p in ps]
    return {
        "rows": len(ps),
        "ttft_median_ape_pct": round(statistics.median(ttft), 2),
        "ttft_p90_ape_pct": round(_p90(ttft), 2),
        "tpot_median_ape_pct": round(statistics.median(tpot), 2),
        "tpot_p90_ape_pct": round(_p90(tpot), 2),
    }


def group_by(preds: Sequence[RowPrediction], key: str) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[RowPrediction]] = defaultdict(list)
    for p in preds:
        groups[str(getattr(p.row, key))].append(p)
    return {k: summarize(v) for k, v in sorted(groups.items())}


def leave_one_model_out(
    rows: Sequence[MeasuredRow], configs_dir: Path | None, *, engine: bool = False
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Refit without each model's rows; score that model with the constants fitted on the rest.

    Models are held out by architecture, so that checkpoints of one architecture
    (DeepSeek-V3 / R1, Llama-3.1-8B-Instruct / its FP8 copy) leave together. The refit is
    the analytic one (the engine path is too slow to fit through); with `engine` the held-out
    rows are then predicted on the engine with those constants."""
    by_arch: dict[tuple[Any, ...], list[MeasuredRow]] = defaultdict(list)
    for r in rows:
        by_arch[_arch_key(r, configs_dir)].append(r)
    by_model = {" + ".join(sorted({r.model_path for r in g})): g for g in by_arch.values()}
    held_out_preds: list[RowPrediction] = []
    per_model: dict[str, dict[str, Any]] = {}
    for name, held in sorted(by_model.items()):
        held_ids = {id(r) for r in held}
        rest = [r for r in rows if id(r) not in held_ids]
        if not rest:
            continue
        cal = fit(rest, default_calibration(), rounds=2)
        preds, _ = predict_rows(held, cal, configs_dir, engine=engine)
        held_out_preds += preds
        per_model[name] = summarize(preds)
    return summarize(held_out_preds), per_model


def _arch_key(row: MeasuredRow, configs_dir: Path | None) -> tuple[Any, ...]:
    spec = resolve_model(row.model_path, configs_dir)
    experts = spec.moe.num_experts if spec.moe else 0
    return (spec.model_type, spec.hidden_size, spec.num_layers, experts)


def model_speed() -> dict[str, float]:
    """What the model costs its callers: one step_time_s (the engine calls it every
    iteration) and one closed-loop prediction (the planner makes a few hundred)."""
    from gpufleet.perf.roofline import RooflineStepTimeModel
    from gpufleet.perf.step_time import StepBatch
    from gpufleet.plan.layout import Layout
    from gpufleet.plan.perf_serving import predict_serving
    from gpufleet.specs.gpus import load_gpu
    from gpufleet.specs.models import load_model

    out: dict[str, float] = {}
    gpu = load_gpu("h200")
    batch = StepBatch(
        prefill_tokens=(512,),
        prefill_context_tokens=(1024,),
        num_decode=64,
        decode_context_tokens=64 * 1500,
    )
    for name, layout in (
        ("meta-llama/Llama-3.1-70B", Layout(tp=4, weight_dtype="fp8")),
        ("deepseek-ai/DeepSeek-V3", Layout(tp=8, ep=8, weight_dtype="fp8")),
    ):
        model = load_model(name)
        step = RooflineStepTimeModel(model, gpu, layout)
        calls = 5000
        t0 = time.perf_counter()
        for _ in range(calls):
            step.step_time_s(batch)
        out[f"{name} step_time_s_us"] = round((time.perf_counter() - t0) / calls * 1e6, 2)
        t0 = time.perf_counter()
        for c in (1, 16, 128, 512):
            predict_serving(model, gpu, layout, 1024, 256, c, step_model=step)
        out[f"{name} predict_serving_ms"] = round((time.perf_counter() - t0) / 4 * 1e3, 3)
    return out


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "| group | rows | TTFT median APE % | TTFT p90 APE % | TPOT median APE % | TPOT p90 APE % |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]

    def add(label: str, s: dict[str, Any]) -> None:
        if not s.get("rows"):
            lines.append(f"| {label} | 0 | – | – | – | – |")
            return
        lines.append(
            f"| {label} | {s['rows']} | {s['ttft_median_ape_pct']:.1f} | {s['ttft_p90_ape_pct']:.1f}"
            f" | {s['tpot_median_ape_pct']:.1f} | {s['tpot_p90_ape_pct']:.1f} |"
        )

    add("**overall**", report["overall"])
    for name, s in report["per_backend"].items():
        add(f"backend {name}", s)
    for name, s in report["per_model"].items():
        add(f"model {name}", s)
    if "leave_one_model_out" in report:
        add("**leave-one-model-out**", report["leave_one_model_out"]["overall"])
        for name, s in report["leave_one_model_out"]["per_model"].items():
            add(f"LOMO {name}", s)
    out = f"Closed loop: {report.get('closed_loop', 'analytic')}\n\n" + "\n".join(lines)
    if "analytic" in report:
        out += "\n\n" + _comparison(report)
    if "model_speed" in report:
        out += "\n\n| model cost | value |\n| --- | ---: |\n"
        out += "\n".join(f"| {k} | {v} |" for k, v in report["model_speed"].items())
    skipped = report["unmodelled"]
    out += f"\n\nUnmodelled rows: {skipped['count']}"
    by_reason: dict[str, list[str]] = defaultdict(list)
    for item in skipped["rows"]:
        by_reason[item["reason"]].append(item["id"])
    for reason, ids in sorted(by_reason.items()):
        shown = ", ".join(ids[:3]) + (f", … ({len(ids)} rows)" if len(ids) > 3 else "")
        out += f"\n- {reason}: {shown}"
    return out


def _comparison(report: dict[str, Any]) -> str:
    """Engine-driven vs analytic closed loop, median APE side by side."""
    lines = [
        "| group | TTFT analytic % | TTFT engine % | TPOT analytic % | TPOT engine % |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    ana = report["analytic"]
    pairs = [("**overall**", ana["overall"], report["overall"])]
    pairs += [
        (f"backend {k}", v, report["per_backend"].get(k, {})) for k, v in ana["per_backend"].items()
    ]
    pairs += [
        (f"model {k}", v, report["per_model"].get(k, {})) for k, v in ana["per_model"].items()
    ]
    for label, a, e in pairs:
        if not a.get("rows") or not e.get("rows"):
            continue
        lines.append(
            f"| {label} | {a['ttft_median_ape_pct']:.1f} | {e['ttft_median_ape_pct']:.1f}"
            f" | {a['tpot_median_ape_pct']:.1f} | {e['tpot_median_ape_pct']:.1f} |"
        )
    return "\n".join(lines)


def run(
    csv_path: Path, configs_dir: Path | None = None, lomo: bool = True, engine: bool = False
) -> dict[str, Any]:
    rows = read_rows(csv_path)
    t0 = time.perf_counter()
    preds, skipped = predict_rows(rows, default_calibration(), configs_dir, engine=engine)
    predict_s = time.perf_counter() - t0
    report: dict[str, Any] = {
        "csv": str(csv_path),
        "closed_loop": "engine" if engine else "analytic",
        "predict_all_rows_s": round(predict_s, 2),
        "rows_total": len(rows),
        "targets": {
            "ttft_median_ape_pct": TARGET_TTFT_MEDIAN_PCT,
            "tpot_median_ape_pct": TARGET_TPOT_MEDIAN_PCT,
        },
        "overall": summarize(preds),
        "per_backend": group_by(preds, "backend"),
        "per_model": group_by(preds, "model_path"),
        "unmodelled": {
            "count": len(skipped),
            "rows": [{"id": r.id, "model": r.model_path, "reason": why} for r, why in skipped],
        },
    }
    if engine:
        analytic, _ = predict_rows(rows, default_calibration(), configs_dir)
        report["analytic"] = {
            "overall": summarize(analytic),
            "per_backend": group_by(analytic, "backend"),
            "per_model": group_by(analytic, "model_path"),
        }
    report["model_speed"] = model_speed()
    if lomo and preds:
        modelled = [p.row for p in preds]
        overall, per_model = leave_one_model_out(modelled, configs_dir, engine=engine)
        report["leave_one_model_out"] = {"overall": overall, "per_model": per_model}
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "csv", nargs="?", type=Path, default=None, help="default: $GPUFLEET_SHARED/validation/"
    )
    parser.add_argument("--model-configs", type=Path, default=None)
    parser.add_argument(
        "--out", "--json", type=Path, default=RESULTS / "plan_accuracy", help="path without suffix"
    )
    parser.add_argument(
        "--no-lomo", action="store_true", help="skip the leave-one-model-out refits"
    )
    parser.add_argument(
        "--engine",
        action="store_true",
        help="play each row's closed loop out on gpufleet.engine instead of the analytic solver",
    )
    args = parser.parse_args(argv)
    if args.model_configs is not None and not args.model_configs.is_dir():
        parser.error(f"--model-configs {args.model_configs} is not a directory")
    try:
        args.csv = args.csv or default_csv()
        report = run(args.csv, args.model_configs, lomo=not args.no_lomo, engine=args.engine)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    table = markdown(report)
    print(table)
    json_path, md_path = write_result(args.out, report, table, note=f"CSV: {args.csv.name}")
    print(f"\nwrote {json_path} and {md_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
