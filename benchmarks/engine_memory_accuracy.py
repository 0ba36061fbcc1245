"""Memory predictions against real SGLang and TensorRT-LLM startups (issue 14).

    python benchmarks/engine_memory_accuracy.py [--json FILE]

The sibling of `memory_accuracy.py` (vLLM) for the two other engines the planner accounts
memory for. Each row of `benchmarks/data/sglang_startups.csv` is one real SGLang startup
taken from a public log (the `source` column): the model, GPU, TP / DP / EP, runtime
quantization, --mem-fraction-static (stated, or the default of that version: see
`mem_fraction_source`) and what SGLang logged — the free memory before and after loading
("Load weight begin / end. avail mem=X GB"; SGLang's GB are GiB), the weights ("mem usage=Y
GB", printed from early 2025 on), the KV pool ("KV Cache is allocated. ... K size: X GB, V
size: Y GB", K + V) and its tokens ("#tokens: N" / max_total_num_tokens). Each row of
`benchmarks/data/trtllm_startups.csv` is one TensorRT-LLM (PyTorch backend) startup: its
free_gpu_memory_fraction, max_num_tokens, the weights its loader reports and
"[MemUsageChange] Allocated X GiB for max tokens in paged KV cache (N)".

A field the log does not print is left empty and not scored. For every row the planner's
`plan.memory.memory_breakdown` (engine sglang / trtllm, the row's memory fraction) predicts
the same figures; the script prints each error with the median and worst absolute error per
engine, and writes JSON + a markdown table (default benchmarks/results/engine_memory_accuracy.*).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import Any

from gpufleet.plan.memory import GIB, memory_breakdown, sglang_free_before_load_bytes
from gpufleet.plan.weights import stage_weight_bytes
from gpufleet.specs import load_gpu, load_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_accuracy import add_errors, logged_number, startup_layout, summarize
from record import RESULTS, write_result

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"
ENGINES = {"sglang": DATA / "sglang_startups.csv", "trtllm": DATA / "trtllm_startups.csv"}
FIGURES = {
    "sglang": ("avail_before_load_gib", "weights_gib", "kv_gib", "kv_tokens"),
    "trtllm": ("weights_gib", "kv_gib", "kv_tokens"),
}


def predict(engine: str, row: dict[str, str]) -> dict[str, Any]:
    """The planner's figures for one logged startup, beside the logged ones."""
    ref = row["model"]
    model = load_model(str(ROOT / ref) if ref.endswith(".json") else ref)
    gpu = load_gpu(row["gpu"])
    layout = startup_layout(row, model.checkpoint_dtype)
    if engine == "sglang":
        fraction = float(row["mem_fraction_static"])
        batched = None
        version = row["sglang_version"]
    else:
        fraction = float(row["free_gpu_memory_fraction"])
        batched = int(row["max_num_tokens"] or 0) or None
        version = row["trtllm_version"]
    mem = memory_breakdown(
        model, gpu, layout, int(row.get("context_len") or 8192),
        gpu_memory_utilization=fraction, max_num_batched_tokens=batched, engine=engine,
    )  # fmt: skip
    weights = stage_weight_bytes(model, layout, 0, gpu)
    logged_weights = logged_number(row["weights_gib"])
    if engine == "sglang" and logged_weights is None:
        before = logged_number(row["avail_before_load_gib"])
        after = logged_number(row["avail_after_load_gib"])
        if before is not None and after is not None:
            logged_weights = round(before - after, 2)  # what 'mem usage' would have printed
    out: dict[str, Any] = {
        "id": row["id"],
        "engine": engine,
        "model": model.name,
        "layout": layout.label,
        "fraction": fraction,
        "version": version,
        "source": row["source"],
        "weights_gib": {"logged": logged_weights, "predicted": weights / GIB},
        "kv_gib": {"logged": logged_number(row["kv_gib"]), "predicted": mem.kv_cache_bytes / GIB},
        "kv_tokens": {"logged": logged_number(row["kv_tokens"]), "predicted": mem.kv_tokens_logged},
    }
    if engine == "sglang":
        out["avail_before_load_gib"] = {
            "logged": logged_number(row["avail_before_load_gib"]),
            "predicted": sglang_free_before_load_bytes(layout, gpu) / GIB,
        }
    add_errors(out, FIGURES[engine])
    return out


def _cell(item: dict[str, Any], fmt: str) -> tuple[str, str]:
    if item["logged"] is None:
        return f"– / {item['predicted']:{fmt}}", "–"
    err = f"{item['error_pct']:+.1f}" if "error_pct" in item else "–"
    return f"{item['logged']:{fmt}} / {item['predicted']:{fmt}}", err


def markdown(report: dict[str, Any]) -> str:
    lines: list[str] = []
    for engine, part in report["engines"].items():
        keys = FIGURES[engine]
        head = " | ".join(f"{k} log / plan | err %" for k in keys)
        lines += [
            f"### {engine}",
            "",
            f"| case | model | layout | fraction | version | {head} |",
            "| --- | --- | --- | ---: | --- |" + " ---: | ---: |" * len(keys),
        ]
        for c in part["cases"]:
            cells = []
            for key in keys:
                fmt = ",.0f" if key == "kv_tokens" else ".2f"
                value, err = _cell(c[key], fmt)
                cells += [value, err]
            lines.append(
                f"| {c['id']} | {c['model']} | {c['layout']} | {c['fraction']:.3f} "
                f"| {c['version']} | " + " | ".join(cells) + " |"
            )
        lines += [
            "",
            "| figure | cases | median abs error % | worst abs error % (case) |",
            "| --- | ---: | ---: | ---: |",
        ]
        for key in keys:
            v = part["summary"][key]
            if v.get("cases"):
                lines.append(
                    f"| {key} | {v['cases']} | {v['median_abs_error_pct']:.2f} "
                    f"| {v['worst_abs_error_pct']:.2f} ({v['worst_case']}) |"
                )
        lines.append("")
    return "\n".join(lines)


def run(paths: dict[str, Path] = ENGINES) -> dict[str, Any]:
    engines: dict[str, Any] = {}
    for engine, path in paths.items():
        with path.open(newline="") as f:
            cases = [predict(engine, row) for row in csv.DictReader(f)]
        summary = {key: summarize(cases, key) for key in FIGURES[engine]}
        engines[engine] = {"data": str(path), "summary": summary, "cases": cases}
    return {"engines": engines}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--json", type=Path, default=RESULTS / "engine_memory_accuracy.json",
        help="where to write the JSON (the markdown table goes beside it)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    report = run()
    table = markdown(report)
    print(table)
    json_path, md_path = write_result(
        args.json.with_suffix(""),
        report,
        table,
        note="data: sglang_startups.csv, trtllm_startups.csv",
    )
    print(f"\nwrote {json_path} and {md_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
