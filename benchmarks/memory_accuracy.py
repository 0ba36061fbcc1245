"""Memory predictions against real vLLM startups (issue 14).

    python benchmarks/memory_accuracy.py [--data CSV] [--json FILE]

Each row of `benchmarks/data/vllm_startups.csv` is one real vLLM startup taken from a
public log (the `source` column): the model, GPU, TP / PP / DP / EP, max_model_len,
gpu_memory_utilization, KV-cache dtype, runtime --quantization and vLLM version it ran
with, and what vLLM logged — the weights of rank 0 ("Model loading took X GiB"), the KV
cache it sized ("Available KV cache memory: Y GiB") and the tokens that holds ("GPU KV cache
size: N tokens"; empty where the log does not say); `pp_stage` names the pipeline stage
whose weights line it is; `max_num_batched_tokens` is set where the run set it (it sizes
vLLM's profiling pass), empty for the default. Models come from the catalog, from
`benchmarks/data/model_configs/` (public config.json files) or from the published configs of
`tests/plan/data/unseen_configs/` (sources in its SOURCES.json).

For every row the planner's `plan.memory.memory_breakdown` predicts the same three figures
under vLLM's rules (vLLM >= 0.21 counts CUDA graphs against the budget; older versions do
not); the script prints the error of each and the median and worst absolute errors, and
writes JSON + a markdown table (default benchmarks/results/memory_accuracy.*).
No peer tool is run beside it: the log lines are the reference.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path
from typing import Any

from gpufleet.plan.layout import Layout
from gpufleet.plan.memory import GIB, memory_breakdown
from gpufleet.plan.weights import stage_weight_bytes
from gpufleet.specs import load_gpu, load_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import RESULTS, write_result

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT / "benchmarks" / "data" / "vllm_startups.csv"
TARGET_MEDIAN_PCT = 3.0
TARGET_WORST_PCT = 10.0


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:3] if p.isdigit())


def logged_number(text: str) -> float | None:
    return float(text) if text not in ("", None) else None


def startup_layout(row: dict[str, str], model_dtype: str) -> Layout:
    """The layout a logged startup ran (a startups CSV's tp, pp, dp, ep, quantization and
    kv_cache_dtype; pp and dp default to 1 where a table has no such column)."""
    return Layout(
        tp=int(row["tp"]),
        pp=int(row.get("pp") or 1),
        dp=int(row.get("dp") or 1),
        ep=int(row["ep"]),
        weight_dtype=row["quantization"] or model_dtype,
        kv_dtype="fp8" if row["kv_cache_dtype"] == "fp8" else "bf16",
    )


def add_errors(out: dict[str, Any], keys: tuple[str, ...]) -> None:
    """Each figure's signed error (%) against its logged value, where one was logged."""
    for key in keys:
        item = out[key]
        if item["logged"]:  # None (not in the log) or 0: no error to state
            item["error_pct"] = (item["predicted"] - item["logged"]) / abs(item["logged"]) * 100


def predict(row: dict[str, str]) -> dict[str, Any]:
    """The planner's figures for one logged startup, beside the logged ones."""
    model_ref = row["model"]
    model = load_model(str(ROOT / model_ref) if model_ref.endswith(".json") else model_ref)
    gpu = load_gpu(row["gpu"])
    layout = startup_layout(row, model.checkpoint_dtype)
    stage = int(row["pp_stage"] or 0)  # the stage whose "Model loading took" line it is
    version = _version(row["vllm_version"]) or (1,)  # empty: the current vLLM
    mem = memory_breakdown(
        model,
        gpu,
        layout,
        int(row["max_model_len"]),
        gpu_memory_utilization=float(row["gpu_memory_utilization"]),
        max_num_batched_tokens=int(row["max_num_batched_tokens"] or 0) or None,
        engine="vllm",
        engine_version=version,
    )
    out: dict[str, Any] = {
        "id": row["id"],
        "model": model.name,
        "layout": layout.label,
        "vllm_version": row["vllm_version"],
        "source": row["source"],
        "notes": row["notes"],
        "weights_gib": {"logged": logged_number(row["weights_gib"]),
                        "predicted": stage_weight_bytes(model, layout, stage, gpu, version) / GIB},
        "kv_gib": {"logged": logged_number(row["kv_gib"]), "predicted": mem.kv_cache_bytes / GIB},
        "kv_tokens": {"logged": logged_number(row["kv_tokens"]), "predicted": mem.kv_tokens_logged},
        "kv_tokens_effective": mem.kv_capacity_tokens,
    }  # fmt: skip
    add_errors(out, ("weights_gib", "kv_gib", "kv_tokens"))
    return out


def summarize(cases: list[dict[str, Any]], key: str) -> dict[str, Any]:
    errors = [abs(c[key]["error_pct"]) for c in cases if "error_pct" in c[key]]
    if not errors:
        return {"cases": 0}
    worst = max(cases, key=lambda c: abs(c[key].get("error_pct", 0.0)))
    return {
        "cases": len(errors),
        "median_abs_error_pct": round(statistics.median(errors), 2),
        "worst_abs_error_pct": round(max(errors), 2),
        "worst_case": worst["id"],
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "| case | model | layout | vLLM | weights GiB log / plan | err % "
        "| KV GiB log / plan | err % | KV tokens log / plan | err % |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def cell(item: dict[str, Any], fmt: str) -> tuple[str, str]:
        if item["logged"] is None:
            return f"– / {item['predicted']:{fmt}}", "–"
        err = f"{item['error_pct']:+.1f}" if "error_pct" in item else "–"
        return f"{item['logged']:{fmt}} / {item['predicted']:{fmt}}", err

    for c in report["cases"]:
        w, we = cell(c["weights_gib"], ".2f")
        k, ke = cell(c["kv_gib"], ".2f")
        t, te = cell(c["kv_tokens"], ",.0f")
        lines.append(
            f"| {c['id']} | {c['model']} | {c['layout']} | {c['vllm_version']} "
            f"| {w} | {we} | {k} | {ke} | {t} | {te} |"
        )
    s = report["summary"]
    lines += [
        "",
        "| figure | cases | median abs error % | worst abs error % (case) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for key in ("weights_gib", "kv_gib", "kv_tokens"):
        v = s[key]
        if v.get("cases"):
            lines.append(
                f"| {key} | {v['cases']} | {v['median_abs_error_pct']:.2f} "
                f"| {v['worst_abs_error_pct']:.2f} ({v['worst_case']}) |"
            )
    return "\n".join(lines)


def run(data: Path) -> dict[str, Any]:
    with data.open(newline="") as f:
        cases = [predict(row) for row in csv.DictReader(f)]
    summary = {key: summarize(cases, key) for key in ("weights_gib", "kv_gib", "kv_tokens")}
    return {
        "data": str(data),
        "targets": {"median_abs_error_pct": TARGET_MEDIAN_PCT, "worst_abs_error_pct": TARGET_WORST_PCT},
        "summary": summary,
        "cases": cases,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument(
        "--json", type=Path, default=RESULTS / "memory_accuracy.json",
        help="where to write the JSON (the markdown table goes beside it)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    report = run(args.data)
    table = markdown(report)
    print(table)
    json_path, md_path = write_result(args.json.with_suffix(""), report, table,
                                      note=f"data: {args.data.name}")  # fmt: skip
    print(f"\nwrote {json_path} and {md_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
