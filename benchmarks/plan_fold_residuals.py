"""Where a held-out fold (a model or a GPU kind left out) loses what in-sample keeps (issue 14).

    python benchmarks/plan_fold_residuals.py [CSV] [--model-configs DIR] [--fold TEXT ...]
                                             [--gpu] [--out PATH] [--refit-rounds N]
                                             [--seeds N] [--workers N] [--ridge W]

For each held-out architecture (as `plan_accuracy.py` groups them; --fold TEXT keeps the
ones whose name contains TEXT; --gpu holds out each GPU kind instead), refits the
calibration from the prior without it — the same refit as `plan_accuracy.py`'s held-out
ones — and scores its rows twice: with that fold's constants and with the shipped ones
(fitted on all rows, the in-sample figure). Per campaign (`plan_residuals.group_label`: backend, version, model, GPU,
layout) it reports both TTFT / TPOT median APEs and TTFT biases, so a fold's loss reads
as "these campaigns, this sign". Per engine it gives the fold's TTFT median had that
engine's held-out rows kept their in-sample errors (the share of the loss its constants
carry), and it lists the constants the fold moved most against the shipped ones (the
ones only the held-out rows pinned).

Writes benchmarks/results/plan_fold_residuals{,_gpu}.{json,md}. Slow: one refit per fold and start
(about a minute each on a quiet machine; --workers N runs the starts in N processes).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpufleet.errors import UserError
from gpufleet.perf.calibration import (
    SCALAR_CONSTANTS,
    Calibration,
    calibration_to_dict,
    default_calibration,
)
from gpufleet.validation.fit_starts import DEFAULT_SEEDS, Refit, best_start, fit_many
from gpufleet.validation.measured import (
    MeasuredRow,
    RowPrediction,
    default_csv,
    predict_rows,
    read_rows,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_refits import arch_key as _arch_key
from plan_refits import held_out_folds
from plan_residuals import _ape, _log_err, _versions, group_label
from record import RESULTS, write_result

# A constant counts as moved by the fold when fold / shipped leaves [1/this, this].
MOVED_RATIO = 1.25


def _median_ape(errs: Sequence[float]) -> float:
    return round(statistics.median(_ape(e) for e in errs), 1) if errs else math.nan


def compare(
    fold_preds: Sequence[RowPrediction],
    shipped_preds: Sequence[RowPrediction],
    versions: dict[str, str],
) -> dict[str, Any]:
    """Per campaign and per engine, the held-out rows' errors under the fold's constants
    beside the shipped (in-sample) ones; both lists predict the same rows."""
    by_id = {p.row.id: p for p in shipped_preds}
    pairs = [(p, by_id[p.row.id]) for p in fold_preds if p.row.id in by_id]
    campaigns: dict[str, list[tuple[RowPrediction, RowPrediction]]] = defaultdict(list)
    for f, s in pairs:
        campaigns[group_label(f.row, versions.get(f.row.id, ""))].append((f, s))
    per_campaign = {}
    for name, ps in sorted(campaigns.items()):
        f_ttft = [_log_err(f.ttft_s, f.row.ttft_s) for f, _ in ps]
        s_ttft = [_log_err(s.ttft_s, s.row.ttft_s) for _, s in ps]
        per_campaign[name] = {
            "rows": len(ps),
            "ttft_ape_pct": _median_ape(f_ttft),
            "ttft_in_sample_ape_pct": _median_ape(s_ttft),
            "ttft_bias_log": round(statistics.median(f_ttft), 3),
            "ttft_in_sample_bias_log": round(statistics.median(s_ttft), 3),
            "tpot_ape_pct": _median_ape([_log_err(f.tpot_s, f.row.tpot_s) for f, _ in ps]),
            "tpot_in_sample_ape_pct": _median_ape(
                [_log_err(s.tpot_s, s.row.tpot_s) for _, s in ps]
            ),
        }
    fold_errs = [_log_err(f.ttft_s, f.row.ttft_s) for f, _ in pairs]
    engines = sorted({f.row.backend for f, _ in pairs})
    swapped = {}
    for engine in engines:
        errs = [
            _log_err((s if f.row.backend == engine else f).ttft_s, f.row.ttft_s) for f, s in pairs
        ]
        swapped[engine] = _median_ape(errs)
    return {
        "rows": len(pairs),
        "ttft_ape_pct": _median_ape(fold_errs),
        "ttft_in_sample_ape_pct": _median_ape([_log_err(s.ttft_s, s.row.ttft_s) for _, s in pairs]),
        "ttft_ape_pct_with_engine_in_sample": swapped,
        "per_campaign": per_campaign,
    }


def moved_constants(fold: Calibration, shipped: Calibration) -> list[dict[str, Any]]:
    """Constants whose fold value is off the shipped one by more than MOVED_RATIO, most
    moved first (a value of 0 on either side counts as moved when the other is not)."""
    a, b = calibration_to_dict(fold), calibration_to_dict(shipped)
    pairs = [(k, None, a[k], b[k]) for k in SCALAR_CONSTANTS]
    for engine, values in a["backends"].items():
        if engine != "default" and engine in b["backends"]:
            pairs += [(k, engine, v, b["backends"][engine][k]) for k, v in values.items()]
    out = []
    for key, engine, f, s in pairs:
        ratio = (max(f, s) / min(f, s)) if min(f, s) > 0 else (math.inf if f != s else 1.0)
        if ratio > MOVED_RATIO:
            out.append({"constant": key, "backend": engine, "fold": f, "shipped": s,
                        "ratio": round(ratio, 2)})  # fmt: skip
    return sorted(out, key=lambda m: -m["ratio"])


def run(
    csv_path: Path,
    configs_dir: Path | None = None,
    folds: Sequence[str] = (),
    rounds: int = 3,
    by_gpu: bool = False,
    refit: Refit | None = None,
) -> dict[str, Any]:
    """Each fold (an architecture, or with `by_gpu` a GPU kind) refitted without its rows
    from the prior and the other starts `plan_accuracy.py` uses (the start of lowest
    training objective kept), and those rows scored with that fold's and the shipped
    constants."""
    refit = refit or Refit(rounds=rounds)
    rows = read_rows(csv_path)
    versions = _versions(csv_path)
    shipped = default_calibration()
    report: dict[str, Any] = {"csv": str(csv_path), "folds": {}}
    group_of: Callable[[MeasuredRow], Any] = (
        (lambda r: r.system) if by_gpu else (lambda r: _arch_key(r, configs_dir))
    )
    for name, held, rest in held_out_folds(rows, group_of, folds):
        shipped_preds, _ = predict_rows(held, shipped, configs_dir)
        if not shipped_preds:  # none of its rows can be modelled: nothing to score
            continue
        best = best_start(fit_many(refit.jobs(rest), refit.workers))
        cal = best.calibration
        fold_preds, _ = predict_rows(held, cal, configs_dir)
        entry = compare(fold_preds, shipped_preds, versions)
        entry["moved_constants"] = moved_constants(cal, shipped)
        entry["calibration"] = calibration_to_dict(cal)
        entry["start"] = best.label
        report["folds"][name] = entry
    return report


def markdown(report: dict[str, Any]) -> str:
    out = []
    for name, f in report["folds"].items():
        swapped = ", ".join(
            f"{e} {v:.1f} %" for e, v in f["ttft_ape_pct_with_engine_in_sample"].items()
        )
        out += [
            f"### Held out: {name}",
            "",
            f"TTFT median APE {f['ttft_ape_pct']:.1f} % held out, "
            f"{f['ttft_in_sample_ape_pct']:.1f} % in-sample (shipped constants) over "
            f"{f['rows']} rows. Held out, with one engine's rows at their in-sample error: "
            f"{swapped}.",
            "",
            "| campaign (backend version model GPU layout) | rows | TTFT APE % held out "
            "/ in-sample | TTFT bias (log) held out / in-sample | TPOT APE % held out "
            "/ in-sample |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for c, s in sorted(f["per_campaign"].items(), key=lambda kv: -kv[1]["rows"]):
            out.append(
                f"| {c} | {s['rows']} | {s['ttft_ape_pct']:.1f} / "
                f"{s['ttft_in_sample_ape_pct']:.1f} | {s['ttft_bias_log']:+.2f} / "
                f"{s['ttft_in_sample_bias_log']:+.2f} | {s['tpot_ape_pct']:.1f} / "
                f"{s['tpot_in_sample_ape_pct']:.1f} |"
            )
        out += ["", "| constant | backend | fold | shipped | ratio |",
                "| --- | --- | ---: | ---: | ---: |"]  # fmt: skip
        for m in f["moved_constants"]:
            out.append(
                f"| {m['constant']} | {m['backend'] or '–'} | {m['fold']:.4g} | "
                f"{m['shipped']:.4g} | {m['ratio']:.2f} |"
            )
        out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="?", type=Path, default=None, help="measured-serving CSV")
    parser.add_argument("--model-configs", type=Path, default=None)
    parser.add_argument(
        "--out", type=Path, default=None, help="path without suffix (default: under results/)"
    )
    parser.add_argument("--fold", action="append", default=[], help="held-out name contains")
    parser.add_argument("--gpu", action="store_true", help="hold out GPU kinds, not models")
    parser.add_argument("--refit-rounds", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, help="seeded starts per fit")
    parser.add_argument("--workers", type=int, default=1, help="processes the starts run in")
    parser.add_argument("--ridge", type=float, default=0.0, help="pull toward the prior")
    args = parser.parse_args(argv)
    refit = Refit(args.refit_rounds, ridge=args.ridge, seeds=args.seeds, workers=args.workers)
    try:
        csv_path = args.csv or default_csv()
        report = run(csv_path, args.model_configs, args.fold, by_gpu=args.gpu, refit=refit)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = args.out or RESULTS / ("plan_fold_residuals_gpu" if args.gpu else "plan_fold_residuals")
    table = markdown(report)
    print(table)
    json_path, md_path = write_result(out, report, table, note=f"CSV: {csv_path.name}")
    print(f"\nwrote {json_path} and {md_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
