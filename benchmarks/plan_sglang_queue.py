"""Does SGLang's scheduling of new prompts explain its Llama-3.1-8B TTFTs? (issue 14, wave 17)

    python benchmarks/plan_sglang_queue.py [CSV] [--out PATH] [--case JITTER:SPREAD[:spread] ...]

On the shared CSV's SGLang Llama-3.1-8B rows (0.5.6.post2, H200, 46 rows), beside the
shipped model's error:

1. The rows: request rate X = clients / (TTFT + (osl - 1) x TPOT), clients waiting for a
   first token (X x TTFT), output tokens/s, TTFT in measured decode iterations.
2. SGLang's caps on the running requests: its request pool (max_running_requests' default,
   `plan.engines.sglang_max_running_requests`) and its KV admission (prompt + output so far
   + new_token_ratio at its floor x the clipped rest, `EngineRules.admission_tokens`), with
   the KV cache as the rows are read: rows whose clients exceed the cap.
3. The rules with the measured TPOT given (an oracle the model lacks): no cap binds, so a
   prompt waits the running iteration's rest, the one already formed, the closed loop's
   phase and its own prefill, plus the front-end constant.
4. The rules played out (`validation.sglang_loop`: prefill first, batches up to the chunk,
   decodes paused while prompts wait) on the row's step model, each client sending
   `benchmark_requests_per_client` prompts, arrivals spread by a uniform jitter of up to
   JITTER seconds, output lengths uniform within +-SPREAD of the row's; with ":spread" the
   clients start evenly spread over one decode phase and their first prompts are left out
   (a steady state that starts out of step).

Writes benchmarks/results/plan_sglang_queue.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpufleet.perf.calibration import default_calibration
from gpufleet.validation.measured import (
    MeasuredRow,
    _kv_limited_running,
    default_csv,
    model_row,
    read_rows,
    resolve_model,
    row_layout,
    row_scheme,
)
from gpufleet.validation.sglang_loop import simulate_sglang_loop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpufleet.plan.engines import engine_rules
from gpufleet.plan.perf_serving import layout_step_model
from gpufleet.specs.gpus import load_gpu
from record import RESULTS, write_result

HIGH_CLIENTS = 240  # wave 16's "high concurrency" rows
DEFAULT_CASES = ("0:0", "1:0", "0:0.02", "0:0.1", "0:0:spread")


def case_tag(jitter: float, spread: float, start_spread: bool) -> str:
    return f"{jitter:g}:{spread:g}" + (":spread" if start_spread else "")


def parse_case(text: str) -> tuple[float, float, bool]:
    jitter, spread, *rest = text.split(":")
    return float(jitter), float(spread), rest == ["spread"]


def sglang_llama8b(rows: Sequence[MeasuredRow]) -> list[MeasuredRow]:
    sel = [r for r in rows if r.backend == "sglang" and "Llama-3.1-8B" in r.model_path]
    return sorted(sel, key=lambda r: (r.tp, r.isl, r.osl, r.batch_size))


def ape(pred: float, meas: float) -> float:
    return abs(pred / meas - 1.0) * 100.0


def medians(per_row: list[dict[str, Any]], key: str) -> dict[str, float]:
    every = [r[key] for r in per_row]
    high = [r[key] for r in per_row if r["clients"] >= HIGH_CLIENTS]
    return {"all": round(statistics.median(every), 1), "high": round(statistics.median(high), 1)}


def analyse(
    rows: Sequence[MeasuredRow], cases: Sequence[tuple[float, float, bool]]
) -> dict[str, Any]:
    cal = default_calibration()
    b = cal.backend("sglang")
    per_row: list[dict[str, Any]] = []
    for r in rows:
        shipped = model_row(r, cal)
        model = resolve_model(r.model_path)
        gpu = load_gpu(r.system)
        layout = row_layout(r, model, gpu).layout
        rules = engine_rules("sglang", gpu, tp=layout.tp, pp=layout.pp, dp=layout.dp)
        cap = _kv_limited_running(model, gpu, layout, rules, r)
        rate = r.batch_size / (r.ttft_s + (r.osl - 1) * r.tpot_s)
        prefill_s = shipped.serving.prefill_s
        iterations = 0.5 + 1 + b.first_token_iterations  # rest, formed, phase
        oracle_s = b.ttft_overhead_s + iterations * r.tpot_s + prefill_s
        entry: dict[str, Any] = {
            "row": f"tp{r.tp} {r.isl}/{r.osl} c{r.batch_size}",
            "clients": r.batch_size,
            "ttft_ms": round(r.ttft_s * 1e3, 1),
            "tpot_ms": round(r.tpot_s * 1e3, 2),
            "waiting": round(rate * r.ttft_s, 1),
            "output_ktok_s": round(rate * r.osl / 1e3, 1),
            "ttft_iterations": round(r.ttft_s / r.tpot_s, 1),
            "running_cap": cap,
            "shipped_ttft_ape": ape(shipped.ttft_s, r.ttft_s),
            "shipped_tpot_ape": ape(shipped.tpot_s, r.tpot_s),
            "oracle_ttft_ape": ape(oracle_s, r.ttft_s),
        }
        step = layout_step_model(
            model, gpu, layout, backend="sglang", calibration=cal, scheme=row_scheme(r),
            rules=rules,
        )  # fmt: skip
        for jitter, spread, start_spread in cases:
            sim = simulate_sglang_loop(
                step, r.isl, r.osl, r.batch_size,
                chunk_tokens=rules.max_num_batched_tokens, max_running=cap,
                requests_per_client=max(1, round(b.benchmark_requests_per_client)),
                jitter_s=jitter, output_spread=spread, start_spread=start_spread,
            )  # fmt: skip
            tag = case_tag(jitter, spread, start_spread)
            entry[f"loop_ttft_ape_{tag}"] = ape(b.ttft_overhead_s + sim.ttft_s, r.ttft_s)
            entry[f"loop_tpot_ape_{tag}"] = ape(sim.tpot_s, r.tpot_s)
        per_row.append(entry)
    forms: dict[str, dict[str, float]] = {
        "shipped model TTFT": medians(per_row, "shipped_ttft_ape"),
        "shipped model TPOT": medians(per_row, "shipped_tpot_ape"),
        "rules + measured TPOT, TTFT": medians(per_row, "oracle_ttft_ape"),
    }
    for jitter, spread, start_spread in cases:
        tag = case_tag(jitter, spread, start_spread)
        name = f"loop played out, jitter {jitter:g} s, lengths +-{spread:g}"
        if start_spread:
            name += ", clients started spread"
        forms[f"{name}, TTFT"] = medians(per_row, f"loop_ttft_ape_{tag}")
        forms[f"{name}, TPOT"] = medians(per_row, f"loop_tpot_ape_{tag}")
    capped = [e["row"] for e in per_row if e["running_cap"] < e["clients"]]
    return {"rows": per_row, "forms": forms, "rows_capped": capped}


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "SGLang Llama-3.1-8B (0.5.6.post2, H200): median APE % over all rows and over "
        f"the rows of >= {HIGH_CLIENTS} clients",
        "",
        "| form | all | >= 240 clients |",
        "| --- | ---: | ---: |",
    ]
    for name, m in data["forms"].items():
        lines.append(f"| {name} | {m['all']:.1f} | {m['high']:.1f} |")
    lines += [
        "",
        f"Rows whose clients exceed SGLang's running cap: {len(data['rows_capped'])} "
        f"({', '.join(data['rows_capped']) or 'none'})",
        "",
        "| row | TTFT ms | TPOT ms | waiting | out ktok/s | TTFT / TPOT | running cap |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for e in data["rows"]:
        lines.append(
            f"| {e['row']} | {e['ttft_ms']:.0f} | {e['tpot_ms']:.1f} | {e['waiting']:.1f} | "
            f"{e['output_ktok_s']:.1f} | {e['ttft_iterations']:.1f} | {e['running_cap']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("csv", nargs="?", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS / "plan_sglang_queue")
    parser.add_argument(
        "--case", action="append", default=None, metavar="JITTER:SPREAD",
        help="arrival jitter (s) and output-length spread (fraction) of one played-out run "
        "(repeatable; default 0:0, 1:0, 0:0.02, 0:0.1)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    cases = [parse_case(c) for c in args.case or DEFAULT_CASES]
    rows = sglang_llama8b(read_rows(args.csv or default_csv()))
    data = analyse(rows, cases)
    table = markdown(data)
    print(table)
    json_path, md_path = write_result(args.out, data, table, note="SGLang Llama-3.1-8B rows")
    print(f"wrote {json_path} and {md_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
