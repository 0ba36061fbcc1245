"""The held-out refits of benchmarks/plan_accuracy.py start from the data-independent prior
and points derived from it, never from the shipped constants (fitted on all rows, the
held-out ones included), and keep the start of lowest training objective."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gpufleet.perf.calibration import Calibration, default_calibration, prior_calibration
from gpufleet.validation import fit as fit_module
from gpufleet.validation import fit_starts
from gpufleet.validation.measured import read_rows

from .helpers import CONFIGS, SAMPLE, benchmark_module

with benchmark_module("plan_refits") as _refits:
    Refit = _refits.Refit
REFIT = Refit(rounds=1, seeds=2)


@pytest.fixture(scope="module")
def accuracy() -> Iterator[ModuleType]:
    with benchmark_module("plan_accuracy") as module:
        yield module


Started = list[tuple[Calibration, Any]]


@pytest.fixture
def starts(accuracy: ModuleType, monkeypatch: pytest.MonkeyPatch) -> Started:
    """Every refit's starting point and rows (the search stubbed: a start stays where it
    is, its training objective its sglang step overhead); reading the shipped constants
    fails the test unless a test allows it."""
    seen: Started = []

    def no_shipped() -> Calibration:
        raise AssertionError("a held-out refit read the shipped (all-rows) calibration")

    def recording_descend(
        search: Any, cal: Calibration, steps: Any, **_: Any
    ) -> tuple[Calibration, float]:
        seen.append((cal, search.rows))
        return cal, cal.backend("sglang").step_overhead_s

    monkeypatch.setattr(fit_starts, "default_calibration", no_shipped)
    monkeypatch.setattr(fit_module, "descend", recording_descend)
    return seen


def _rows() -> list[Any]:
    return [r for r in read_rows(SAMPLE) if r.system != "tpu_v9"]  # the modelled ones


def _check_starts(starts: Started, folds: int) -> None:
    """Each fold starts from the prior, the midpoint and two seeded perturbations of the
    prior, in that order; none is the shipped constants."""
    assert len(starts) == 4 * folds
    shipped = default_calibration()
    for k in range(folds):
        fold = [cal for cal, _ in starts[4 * k : 4 * k + 4]]
        assert fold[0] == prior_calibration()
        assert len({repr(c) for c in fold}) == 4  # four different starting points
        assert all(c != shipped for c in fold)


def test_leave_one_model_out_never_starts_from_the_shipped_constants(
    accuracy: ModuleType, starts: Started
) -> None:
    overall, per_group = accuracy.leave_one_model_out(_rows(), CONFIGS, refit=REFIT)
    assert overall["rows"] == len(_rows()) and len(per_group) == 2
    _check_starts(starts, folds=2)
    for group in per_group.values():
        assert set(group["starts"]) == {"prior", "midpoint", "seed1", "seed2"}
        lo, hi = group["spread_pct"]["ttft"]
        assert lo <= group["ttft_median_ape_pct"] <= hi


def test_leave_one_gpu_out_never_starts_from_the_shipped_constants(
    accuracy: ModuleType, starts: Started
) -> None:
    accuracy.leave_one_gpu_out(_rows(), CONFIGS, refit=REFIT)
    _check_starts(starts, folds=2)


def test_each_fold_keeps_the_start_of_lowest_training_objective(
    accuracy: ModuleType, starts: Started
) -> None:
    """The kept start is the one whose fit scored lowest on the TRAINING rows (here: the
    stub's objective, the sglang step overhead), whatever its held-out error."""
    _, per_group = accuracy.leave_one_model_out(_rows(), CONFIGS, refit=REFIT)
    for k, group in enumerate(per_group.values()):
        fold = starts[4 * k : 4 * k + 4]
        objectives = {
            label: cal.backend("sglang").step_overhead_s
            for label, (cal, _) in zip(group["starts"], fold, strict=True)
        }
        assert group["start"] == min(objectives, key=objectives.__getitem__)
        assert group["starts"][group["start"]]["training_objective"] == pytest.approx(
            min(objectives.values()), abs=1e-4
        )


def test_in_sample_refit_uses_the_same_starts_and_the_shipped_constants_as_a_candidate(
    accuracy: ModuleType, starts: Started, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fit_starts, "default_calibration", default_calibration)
    summary, _, candidate = accuracy.in_sample_from_prior(
        _rows(), CONFIGS, accuracy.summarize, refit=REFIT
    )
    assert summary["rows"] == len(_rows())
    assert set(summary["starts"]) == {"prior", "midpoint", "shipped", "seed1", "seed2"}
    assert summary["start"] != "shipped"  # the from-prior figure never uses it
    assert candidate.objective <= summary["starts"][summary["start"]]["training_objective"]
    assert starts[0][0] == prior_calibration()


@pytest.mark.process
def test_parallel_workers_give_the_serial_result() -> None:
    """The real search on the sample rows, one start per process or all in this one."""
    rows = _rows()
    jobs = Refit(rounds=1, seeds=1).jobs(rows)
    serial = fit_starts.fit_many(jobs, workers=1)
    parallel = fit_starts.fit_many(jobs, workers=2)
    assert [f.label for f in serial] == ["prior", "midpoint", "seed1"]
    assert serial == parallel


def test_rounds_past_one_sweep_repeat_the_shrinking_steps() -> None:
    from gpufleet.validation.fit import SWEEP, sweep_steps

    assert sweep_steps(2) == list(SWEEP[:2])
    assert sweep_steps(7) == [*SWEEP, *SWEEP, SWEEP[0]]


def test_calibration_refit_from_the_prior_writes_loadable_constants(tmp_path: Path) -> None:
    import yaml

    from gpufleet.perf.calibration import calibration_from_dict
    from gpufleet.validation.fit import main as calibration_main

    out = tmp_path / "cal.yaml"
    assert calibration_main([str(SAMPLE), "--out", str(out), "--rounds", "1", "--from-prior"]) == 0
    cal = calibration_from_dict(yaml.safe_load(out.read_text()))
    assert cal != prior_calibration()  # the search moved it


def test_fit_holds_the_measured_constants_at_their_prior() -> None:
    """Constants with a measured source (GEMM / copy efficiency, all-reduce latency, the
    per-kernel fixed time) are not fitted: from any start they come back to the prior's
    values and stay there; only the others move."""
    import dataclasses

    from gpufleet.perf.calibration import SCALAR_CONSTANTS
    from gpufleet.validation.fit import FITTED_SCALARS, fit

    prior = prior_calibration()
    frozen = [k for k in SCALAR_CONSTANTS if k not in FITTED_SCALARS]
    assert {"gemm_efficiency", "memory_efficiency", "kernel_fixed_s"} <= set(frozen)
    start = dataclasses.replace(prior, gemm_efficiency=0.5, memory_efficiency=0.7)
    got = fit(_rows(), start, rounds=1)
    assert all(getattr(got, k) == getattr(prior, k) for k in frozen)


def test_calibration_refit_from_several_starts_is_no_worse_than_from_the_prior(
    tmp_path: Path,
) -> None:
    """`--seeds`: the prior is one of the starts, so the kept fit's objective is at most
    the prior start's (the training objective decides, never held-out rows: there are none)."""
    import yaml

    from gpufleet.perf.calibration import calibration_from_dict
    from gpufleet.validation.fit import main as calibration_main
    from gpufleet.validation.fit import objective

    rows = read_rows(SAMPLE)
    out = tmp_path / "cal.yaml"
    args = [str(SAMPLE), "--out", str(out), "--rounds", "1", "--from-prior", "--no-restart"]
    assert calibration_main(args) == 0
    one = objective(calibration_from_dict(yaml.safe_load(out.read_text())), rows)
    assert calibration_main([*args, "--seeds", "1"]) == 0
    several = objective(calibration_from_dict(yaml.safe_load(out.read_text())), rows)
    assert several <= one + 1e-3
