"""Which measured rows the labelled work cannot reach (issue 14, wave 14).

    python benchmarks/plan_row_feasibility.py [CSV] [--out PATH]

For every row: the share of its GPUs' time its measured request rate needs for the
prompts alone at the best H200 kernel rates (`validation.feasibility`: no overheads, no
decode, the TP all-reduces on the measured curve), the same without the all-reduces, and
the shipped model's TTFT / TPOT error. Prints the largest share per campaign (backend,
model, GPU) and every row above 1 (impossible as labelled; still modelled and scored).
Writes benchmarks/results/plan_row_feasibility.{json,md}.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpufleet.perf.step_batch import StepBatch
from gpufleet.plan.perf_serving import layout_step_model
from gpufleet.specs.gpus import load_gpu
from gpufleet.validation.feasibility import BEST_RATES, measured_requests_per_s
from gpufleet.validation.measured import (
    MeasuredRow,
    default_csv,
    model_row,
    read_rows,
    resolve_model,
    row_layout,
    row_scheme,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import RESULTS, write_result


def row_bound(row: MeasuredRow) -> dict[str, Any]:
    """The row's busy fractions (with and without all-reduces) and the model's errors."""
    model = resolve_model(row.model_path)
    gpu = load_gpu(row.system)
    how = row_layout(row, model, gpu)
    step = layout_step_model(
        model, gpu, how.layout, backend=row.backend, calibration=BEST_RATES,
        scheme=row_scheme(row),
    )  # fmt: skip
    parts = step.breakdown_s(StepBatch(prefill_tokens=(row.isl,), prefill_context_tokens=(0,)))
    rate = measured_requests_per_s(row, how.clients_per_rank)
    pred = model_row(row)
    return {
        "id": row.id,
        "campaign": f"{row.backend} {row.model_path.split('/')[-1]} {row.system}",
        "label": f"{row.isl}x{row.osl} c{row.batch_size} tp{row.tp}",
        "busy": rate * parts["total_s"],
        "busy_no_allreduce": rate * (parts["total_s"] - parts["allreduce_s"]),
        "prompt_tokens_per_s_per_gpu": rate * row.isl / how.layout.tp,
        "ttft_ape": pred.ttft_ape_pct,
        "tpot_ape": pred.tpot_ape_pct,
    }


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    worst: dict[str, dict[str, Any]] = {}
    counts: dict[str, int] = defaultdict(int)
    for r in rows:
        counts[r["campaign"]] += int(r["busy"] > 1.0)
        if r["campaign"] not in worst or r["busy"] > worst[r["campaign"]]["busy"]:
            worst[r["campaign"]] = r
    lines = [
        "| campaign | largest busy share | its row | rows above 1 |",
        "| --- | ---: | --- | ---: |",
    ]
    for name, r in sorted(worst.items(), key=lambda kv: -kv[1]["busy"]):
        lines.append(f"| {name} | {r['busy']:.2f} | {r['label']} | {counts[name]} |")
    lines += [
        "",
        "| row above 1 | busy | without all-reduce | prompt tok/s/GPU | TTFT APE % | TPOT APE % |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in sorted(rows, key=lambda r: -r["busy"]):
        if r["busy"] > 1.0:
            lines.append(
                f"| {r['campaign']} {r['label']} | {r['busy']:.2f} | "
                f"{r['busy_no_allreduce']:.2f} | {r['prompt_tokens_per_s_per_gpu']:.0f} | "
                f"{r['ttft_ape']:.1f} | {r['tpot_ape']:.1f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="?", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS / "plan_row_feasibility")
    args = parser.parse_args(argv)
    csv_path = args.csv or default_csv()
    rows = [row_bound(r) for r in read_rows(csv_path)]
    table = markdown(rows)
    print(table)
    write_result(args.out, {"rows": rows}, table, note=f"CSV: {csv_path.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
