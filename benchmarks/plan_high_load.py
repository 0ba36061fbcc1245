"""Where the plan model's TTFT misses at high concurrency, and what the rows' own rates say
(issue 14, wave 18).

    python benchmarks/plan_high_load.py [CSV] [--model-configs DIR] [--out PATH]

Predicts every row as `plan_accuracy.py` does (shipped calibration, analytic closed loop)
and reads each row, measured and predicted, by Little's law on its closed loop of c
clients: the request rate X = c / (TTFT + (osl - 1) x TPOT), the streamed output rate
X x osl, the clients decoding (X x (osl - 1) x TPOT) and those waiting for a first token
(X x TTFT). Reports:

* how much of the in-sample TTFT median sits in rows at high concurrency: the median had
  the rows of a band (>= 64, >= 128 clients; one campaign's) been predicted exactly, and
  the rows above 12 % APE per concurrency band and engine;
* per campaign (`plan_residuals.group_label`) at >= 64 clients: TTFT APE and bias, the
  largest measured streamed rate, and the clients waiting, measured and predicted;
* the rows where >= 15 % of the clients wait for a first token (a queue in front of the
  engine or its front end, not the engine's iteration), with the model's decoding count
  beside the measured one;
* what-ifs, each on every row with the shipped constants (nothing refitted): a cap on the
  requests TRT-LLM runs at once (the rows' decoding count, no documented default gives it),
  and a front end whose work per request also grows with the prompt (tokenizing it in the
  API process) at TRT-LLM's shipped streamed-token ceiling and at the rows' ~9,000.

Writes benchmarks/results/plan_high_load.{json,md}. A diagnostic: it fits nothing and the
model is not changed by it (each what-if is a `validation.what_if.WhatIf` handed to
`predict_rows`).
"""

from __future__ import annotations

import csv
import dataclasses
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpufleet.perf.calibration import Calibration, default_calibration
from gpufleet.perf.step_time import StepTimeModel
from gpufleet.plan.closed_loop import SchedulerShape, ServingPrediction, predict_closed_loop
from gpufleet.validation import measured
from gpufleet.validation.measured import RowPrediction, predict_rows, read_rows
from gpufleet.validation.rows import MeasuredRow
from gpufleet.validation.what_if import SHIPPED, ClosedLoop, WhatIf, running_cap
from plan_rows_cli import rows_parser, write_report

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_residuals import group_label

BANDS = ((1, 8), (9, 32), (33, 63), (64, 127), (128, 255), (256, 1 << 30))
# In-sample target (issue 14) against which rows are counted.
TARGET_PCT = 12.0
# A row is "waiting" when at least this share of its clients waits for a first token.
WAITING_SHARE = 0.15


def _versions(csv_path: Path) -> dict[str, str]:
    with csv_path.open(newline="") as f:
        return {r.get("id") or "": (r.get("backend_version") or "") for r in csv.DictReader(f)}


def little(clients: int, osl: int, ttft_s: float, tpot_s: float) -> dict[str, float]:
    """The closed loop's rates and populations from one row's mean TTFT / TPOT."""
    rate = clients / (ttft_s + (osl - 1) * tpot_s)
    return {
        "requests_per_s": rate,
        "output_tokens_per_s": rate * osl,
        "decoding": rate * (osl - 1) * tpot_s,
        "waiting": rate * ttft_s,
    }


def ape(p: RowPrediction) -> float:
    return abs(p.ttft_s / p.row.ttft_s - 1.0) * 100.0


def bias(ps: Sequence[RowPrediction]) -> float:
    return statistics.median(math.log(p.ttft_s / p.row.ttft_s) for p in ps)


def band_of(clients: int) -> str:
    for lo, hi in BANDS:
        if lo <= clients <= hi:
            return f"{lo}-{hi}" if hi < 1 << 30 else f">={lo}"
    return "?"


def exact_median(preds: Sequence[RowPrediction], exact: Callable[[MeasuredRow], bool]) -> float:
    """The TTFT median APE had the rows `exact` selects been predicted exactly."""
    return statistics.median(0.0 if exact(p.row) else ape(p) for p in preds)


def prompt_frontend(s_per_prompt_token: float) -> ClosedLoop:
    """The closed loop with a front end whose work per request is isl x s_per_prompt_token
    + osl / its streamed tokens/s ceiling (the model's ceiling counts output tokens only)."""

    def closed_loop(step: StepTimeModel, isl: int, osl: int, clients: int,
                    shape: SchedulerShape | None = None, **kw: Any) -> ServingPrediction:  # fmt: skip
        f = math.inf if shape is None else shape.max_output_tokens_per_s
        if shape is not None and math.isfinite(f):
            f = osl / (isl * s_per_prompt_token + osl / f)
            shape = dataclasses.replace(shape, max_output_tokens_per_s=f)
        return predict_closed_loop(step, isl, osl, clients, shape, **kw)

    return closed_loop


def with_frontend(cal: Calibration, engine: str, tokens_per_s: float) -> Calibration:
    backends = dict(cal.backends)
    backends[engine] = dataclasses.replace(backends[engine], frontend_tokens_per_s=tokens_per_s)
    return dataclasses.replace(cal, backends=backends)


def score(preds: Sequence[RowPrediction], focus: Callable[[MeasuredRow], bool]) -> dict[str, Any]:
    """In-sample medians, the fit's objective (`validation.fit._combine`'s), and the
    TTFT median of the rows `focus` selects and of the other TRT-LLM rows (None: no rows)."""
    ttft = [abs(math.log(p.ttft_s / p.row.ttft_s)) for p in preds]
    tpot = [abs(math.log(p.tpot_s / p.row.tpot_s)) for p in preds]

    def median_ape(ps: Sequence[RowPrediction]) -> float | None:
        return round(statistics.median(ape(p) for p in ps), 1) if ps else None

    return {
        "ttft_median_ape_pct": round(statistics.median(ape(p) for p in preds), 2),
        "tpot_median_ape_pct": round(
            statistics.median(abs(p.tpot_s / p.row.tpot_s - 1) * 100 for p in preds), 2
        ),
        "above_target": sum(ape(p) > TARGET_PCT for p in preds),
        "objective": round(statistics.median(ttft) / 0.2 + statistics.median(tpot) / 0.1, 4),
        "focus_ttft_median_ape_pct": median_ape([p for p in preds if focus(p.row)]),
        "other_trtllm_ttft_median_ape_pct": median_ape(
            [p for p in preds if p.row.backend == "trtllm" and not focus(p.row)]
        ),
    }


def what_ifs(rows: Sequence[MeasuredRow], configs_dir: Path | None,
             focus: Callable[[MeasuredRow], bool]) -> dict[str, dict[str, Any]]:  # fmt: skip
    shipped = default_calibration()
    f_shipped = shipped.backend("trtllm").frontend_tokens_per_s
    out: dict[str, dict[str, Any]] = {}

    def one(name: str, cal: Calibration, what_if: WhatIf = SHIPPED) -> None:
        measured._KV_CACHE.clear()
        preds, _ = predict_rows(rows, cal, configs_dir, what_if=what_if)
        out[name] = score(preds, focus)

    one("shipped", shipped)
    for cap in (112, 96):
        capped = WhatIf(row_rules=running_cap("trtllm", cap))
        one(f"TRT-LLM runs at most {cap} requests", shipped, capped)
    for s_us in (4.0, 8.0):
        frontend = WhatIf(closed_loop=prompt_frontend(s_us * 1e-6))
        one(f"front end {s_us:g} us / prompt token, {f_shipped:.0f} tokens/s", shipped, frontend)
        one(f"front end {s_us:g} us / prompt token, 9000 tokens/s",
            with_frontend(shipped, "trtllm", 9000.0), frontend)  # fmt: skip
    measured._KV_CACHE.clear()
    return out


def run(csv_path: Path, configs_dir: Path | None = None) -> dict[str, Any]:
    rows = read_rows(csv_path)
    versions = _versions(csv_path)
    preds, skipped = predict_rows(rows, default_calibration(), configs_dir)
    label = {id(p): group_label(p.row, versions.get(p.row.id, "")) for p in preds}
    errors = [ape(p) for p in preds]

    share: dict[str, Any] = {
        "ttft_median_ape_pct": round(statistics.median(errors), 2),
        "rows_above_target": sum(e > TARGET_PCT for e in errors),
        "rows_above_target_allowed": len(preds) // 2,
    }
    for lo in (64, 128):
        share[f"exact_at_{lo}_clients_or_more"] = round(
            exact_median(preds, lambda r, lo=lo: r.batch_size >= lo), 2
        )
    campaigns: dict[str, list[RowPrediction]] = defaultdict(list)
    for p in preds:
        campaigns[label[id(p)]].append(p)
    per_campaign_exact = {}
    for name, ps in campaigns.items():
        ids = {q.row.id for q in ps if q.row.batch_size >= 64}
        if ids:
            per_campaign_exact[name] = round(exact_median(preds, lambda r, ids=ids: r.id in ids), 2)
    share["exact_at_64_or_more_per_campaign"] = dict(
        sorted(per_campaign_exact.items(), key=lambda kv: kv[1])
    )

    bands: dict[str, dict[str, Any]] = {}
    for backend in sorted({p.row.backend for p in preds}):
        for lo, hi in BANDS:
            ps = [p for p in preds if p.row.backend == backend and lo <= p.row.batch_size <= hi]
            if ps:
                bands[f"{backend} {band_of(lo)}"] = {
                    "rows": len(ps),
                    "above_target": sum(ape(p) > TARGET_PCT for p in ps),
                    "ttft_median_ape_pct": round(statistics.median(ape(p) for p in ps), 1),
                    "ttft_bias_log": round(bias(ps), 2),
                }

    high: dict[str, dict[str, Any]] = {}
    for name, ps in sorted(campaigns.items()):
        hp = [p for p in ps if p.row.batch_size >= 64]
        if not hp:
            continue
        measured = [little(p.row.batch_size, p.row.osl, p.row.ttft_s, p.row.tpot_s) for p in ps]
        high[name] = {
            "rows_at_64_or_more": len(hp),
            "above_target": sum(ape(p) > TARGET_PCT for p in hp),
            "ttft_median_ape_pct": round(statistics.median(ape(p) for p in hp), 1),
            "ttft_bias_log": round(bias(hp), 2),
            "max_output_tokens_per_s": round(max(m["output_tokens_per_s"] for m in measured)),
        }

    waiting_rows = []
    for p in preds:
        r = p.row
        m = little(r.batch_size, r.osl, r.ttft_s, r.tpot_s)
        if m["waiting"] < WAITING_SHARE * r.batch_size or r.batch_size < 64:
            continue
        q = little(r.batch_size, r.osl, p.ttft_s, p.tpot_s)
        waiting_rows.append({
            "campaign": label[id(p)], "tp": r.tp, "isl": r.isl, "osl": r.osl,
            "clients": r.batch_size,
            "ttft_ms": round(r.ttft_s * 1e3), "pred_ttft_ms": round(p.ttft_s * 1e3),
            "tpot_ms": round(r.tpot_s * 1e3, 1), "pred_tpot_ms": round(p.tpot_s * 1e3, 1),
            "output_tokens_per_s": round(m["output_tokens_per_s"]),
            "pred_output_tokens_per_s": round(q["output_tokens_per_s"]),
            "decoding": round(m["decoding"], 1), "pred_decoding": round(q["decoding"], 1),
            "waiting": round(m["waiting"], 1), "pred_waiting": round(q["waiting"], 1),
        })  # fmt: skip

    def focus(r: MeasuredRow) -> bool:  # the campaign the brief names, at 128 clients
        return (r.backend == "trtllm" and versions.get(r.id) == "1.0.0rc3"
                and "Llama-3.1-8B" in r.model_path and r.batch_size >= 128)  # fmt: skip

    return {
        "csv": str(csv_path),
        "rows_modelled": len(preds),
        "rows_unmodelled": len(skipped),
        "what_ifs": what_ifs(rows, configs_dir, focus),
        "share": share,
        "bands": bands,
        "campaigns_at_64_or_more": high,
        "waiting_rows": waiting_rows,
    }


def markdown(report: dict[str, Any]) -> str:
    s = report["share"]
    out = [
        f"In-sample TTFT median APE {s['ttft_median_ape_pct']:.2f} % over "
        f"{report['rows_modelled']} rows, {s['rows_above_target']} above {TARGET_PCT:.0f} % "
        f"(at most {s['rows_above_target_allowed']} for a {TARGET_PCT:.0f} % median). Had "
        f"every row at >= 64 clients been exact: {s['exact_at_64_clients_or_more']:.2f} %; "
        f">= 128: {s['exact_at_128_clients_or_more']:.2f} %.",
        "",
        "Had one campaign's rows at >= 64 clients been exact (in-sample TTFT median %):",
        "",
        "| campaign | median |",
        "| --- | ---: |",
    ]
    for name, v in s["exact_at_64_or_more_per_campaign"].items():
        out.append(f"| {name} | {v:.2f} |")
    out += [
        "",
        "| engine, clients | rows | above target | TTFT APE % | bias (log) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, b in report["bands"].items():
        out.append(
            f"| {name} | {b['rows']} | {b['above_target']} | {b['ttft_median_ape_pct']:.1f} "
            f"| {b['ttft_bias_log']:+.2f} |"
        )
    out += [
        "",
        "| campaign, rows at >= 64 clients | rows | above target | TTFT APE % | bias (log) "
        "| largest streamed tokens/s (any load) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, h in sorted(
        report["campaigns_at_64_or_more"].items(), key=lambda kv: -kv[1]["above_target"]
    ):
        out.append(
            f"| {name} | {h['rows_at_64_or_more']} | {h['above_target']} "
            f"| {h['ttft_median_ape_pct']:.1f} | {h['ttft_bias_log']:+.2f} "
            f"| {h['max_output_tokens_per_s']} |"
        )
    out += [
        "",
        f"Rows at >= 64 clients where >= {WAITING_SHARE:.0%} of the clients wait for a first "
        "token (measured / predicted; Little's law on each row's closed loop):",
        "",
        "| campaign | TP | isl / osl | clients | TTFT ms | TPOT ms | tokens/s | decoding "
        "| waiting |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for w in report["waiting_rows"]:
        out.append(
            f"| {w['campaign']} | {w['tp']} | {w['isl']} / {w['osl']} | {w['clients']} "
            f"| {w['ttft_ms']} / {w['pred_ttft_ms']} | {w['tpot_ms']} / {w['pred_tpot_ms']} "
            f"| {w['output_tokens_per_s']} / {w['pred_output_tokens_per_s']} "
            f"| {w['decoding']} / {w['pred_decoding']} | {w['waiting']} / {w['pred_waiting']} |"
        )
    out += [
        "",
        "What-ifs on every row, shipped constants, nothing refitted (focus: TRT-LLM 1.0.0rc3 "
        "Llama-3.1-8B at 128 clients, 33 rows):",
        "",
        "| what-if | TTFT % | TPOT % | rows above target | objective | focus TTFT % "
        "| other TRT-LLM TTFT % |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, w in report["what_ifs"].items():
        out.append(
            f"| {name} | {w['ttft_median_ape_pct']:.2f} | {w['tpot_median_ape_pct']:.2f} "
            f"| {w['above_target']} | {w['objective']:.4f} | {_pct(w['focus_ttft_median_ape_pct'])} "
            f"| {_pct(w['other_trtllm_ttft_median_ape_pct'])} |"
        )
    return "\n".join(out)


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def main(argv: Sequence[str] | None = None) -> int:
    args = rows_parser(__doc__, "plan_high_load").parse_args(argv)
    return write_report(args, lambda csv_path: run(csv_path, args.model_configs), markdown)


if __name__ == "__main__":
    raise SystemExit(main())
