"""Refit the step-time model's constants on measured serving rows.

`python -m gpufleet.validation.fit [CSV]` (default: the measured-serving CSV found by
`gpufleet.validation.measured.default_csv()`) runs a log-space coordinate search (from
the start and from the middle of the bounds, see `fit`) minimising the median absolute
log-errors of TTFT and TPOT, each scaled by its accuracy target (`--loss grouped`: per
campaign, averaged), and writes `gpufleet/perf/data/calibration.yaml`. `--seeds N` fits
from several starts (`validation.fit_starts`) and keeps the lowest objective; `--ridge W`
adds a pull of each constant toward its prior (a MAP fit, `Search.penalty`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from gpufleet.errors import UserError
from gpufleet.perf.calibration import (
    BOUNDS,
    SCALAR_CONSTANTS,
    Calibration,
    calibration_to_dict,
    default_calibration,
    prior_calibration,
)
from gpufleet.validation.fit_space import (
    SHIPPED_SPACE,
    TIE,
    FitSpace,
    Knob,
    from_log,
    inside_bounds,
    knob_backends,
    log_midpoint,
    moved,
    pool_penalty,
    pooled_where_uninformed,
    replace_constant,
    to_log,
    value_of,
)
from gpufleet.validation.measured import default_csv, predict_row, read_rows, resolve_model


def _errors(cal: Calibration, row: Any, recipes: bool = False) -> tuple[float, float] | None:
    pred = predict_row(row, cal, recipes=recipes)
    if pred is None:
        return None
    return abs(math.log(pred.ttft_s / row.ttft_s)), abs(math.log(pred.tpot_s / row.tpot_s))


# The acceptance targets (median APE ≤ 20 % TTFT, ≤ 10 % TPOT) that scale each metric.
TTFT_TARGET = 0.2
TPOT_TARGET = 0.1


def _combine(errors: Sequence[tuple[float, float] | None]) -> float:
    """The acceptance metrics themselves: median |log(predicted / measured)| of TTFT and of
    TPOT, each scaled by its target (20% and 10%), summed. Medians keep the fit robust to
    the few rows no engine-level model explains."""
    got = [e for e in errors if e is not None]
    if not got:
        return math.inf
    ttft = statistics.median(e[0] for e in got)
    return ttft / TTFT_TARGET + statistics.median(e[1] for e in got) / TPOT_TARGET


def objective(cal: Calibration, rows: Sequence[Any], *, recipes: bool = False) -> float:
    """What `fit` minimises, for `cal` on `rows` (lower is better)."""
    return _combine([_errors(cal, r, recipes) for r in rows])


# The shared constants the fit tunes: only those with no single measured figure
# (attention kernels reach 0.1-0.65 of peak depending on shape; how skewed real routers
# are). The others have a measured source and stay at their prior
# (`perf.calibration.prior_calibration`: GEMM and copy efficiency from the H200 kernel
# measurements, the one-shot all-reduce latency, the per-kernel fixed time), scaled to
# other GPUs by the GPU's own peak figures: fitted to these rows' two GPUs they absorb
# what other terms miss and stop carrying over (LOMO TPOT 15.6 -> 12.8 % when frozen).
# MoE models' first-token time has no documented source, so it is fitted (from 0, its
# prior). (MTP's acceptance joins them when `recipes.MTP_SWEEP_MODELLED` is on.)
FITTED_SCALARS: tuple[str, ...] = ("attention_efficiency", "routing_skew", "moe_first_token_s")


# Backend constants only MoE models' predictions depend on.
MOE_BACKEND_CONSTANTS: tuple[str, ...] = (
    "moe_layer_overhead_s",
    "moe_efficiency",
    "moe_gemm_efficiency",
)


def _is_moe(row: Any) -> bool:
    try:
        return resolve_model(row.model_path).moe is not None
    except UserError:
        return False


def at_prior_where_frozen(cal: Calibration, space: FitSpace = SHIPPED_SPACE) -> Calibration:
    """The shared constants the fit does not tune and the engine constants `space` freezes,
    at their prior (physical) values."""
    prior = prior_calibration()
    for key in SCALAR_CONSTANTS:
        if key not in FITTED_SCALARS:
            cal = replace_constant(cal, key, float(getattr(prior, key)), None)
    for name in cal.backends:
        for key in space.frozen_backend_constants:
            cal = replace_constant(cal, key, float(getattr(prior.backend(name), key)), name)
    return cal


# One sweep of shrinking multiplicative steps; rounds past three repeat it, so a start far
# from the optimum (a prior) gets more passes with large steps after the small ones.
SWEEP: tuple[float, ...] = (1.5, 1.2, 1.07)


def sweep_steps(rounds: int) -> list[float]:
    return [SWEEP[i % len(SWEEP)] for i in range(rounds)]


# What the fit minimises. "median": the acceptance metrics over all rows (`_combine`).
# "grouped": the same metrics per campaign (engine x checkpoint), averaged, so each
# campaign counts once whatever its row count: a per-engine constant is then set by how
# many of the engine's models it serves, not by how many rows its largest or most
# anomalous campaign has (the grouping is the rows' provenance, never their values).
# "tpot_grouped": TTFT as in "median", TPOT as in "grouped": under the overall median an
# engine's MoE campaigns (a minority of its rows) can sit wholly above the median TPOT
# error and then set none of its MoE constants, which a held-out MoE model inherits.
# "engine": the acceptance metrics per engine, averaged: each engine's constants are set
# by the median of its own rows (an engine with a minority of the rows no longer floats).
LOSSES: tuple[str, ...] = ("median", "grouped", "tpot_grouped", "engine")
DEFAULT_LOSS = "median"


@dataclasses.dataclass
class Search:
    rows: Sequence[Any]
    recipes: bool
    loss: str
    knobs: list[Knob]
    by_backend: dict[str, list[int]]
    groups: list[list[int]]
    # MAP fit: a Gaussian prior on each fitted constant in log coordinates, centred on its
    # physical prior, one standard deviation = half its log range (`ridge` = 0: none), so a
    # constant the rows do not determine stays near its prior; beside it the partial pool.
    ridge: float = 0.0
    centre: dict[Knob, float] = dataclasses.field(default_factory=dict)
    space: FitSpace = SHIPPED_SPACE  # which engine constants are knobs (`prepare`)

    def penalty(self, cal: Calibration) -> float:
        total = pool_penalty(cal, self.knobs, len(self.groups))
        if not self.ridge:
            return total
        for knob in self.knobs:
            lo, hi = BOUNDS[knob[0]]
            half_width = (to_log(knob[0], hi) - to_log(knob[0], lo)) / 2
            z = (to_log(knob[0], value_of(cal, knob)) - self.centre[knob]) / half_width
            total += self.ridge * z * z
        return total

    def total(self, cal: Calibration, errors: Sequence[tuple[float, float] | None]) -> float:
        """What the search minimises: the loss plus the prior's penalty."""
        return self.score(errors) + self.penalty(cal)

    def errors(self, cal: Calibration) -> list[tuple[float, float] | None]:
        return [_errors(cal, r, self.recipes) for r in self.rows]

    def score(self, errors: Sequence[tuple[float, float] | None]) -> float:
        if self.loss == "median":
            return _combine(errors)
        if self.loss == "tpot_grouped":
            got = [e for e in errors if e is not None]
            if not got:
                return math.inf
            tpot = [
                statistics.median(errors[i][1] for i in g if errors[i] is not None)  # type: ignore[index]
                for g in self.groups
                if any(errors[i] is not None for i in g)
            ]
            ttft = statistics.median(e[0] for e in got)
            return ttft / TTFT_TARGET + statistics.fmean(tpot) / TPOT_TARGET
        groups = list(self.by_backend.values()) if self.loss == "engine" else self.groups
        scores = [_combine([errors[i] for i in g]) for g in groups]
        finite = [s for s in scores if math.isfinite(s)]
        return statistics.fmean(finite) if finite else math.inf

    def affected(self, knobs: Sequence[Knob]) -> Sequence[int]:
        if any(b is None for _, b in knobs):
            return range(len(self.rows))
        return sorted({i for _, b in knobs for n in knob_backends(b) for i in self.by_backend[n]})


def _log_position(search: Search, cal: Calibration) -> dict[Knob, float]:
    """Where `cal` sits in the search's log coordinates, per fitted constant."""
    return {k: to_log(k[0], value_of(cal, k)) for k in search.knobs}


def _point(search: Search, cal: Calibration) -> tuple[float, ...]:
    """Where `cal` is in the search's space, to 10 significant digits (a step and its
    reverse come back to the same point up to rounding)."""
    return tuple(float(f"{value_of(cal, k):.10g}") for k in search.knobs)


# `descend(..., converge=True)`: after the given steps, whole cycles of `SWEEP` repeat until
# one cycle accepts no move (at most this many extra cycles: a bound, not a tolerance).
MAX_CONVERGE_CYCLES = 30


def descend(
    search: Search, cal: Calibration, steps: Sequence[float], *, converge: bool = False
) -> tuple[Calibration, float]:
    """Coordinate search in log space (each constant in turn, steps that shrink, never past
    its bounds), then after each sweep a pattern move: the whole sweep's displacement tried
    again, repeatedly while it improves, so constants that trade off against each other
    (an engine's per-step overhead against its kernels' efficiency) move together along
    their valley instead of zig-zagging one at a time down it. converge: then keep cycling
    through `SWEEP` until a full cycle accepts nothing (a pattern search run to convergence
    on the 1.07 grid; `MAX_CONVERGE_CYCLES` bounds it) — it never ends higher than the fixed
    rounds. Constants no row informs are then pooled (`fit_space.pooled_where_uninformed`)."""
    errors = search.errors(cal)
    best = search.total(cal, errors)
    # Points already scored: each was accepted (no better than now) or rejected (no better
    # than the best then, and the best only falls), so none can be accepted again. After a
    # run of accepted steps the reverse step is such a point: skip it, same path, fewer
    # predictions.
    visited = {_point(search, cal)}

    def attempt(changes: Sequence[tuple[Knob, float]]) -> bool:
        nonlocal cal, errors, best
        trial = moved(cal, changes)
        point = _point(search, trial)
        if point in visited:
            return False
        visited.add(point)
        trial_errors = list(errors)
        for i in search.affected([k for k, _ in changes]):
            trial_errors[i] = _errors(trial, search.rows[i], search.recipes)
        s = search.total(trial, trial_errors)
        if s < best - 1e-6:
            cal, errors, best = trial, trial_errors, s
            return True
        return False

    def sweep(step: float) -> bool:
        """One pass over the constants at `step` and its pattern moves; any accepted?"""
        start_best = best
        before = _log_position(search, cal)
        for knob in search.knobs:
            improved = True
            while improved:
                improved = False
                current = value_of(cal, knob)
                x = to_log(knob[0], current)
                for dx in (math.log(step), -math.log(step)):
                    cand = from_log(knob[0], x + dx)
                    if cand != current and attempt([(knob, cand)]):
                        improved = True
                        break
        for _ in range(4):  # a bounded number of pattern moves per sweep
            changes = []
            for knob, x0 in before.items():
                x = to_log(knob[0], value_of(cal, knob))
                cand = from_log(knob[0], 2 * x - x0)
                if abs(x - x0) > 1e-12 and cand != value_of(cal, knob):
                    changes.append((knob, cand))
            before = _log_position(search, cal)
            if not changes or not attempt(changes):
                break
        return best < start_best

    for step in steps:
        sweep(step)
    if converge:
        for _ in range(MAX_CONVERGE_CYCLES):
            accepted = [sweep(step) for step in SWEEP]
            if not any(accepted):
                break
    return pooled_where_uninformed(cal, search.knobs), best


def midpoint_start(cal: Calibration, knobs: Sequence[Knob]) -> Calibration:
    """`cal` with every fitted constant at the middle of its bounds (log coordinates)."""
    return moved(cal, [(k, log_midpoint(k[0])) for k in knobs])


def prepare(
    rows: Sequence[Any],
    start: Calibration,
    *,
    recipes: bool = False,
    loss: str = DEFAULT_LOSS,
    ridge: float = 0.0,
    space: FitSpace = SHIPPED_SPACE,
) -> tuple[Search, Calibration]:
    """The search over `rows` (which constants it moves, `space`'s; how it scores) and
    `start` moved inside the bounds with the unfitted constants at their prior."""
    if loss not in LOSSES:
        raise UserError(f"unknown fit loss {loss!r} (one of {', '.join(LOSSES)})")
    if ridge < 0:
        raise UserError(f"the fit's ridge must be >= 0, got {ridge}")
    cal = at_prior_where_frozen(inside_bounds(start), space)
    # Each engine's own constants first, then the shared ones: from a far start (a prior),
    # shared efficiencies moved first absorb engine-specific offsets (they ran to their
    # bounds).
    backends = sorted({r.backend for r in rows} & set(cal.backends))
    # An engine's MoE kernel constants move only where it served an MoE model: no row
    # constrains them otherwise, and the midpoint restart would leave them wherever it set
    # them, not at the kernel measurements' prior (a held-out MoE model then gets them).
    moe_backends = {r.backend for r in rows if _is_moe(r)}
    own = space.fitted_backend_constants
    tied = [b for b in backends if not space.sharing_engines or b in space.sharing_engines]
    shared = [k for k in own if k in space.shared_backend_constants and tied]
    knobs: list[Knob] = [(k, b) for b in backends for k in own if (k not in shared or b not in tied)
                         and (b in moe_backends or k not in MOE_BACKEND_CONSTANTS)]  # fmt: skip
    # A shared MoE constant moves where a sharing engine served an MoE model, for them all.
    knobs += [(k, TIE.join(tied)) for k in shared
              if moe_backends & set(tied) or k not in MOE_BACKEND_CONSTANTS]  # fmt: skip
    knobs += [(k, None) for k in FITTED_SCALARS]
    groups: dict[tuple[str, str], list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault((r.backend, r.model_path), []).append(i)
    prior = prior_calibration()
    search = Search(
        rows=rows,
        recipes=recipes,
        loss=loss,
        knobs=knobs,
        by_backend={b: [i for i, r in enumerate(rows) if r.backend == b] for b in backends},
        groups=list(groups.values()),
        ridge=ridge,
        centre={k: to_log(k[0], value_of(prior, k)) for k in knobs},
        space=space,
    )
    return search, cal


def training_objective(search: Search, cal: Calibration) -> float:
    """What the search minimised, for `cal` (the loss plus the prior's penalty)."""
    return search.total(cal, search.errors(cal))


def fit(
    rows: Sequence[Any],
    start: Calibration,
    rounds: int = 3,
    *,
    recipes: bool = False,
    loss: str = DEFAULT_LOSS,
    restarts: bool = True,
    ridge: float = 0.0,
    converge: bool = False,
    space: FitSpace = SHIPPED_SPACE,
) -> Calibration:
    """Minimise `loss` over the fitted constants inside their physical bounds
    (`perf.calibration.BOUNDS`): a log-space coordinate search with pattern moves
    (`descend`) from `start` and, with `restarts`, again from the middle of the bounds;
    the lower loss wins (ties keep `start`'s). Two starts a data-independent distance
    apart make the held-out figures depend less on where one search happened to stop
    (`validation.fit_starts` runs more). A backend's own constants only move its rows'
    predictions, so only those are recomputed when one changes. recipes: predict the rows
    as their launch recipes ran them (`validation.recipes`). ridge: the weight of a
    Gaussian prior pulling each constant toward `prior_calibration()` (`Search.penalty`).
    converge: after the `rounds`, sweep on until a full cycle accepts nothing (`descend`).
    space: which engine constants are fitted, frozen or shared (`fit_space.FitSpace`)."""
    search, cal = prepare(rows, start, recipes=recipes, loss=loss, ridge=ridge, space=space)
    starts = [cal, midpoint_start(cal, search.knobs)] if restarts else [cal]
    results = [descend(search, s, sweep_steps(rounds), converge=converge) for s in starts]
    return min(results, key=lambda r: r[1])[0]


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
    parser.add_argument("--loss", choices=LOSSES, default=DEFAULT_LOSS, help="see fit.LOSSES")
    parser.add_argument(
        "--no-restart", action="store_true", help="one search from the start, no midpoint restart"
    )
    parser.add_argument(
        "--ridge", type=float, default=0.0, help="weight of the pull toward the prior (MAP fit)"
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=0,
        help="> 0: fit from the prior, the midpoint, the shipped constants (not with "
        "--from-prior) and this many seeded perturbations (validation.fit_starts), keep the best",
    )
    parser.add_argument("--workers", type=int, default=1, help="processes for --seeds' starts")
    parser.add_argument(
        "--until-converged",
        action="store_true",
        help="after --rounds, sweep on until a full cycle of steps accepts no move",
    )
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        args.csv = args.csv or default_csv()
        rows = read_rows(args.csv)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.seeds > 0:
        from gpufleet.validation import fit_starts as fs

        refit = fs.Refit(rounds=args.rounds, loss=args.loss, ridge=args.ridge, seeds=args.seeds,
                         workers=args.workers, converge=args.until_converged)  # fmt: skip
        jobs = refit.jobs(rows, shipped=not args.from_prior)
        cal = fs.best_start(fs.fit_many(jobs, refit.workers)).calibration
    else:
        start = prior_calibration() if args.from_prior else default_calibration()
        cal = fit(rows, start, rounds=args.rounds, loss=args.loss, restarts=not args.no_restart,
                  ridge=args.ridge, converge=args.until_converged)  # fmt: skip
    header = (
        "# Fitted by `python -m gpufleet.validation.fit` on "
        f"{args.csv.name} ({len(rows)} rows). Few, physical constants: see calibration.py.\n"
    )
    args.out.write_text(header + yaml.safe_dump(calibration_to_dict(cal), sort_keys=False))
    print(f"wrote {args.out}: score {objective(cal, rows):.4f} (median loss)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
