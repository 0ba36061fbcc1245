"""Which fitted constants the held-out refits disagree on (issue 14's held-out accuracy).

    python benchmarks/plan_fit_constants.py [JSON] [--out PATH]

Reads a `plan_accuracy.py` report (default benchmarks/results/plan_accuracy.json), whose
refits list every start's fitted constants (`plan_refits`), and prints per constant, in
fractions of its log range inside `BOUNDS` (the search's own coordinates): how far the kept
start's value moves between folds, and how far the starts of one fold end apart on
average (also written to benchmarks/results/plan_fit_constants.{json,md}, or --out). A
constant the training rows pin sits at about the same place in every fold and from every
start; one that moves between starts at a similar training objective is not pinned, and
where it lands decides the held-out fold's figure.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from gpufleet.perf.calibration import BOUNDS

RESULTS = Path(__file__).resolve().parent / "results"
SECTIONS = ("leave_one_model_out", "leave_one_gpu_out")


def log_position(key: str, value: float) -> float:
    """Where `value` sits between the constant's bounds in log coordinates (0 low, 1 high;
    the fit's offset where the low bound is 0, `validation.fit_space.log_offset`)."""
    lo, hi = BOUNDS[key]
    off = 0.0 if lo > 0 else hi * 0.01
    return (math.log(value + off) - math.log(lo + off)) / (math.log(hi + off) - math.log(lo + off))


def _flat(constants: dict[str, Any]) -> dict[str, float]:
    out = {k: float(v) for k, v in constants.items() if k != "backends"}
    for name, values in constants.get("backends", {}).items():
        if name != "default":  # no row is served by it: never fitted
            out |= {f"{name}.{k}": float(v) for k, v in values.items()}
    return out


def disagreement(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Per constant that moves: its kept positions per fold, their range across folds and
    the mean range across a fold's starts; most disagreed first."""
    kept: dict[str, list[float]] = {}
    within: dict[str, list[float]] = {}
    for section in SECTIONS:
        for group in report.get(section, {}).get("per_group", {}).values():
            per_start = {
                label: _flat(s["constants"])
                for label, s in group.get("starts", {}).items()
                if "constants" in s
            }
            if not per_start:
                continue
            for name in per_start[group["start"]]:
                xs = [log_position(name.rsplit(".", 1)[-1], c[name]) for c in per_start.values()]
                within.setdefault(name, []).append(max(xs) - min(xs))
                value = per_start[group["start"]][name]
                kept.setdefault(name, []).append(log_position(name.rsplit(".", 1)[-1], value))
    rows = [
        {
            "constant": name,
            "across_folds": round(max(xs) - min(xs), 3),
            "within_folds": round(statistics.fmean(within[name]), 3),
            "kept_positions": [round(x, 3) for x in xs],
        }
        for name, xs in kept.items()
    ]
    moving = [r for r in rows if r["across_folds"] >= 0.01 or r["within_folds"] >= 0.01]
    return sorted(moving, key=lambda r: (-r["across_folds"], -r["within_folds"]))


def markdown(rows: list[dict[str, Any]]) -> str:
    out = [
        "| constant | across folds (kept start) | within a fold (starts, mean) "
        "| kept position per fold |",
        "| --- | ---: | ---: | --- |",
    ]
    for r in rows:
        kept = " ".join(f"{x:.2f}" for x in r["kept_positions"])
        out.append(
            f"| {r['constant']} | {r['across_folds']:.2f} | {r['within_folds']:.2f} | {kept} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("json", nargs="?", type=Path, default=RESULTS / "plan_accuracy.json")
    parser.add_argument(
        "--out", type=Path, default=RESULTS / "plan_fit_constants", help="path without suffix"
    )
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    rows = disagreement(json.loads(args.json.read_text()))
    if not rows:
        print(f"{args.json}: no refit lists its starts' constants (rerun plan_accuracy.py)")
        return 1
    table = markdown(rows)
    print(table)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from record import write_result  # asks git for the commit: only when run

    write_result(args.out, {"source": str(args.json), "constants": rows}, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
