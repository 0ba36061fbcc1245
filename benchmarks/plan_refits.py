"""The refits behind benchmarks/plan_accuracy.py's held-out figures (and its in-sample fit
from the prior), each from several starting points (`gpufleet.validation.fit_starts`).

Per fit, every start's descent runs; the start with the lowest TRAINING objective is kept
(never the held-out error: choosing by it would leak the held-out rows into the figure), and
every start's held-out error is reported beside it, so a reader sees how resolved each
fold's figure is: `spread_pct` is the range of a fold's median APE across the starts.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from gpufleet.perf.calibration import Calibration, calibration_to_dict
from gpufleet.validation.fit_starts import Refit, StartFit, best_start, fit_many
from gpufleet.validation.measured import MeasuredRow, RowPrediction, predict_rows, resolve_model


def _medians(preds: Sequence[RowPrediction]) -> tuple[float, float]:
    if not preds:
        return float("nan"), float("nan")
    ttft = statistics.median(p.ttft_ape_pct for p in preds)
    tpot = statistics.median(p.tpot_ape_pct for p in preds)
    return round(ttft, 2), round(tpot, 2)


def _spread(by_start: dict[str, dict[str, float]]) -> dict[str, list[float]]:
    out = {}
    for metric in ("ttft_median_ape_pct", "tpot_median_ape_pct"):
        values = [s[metric] for s in by_start.values()]
        out[metric.split("_")[0]] = [min(values), max(values)]
    return out


def _starts_report(fits: Sequence[StartFit], preds: dict[str, list[RowPrediction]]) -> Any:
    by_start = {}
    for f in fits:
        ttft, tpot = _medians(preds[f.label])
        by_start[f.label] = {
            "training_objective": round(f.objective, 4),
            "ttft_median_ape_pct": ttft,
            "tpot_median_ape_pct": tpot,
            # The start's fitted constants: which ones the starts (and folds) disagree on.
            "constants": calibration_to_dict(f.calibration),
        }
    return by_start


def leave_one_out(
    rows: Sequence[MeasuredRow],
    configs_dir: Path | None,
    group_of: Callable[[MeasuredRow], Any],
    summarize: Callable[[list[RowPrediction]], dict[str, Any]],
    *,
    refit: Refit = Refit(),
    engine: bool = False,
    folds: Sequence[str] = (),
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Refit without each group's rows from every start; score that group with the start
    of lowest training objective, and report every start's held-out medians beside it.

    No start is the shipped constants: those were fitted on all rows, the held-out group's
    included, and a search started at that optimum stays near it (the held-out figure would
    leak). The refit is the analytic one (the engine path is too slow to fit through); with
    `engine` the kept start's constants then predict the held-out rows on the engine."""
    chosen: list[RowPrediction] = []
    pooled: dict[str, list[RowPrediction]] = defaultdict(list)
    per_group: dict[str, dict[str, Any]] = {}
    fold_list = list(held_out_folds(rows, group_of, folds))
    jobs = [j for _, _, rest in fold_list for j in refit.jobs(rest)]
    fits = fit_many(jobs, refit.workers)
    per_fold = len(jobs) // max(1, len(fold_list))
    for k, (name, held, _) in enumerate(fold_list):
        fold_fits = fits[k * per_fold : (k + 1) * per_fold]
        preds = {f.label: _predict(held, f.calibration, configs_dir, refit) for f in fold_fits}
        best = best_start(fold_fits)
        kept = (
            _predict(held, best.calibration, configs_dir, refit, engine=True)
            if engine
            else preds[best.label]
        )
        chosen += kept
        for label, p in preds.items():
            pooled[label] += p
        by_start = _starts_report(fold_fits, preds)
        per_group[name] = summarize(kept) | {
            "start": best.label,
            "starts": by_start,
            "spread_pct": _spread(by_start),
        }
    overall = summarize(chosen)
    if fold_list:
        by_start = {label: dict(zip(("ttft_median_ape_pct", "tpot_median_ape_pct"),
                                    _medians(p), strict=True)) for label, p in pooled.items()}  # fmt: skip
        # Each start used in every fold (not a choice: how far the figure moves with it).
        overall |= {"starts": by_start, "spread_pct": _spread(by_start)}
    return overall, per_group


def _predict(
    rows: Sequence[MeasuredRow],
    cal: Calibration,
    configs_dir: Path | None,
    refit: Refit,
    *,
    engine: bool = False,
) -> list[RowPrediction]:
    return predict_rows(rows, cal, configs_dir, engine=engine, recipes=refit.recipes)[0]


def in_sample_from_prior(
    rows: Sequence[MeasuredRow],
    configs_dir: Path | None,
    summarize: Callable[[list[RowPrediction]], dict[str, Any]],
    *,
    refit: Refit = Refit(),
    engine: bool = False,
) -> tuple[dict[str, Any], Calibration, StartFit]:
    """All rows scored with constants fitted on all rows by the held-out refits' own starts
    and search: the in-sample figure the held-out ones compare with (only the rows differ).
    Also returned: the candidate for the shipped calibration, the best of those starts and
    one more from the shipped constants (no row is held out here, so nothing leaks): what
    `calibration.yaml` would be by this procedure."""
    fits = fit_many(refit.jobs(rows, shipped=True), refit.workers)
    candidate = best_start(fits)
    best = best_start([f for f in fits if f.label != "shipped"])
    cal = best.calibration
    preds = {f.label: _predict(rows, f.calibration, configs_dir, refit) for f in fits}
    kept = _predict(rows, cal, configs_dir, refit, engine=True) if engine else preds[best.label]
    by_start = _starts_report(fits, preds)
    spread = _spread({k: v for k, v in by_start.items() if k != "shipped"})
    summary = summarize(kept) | {"start": best.label, "starts": by_start, "spread_pct": spread}
    return summary, cal, candidate


def held_out_folds(
    rows: Sequence[MeasuredRow], group_of: Callable[[MeasuredRow], Any], folds: Sequence[str] = ()
) -> Iterator[tuple[str, list[MeasuredRow], list[MeasuredRow]]]:
    """Each group's name, its rows (held out) and the other rows, in name order: only the
    groups whose name contains one of `folds` (all when empty), none that is every row."""
    groups: dict[Any, list[MeasuredRow]] = defaultdict(list)
    for r in rows:
        groups[group_of(r)].append(r)
    for name, held in sorted((_group_name(k, g), g) for k, g in groups.items()):
        held_ids = {id(r) for r in held}
        rest = [r for r in rows if id(r) not in held_ids]
        if rest and (not folds or any(f in name for f in folds)):
            yield name, held, rest


def _group_name(key: Any, rows: Sequence[MeasuredRow]) -> str:
    """A GPU group by its name; an architecture by its checkpoints' names."""
    return key if isinstance(key, str) else " + ".join(sorted({r.model_path for r in rows}))


def arch_key(row: MeasuredRow, configs_dir: Path | None) -> tuple[Any, ...]:
    """An architecture: checkpoints of one (DeepSeek-V3 / R1, Llama-3.1-8B and its FP8
    copy) are held out together."""
    spec = resolve_model(row.model_path, configs_dir)
    experts = spec.moe.num_experts if spec.moe else 0
    return (spec.model_type, spec.hidden_size, spec.num_layers, experts)
