"""The first-token cost in the engine's iterations (issue 14, wave 16).

    python benchmarks/plan_first_token.py [CSV] [--out PATH] [--no-refits]

1. Per campaign (engine x version x checkpoint x GPU): measured TTFT less the model's GPU
   part (TTFT with every first-token constant at 0: own prefill, queue, the running
   iteration's rest and those already formed), as a time and in the row's predicted decode
   iterations; medians over its rows at <= 32 clients and above.
2. In-sample refits from the shipped constants (`validation.fit.fit`, 3 rounds and on
   until converged, one start) of three forms of the first-token cost: the engine's
   constant alone (`first_token_iterations` held at 0: the model before wave 16), the
   constant plus the closed loop's phase (held at 0.5 iteration), the constant plus a
   fitted count. Training objective, in-sample TTFT / TPOT median APE, constants at a bound.
3. SGLang Llama-3.1-8B (dense, 46 rows) with the measured TPOT given (an oracle the model
   does not have): TTFT as prefill + k measured iterations, or as Little's law under a
   front-end ceiling of F streamed tokens/s, whichever is longer; the best F and k on a
   grid, scored on the rows they are chosen on (an upper bound for the ceiling's form).

Writes benchmarks/results/plan_first_token.{json,md}.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpufleet.perf.calibration import BACKEND_CONSTANTS, Calibration, default_calibration
from gpufleet.validation import fit
from gpufleet.validation.fit_space import FitSpace, pinned_constants, replace_constant
from gpufleet.validation.measured import MeasuredRow, default_csv, predict_rows, read_rows

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import RESULTS, write_result

ENGINES = ("default", "sglang", "trtllm", "vllm")
KNOB = "first_token_iterations"
# (name, iterations every engine starts at, whether the fit moves them)
FORMS = (("constant only", 0.0, False), ("constant + 0.5 (phase)", 0.5, False),
         ("constant + fitted iterations", 0.5, True))  # fmt: skip


def with_iterations(cal: Calibration, k: float) -> Calibration:
    for engine in ENGINES:
        cal = replace_constant(cal, KNOB, k, engine)
    return cal


def zeroed(cal: Calibration) -> Calibration:
    """Every first-token constant at 0: the prediction is the GPU part."""
    backends = {
        k: dataclasses.replace(v, ttft_overhead_s=0.0, first_token_iterations=0.0)
        for k, v in cal.backends.items()
    }
    return dataclasses.replace(cal, moe_first_token_s=0.0, backends=backends)


def campaign(row: MeasuredRow) -> str:
    return f"{row.backend} {row.model_path.split('/')[-1]} {row.system}"


def gaps(rows: Sequence[MeasuredRow], cal: Calibration) -> list[dict[str, Any]]:
    preds, _ = predict_rows(rows, zeroed(cal))
    groups: dict[str, list[tuple[int, float, float]]] = {}
    for p in preds:
        gap_s = p.row.ttft_s - p.ttft_s
        groups.setdefault(campaign(p.row), []).append(
            (p.row.batch_size, gap_s, gap_s / p.tpot_s if p.tpot_s else 0.0)
        )
    out = []
    for name, pts in sorted(groups.items()):
        low = [g for g in pts if g[0] <= 32]
        high = [g for g in pts if g[0] > 32]
        out.append({
            "campaign": name, "rows": len(pts), "rows_low": len(low),
            "gap_ms_low": 1e3 * statistics.median(g[1] for g in low) if low else None,
            "iters_low": statistics.median(g[2] for g in low) if low else None,
            "gap_ms_high": 1e3 * statistics.median(g[1] for g in high) if high else None,
            "iters_high": statistics.median(g[2] for g in high) if high else None,
        })  # fmt: skip
    return out


def engine_constants(cal: Calibration, backend: str) -> dict[str, float]:
    b = cal.backend(backend)
    return {"ttft_overhead_s": b.ttft_overhead_s, KNOB: b.first_token_iterations}


def scores(rows: Sequence[MeasuredRow], cal: Calibration) -> dict[str, Any]:
    preds, _ = predict_rows(rows, cal)
    return {
        "objective": fit.objective(cal, rows),
        "ttft": statistics.median(p.ttft_ape_pct for p in preds),
        "tpot": statistics.median(p.tpot_ape_pct for p in preds),
        "rows_over_12": sum(p.ttft_ape_pct > 12 for p in preds),
        "pinned": pinned_constants(cal),
        "engines": {b: engine_constants(cal, b) for b in ("sglang", "trtllm", "vllm")},
        "moe_first_token_s": cal.moe_first_token_s,
    }


def form_space(fitted: bool) -> FitSpace:
    """The fit's space for a form: the first-token iterations held (at the start's value)
    or fitted by the knob list alone (the shipped fit freezes them at their prior)."""
    knobs = BACKEND_CONSTANTS if fitted else tuple(c for c in BACKEND_CONSTANTS if c != KNOB)
    return FitSpace(backend_constants=knobs, frozen_backend_constants=())


def refits(rows: Sequence[MeasuredRow], cal: Calibration) -> list[dict[str, Any]]:
    out = []
    for name, k, fitted in FORMS:
        start = with_iterations(cal, k)
        space = form_space(fitted)
        got = fit.fit(rows, start, rounds=3, restarts=False, converge=True, space=space)
        out.append({"form": name, "start": scores(rows, start), "refit": scores(rows, got)})
    return out


def frontend_oracle(rows: Sequence[MeasuredRow], cal: Calibration) -> dict[str, Any]:
    """SGLang dense rows, measured TPOT given: max(prefill + k x TPOT, Little's law at F)."""
    preds, _ = predict_rows([r for r in rows if r.backend == "sglang"], zeroed(cal))
    dense = [p for p in preds if "llama" in p.row.model_path.lower()]

    def ttft(p: Any, f: float, k: float) -> float:
        r = p.row
        capped = r.batch_size * r.osl / f - (r.osl - 1) * r.tpot_s
        return max(p.serving.prefill_s + k * r.tpot_s, capped)

    def ape(ps: Sequence[Any], f: float, k: float) -> float:
        return statistics.median(abs(ttft(p, f, k) / p.row.ttft_s - 1) * 100 for p in ps)

    if not dense:
        return {"rows": 0}
    grid = [(f, k) for f in range(12000, 26001, 500) for k in (i * 0.5 for i in range(41))]
    best = min(grid, key=lambda fk: ape(dense, *fk))
    high = [p for p in dense if p.row.batch_size >= 240]
    uncapped = min((i * 0.5 for i in range(41)), key=lambda k: ape(dense, 1e12, k))
    return {
        "rows": len(dense), "rows_high": len(high), "best_f": best[0], "best_k": best[1],
        "ape": ape(dense, *best), "ape_high": ape(high, *best) if high else None,
        "uncapped_k": uncapped, "uncapped_ape": ape(dense, 1e12, uncapped),
    }  # fmt: skip


def render(gap_rows: list[dict[str, Any]], forms: list[dict[str, Any]], fe: dict[str, Any]) -> str:
    def f(x: float | None, spec: str) -> str:
        return "" if x is None else format(x, spec)

    lines = [
        "Measured TTFT less the model's GPU part, median ms and decode iterations:",
        "",
        "| campaign | rows | rows <= 32 clients | ms (<= 32) | iterations (<= 32) | ms (> 32) | iterations (> 32) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]  # fmt: skip
    for g in gap_rows:
        lines.append(
            f"| {g['campaign']} | {g['rows']} | {g['rows_low']} | {f(g['gap_ms_low'], '.0f')} "
            f"| {f(g['iters_low'], '.1f')} | {f(g['gap_ms_high'], '.0f')} | {f(g['iters_high'], '.1f')} |"
        )
    if forms:
        lines += [
            "",
            "In-sample refits from the shipped constants (3 rounds, then until converged):",
            "",
            "| form | objective | TTFT % | TPOT % | rows > 12 % | sglang / trtllm / vllm (s + iterations) | moe_first_token_s | at a bound |",
            "| --- | ---: | ---: | ---: | ---: | --- | ---: | --- |",
        ]  # fmt: skip
        for form in forms:
            for tag in ("start", "refit"):
                s = form[tag]
                eng = " / ".join(
                    f"{v['ttft_overhead_s']:.3f} + {v[KNOB]:.2f}" for v in s["engines"].values()
                )
                lines.append(
                    f"| {form['form']} ({tag}) | {s['objective']:.4f} | {s['ttft']:.2f} | {s['tpot']:.2f} "
                    f"| {s['rows_over_12']} | {eng} | {s['moe_first_token_s']:.4f} | {', '.join(s['pinned'])} |"
                )  # fmt: skip
    if fe.get("rows"):
        lines += [
            "",
            f"SGLang Llama-8B ({fe['rows']} rows), measured TPOT given: prefill + "
            f"{fe['best_k']:g} iterations under a {fe['best_f']} tokens/s ceiling: TTFT median APE "
            f"{fe['ape']:.1f} % ({f(fe['ape_high'], '.1f')} % on the {fe['rows_high']} rows of >= 240 "
            f"clients); without a ceiling, best {fe['uncapped_k']:g} iterations: {fe['uncapped_ape']:.1f} %.",
        ]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("csv", nargs="?", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS / "plan_first_token")
    parser.add_argument("--no-refits", action="store_true", help="skip the in-sample refits")
    args = parser.parse_args(argv)
    rows = read_rows(args.csv or default_csv())
    cal = default_calibration()
    gap_rows = gaps(rows, cal)
    forms = [] if args.no_refits else refits(rows, cal)
    fe = frontend_oracle(rows, cal)
    table = f"{len(rows)} rows.\n\n" + render(gap_rows, forms, fe)
    print(table)
    data = {"rows": len(rows), "gaps": gap_rows, "forms": forms, "frontend_oracle": fe}
    json_path, md_path = write_result(args.out, data, table)
    print(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
