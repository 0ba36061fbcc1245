"""Refit the step-time model's constants on measured serving rows.

`python -m gpufleet.validation.fit [CSV]` (default: the measured-serving CSV found by
`gpufleet.validation.measured.default_csv()`) runs a coordinate search minimising the
median absolute log-errors of TTFT and TPOT, each scaled by its accuracy target, and
writes `gpufleet/perf/data/calibration.yaml`.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from gpufleet.errors import UserError
from gpufleet.perf.calibration import (
    BACKEND_CONSTANTS,
    BOUNDS,
    SCALAR_CONSTANTS,
    Calibration,
    calibration_to_dict,
    default_calibration,
    prior_calibration,
)
from gpufleet.validation.measured import default_csv, predict_row, read_rows


def _errors(cal: Calibration, row: Any, recipes: bool = False) -> tuple[float, float] | None:
    pred = predict_row(row, cal, recipes=recipes)
    if pred is None:
        return None
    return abs(math.log(pred.ttft_s / row.ttft_s)), abs(math.log(pred.tpot_s / row.tpot_s))


def _combine(errors: Sequence[tuple[float, float] | None]) -> float:
    """The acceptance metrics themselves: median |log(predicted / measured)| of TTFT and of
    TPOT, each scaled by its target (20% and 10%), summed. Medians keep the fit robust to
    the few rows no engine-level model explains."""
    got = [e for e in errors if e is not None]
    if not got:
        return math.inf
    return statistics.median(e[0] for e in got) / 0.2 + statistics.median(e[1] for e in got) / 0.1


def objective(cal: Calibration, rows: Sequence[Any], *, recipes: bool = False) -> float:
    """What `fit` minimises, for `cal` on `rows` (lower is better)."""
    return _combine([_errors(cal, r, recipes) for r in rows])


def _replace(cal: Calibration, key: str, value: float, backend: str | None) -> Calibration:
    changes: dict[str, Any] = {key: value}
    if backend is None:
        return dataclasses.replace(cal, **changes)
    backends = dict(cal.backends)
    backends[backend] = dataclasses.replace(cal.backend(backend), **changes)
    return dataclasses.replace(cal, backends=MappingProxyType(backends))


def _inside_bounds(cal: Calibration) -> Calibration:
    """Start from constants moved inside their bounds (a calibration written under older,
    wider bounds would otherwise stay outside: the search never steps back in past a
    worse score)."""
    for key in SCALAR_CONSTANTS:
        lo, hi = BOUNDS[key]
        cal = _replace(cal, key, min(hi, max(lo, float(getattr(cal, key)))), None)
    for name, b in cal.backends.items():
        for key in BACKEND_CONSTANTS:
            lo, hi = BOUNDS[key]
            cal = _replace(cal, key, min(hi, max(lo, float(getattr(b, key)))), name)
    return cal


# The shared constants the fit tunes: only those with no single measured figure
# (attention kernels reach 0.1-0.65 of peak depending on shape; how skewed real routers
# are). The others have a measured source and stay at their prior
# (`perf.calibration.prior_calibration`: GEMM and copy efficiency from the H200 kernel
# measurements, the one-shot all-reduce latency, the per-kernel fixed time), scaled to
# other GPUs by the GPU's own peak figures: fitted to these rows' two GPUs they absorb
# what other terms miss and stop carrying over (leave-one-model-out TPOT 15.6 -> 12.8 %
# when frozen, benchmarks/results/plan_accuracy.md). MoE models' first-token time has no
# documented source either, so it is fitted (from 0, its prior).
FITTED_SCALARS: tuple[str, ...] = ("attention_efficiency", "routing_skew", "moe_first_token_s")


def _at_prior_where_frozen(cal: Calibration) -> Calibration:
    """The shared constants the fit does not tune, at their prior (physical) values."""
    prior = prior_calibration()
    for key in SCALAR_CONSTANTS:
        if key not in FITTED_SCALARS:
            cal = _replace(cal, key, float(getattr(prior, key)), None)
    return cal


# One sweep of shrinking multiplicative steps; rounds past three repeat it, so a start far
# from the optimum (a prior) gets more passes with large steps after the small ones.
SWEEP: tuple[float, ...] = (1.5, 1.2, 1.07)


def _steps(rounds: int) -> list[float]:
    return [SWEEP[i % len(SWEEP)] for i in range(rounds)]


def fit(
    rows: Sequence[Any], start: Calibration, rounds: int = 3, *, recipes: bool = False
) -> Calibration:
    """Coordinate search: each constant in turn, multiplicative steps that shrink, never
    past its physical bounds (`perf.calibration.BOUNDS`). A backend's own constants only
    move its rows' predictions, so only those are recomputed when one changes. recipes:
    predict the rows as their launch recipes ran them (`validation.recipes`)."""
    cal = _at_prior_where_frozen(_inside_bounds(start))
    errors = [_errors(cal, r, recipes) for r in rows]
    best = _combine(errors)
    # Each engine's own constants first, then the shared ones: from a far start (a prior),
    # shared efficiencies moved first absorb engine-specific offsets (they ran to their
    # bounds) and a coordinate search cannot walk them back.
    knobs: list[tuple[str, str | None]] = []
    backends = sorted({r.backend for r in rows} & set(cal.backends))
    for b in backends:
        knobs += [(k, b) for k in BACKEND_CONSTANTS]
    knobs += [(k, None) for k in FITTED_SCALARS]
    by_backend = {b: [i for i, r in enumerate(rows) if r.backend == b] for b in backends}
    for step in _steps(rounds):
        for key, backend in knobs:
            idx = range(len(rows)) if backend is None else by_backend[backend]
            improved = True
            while improved:
                improved = False
                owner: Any = cal if backend is None else cal.backend(backend)
                current = float(getattr(owner, key))
                lo, hi = BOUNDS[key]
                seed = current if current > 0 else hi * 0.05
                for raw in (seed * step, seed / step):
                    cand = min(hi, max(lo, raw))
                    if cand == current:
                        continue
                    trial = _replace(cal, key, cand, backend)
                    trial_errors = list(errors)
                    for i in idx:
                        trial_errors[i] = _errors(trial, rows[i], recipes)
                    s = _combine(trial_errors)
                    if s < best - 1e-6:
                        cal, best, errors, improved = trial, s, trial_errors, True
                        break
    return cal


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Refit the step-time model's constants.")
    parser.add_argument(
        "csv", nargs="?", type=Path, default=None, help="default: $GPUFLEET_SHARED/validation/"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).parents[1] / "perf" / "data" / "calibration.yaml",
        help="where to write the constants (default: the shipped calibration.yaml)",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="coordinate-search rounds (past 3 the sweep repeats)"
    )
    parser.add_argument(
        "--from-prior",
        action="store_true",
        help="start from perf.calibration.prior_calibration() instead of the shipped constants",
    )
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        args.csv = args.csv or default_csv()
        rows = read_rows(args.csv)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cal = fit(
        rows, prior_calibration() if args.from_prior else default_calibration(), rounds=args.rounds
    )
    header = (
        "# Fitted by `python -m gpufleet.validation.fit` on "
        f"{args.csv.name} ({len(rows)} rows). Few, physical constants: see calibration.py.\n"
    )
    args.out.write_text(header + yaml.safe_dump(calibration_to_dict(cal), sort_keys=False))
    print(f"wrote {args.out}: score {objective(cal, rows):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
