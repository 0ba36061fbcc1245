"""The held-out refits of benchmarks/plan_accuracy.py start from the data-independent prior,
never from the shipped constants (fitted on all rows, the held-out ones included)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gpufleet.perf.calibration import Calibration, prior_calibration
from gpufleet.validation.measured import read_rows

from .helpers import CONFIGS, SAMPLE, benchmark_module


@pytest.fixture(scope="module")
def accuracy() -> Iterator[ModuleType]:
    with benchmark_module("plan_accuracy") as module:
        yield module


@pytest.fixture
def starts(accuracy: ModuleType, monkeypatch: pytest.MonkeyPatch) -> list[Calibration]:
    """Every refit's starting point; reading the shipped constants fails the test."""
    seen: list[Calibration] = []

    def no_shipped() -> Calibration:
        raise AssertionError("a held-out refit read the shipped (all-rows) calibration")

    def recording_fit(rows: Any, start: Calibration, rounds: int = 3, **_: Any) -> Calibration:
        seen.append(start)
        return start

    monkeypatch.setattr(accuracy, "default_calibration", no_shipped)
    monkeypatch.setattr(accuracy, "fit", recording_fit)
    return seen


def _rows() -> list[Any]:
    return [r for r in read_rows(SAMPLE) if r.system != "tpu_v9"]  # the modelled ones


def test_leave_one_model_out_starts_every_refit_from_the_prior(
    accuracy: ModuleType, starts: list[Calibration]
) -> None:
    overall, per_group = accuracy.leave_one_model_out(_rows(), CONFIGS, rounds=1)
    assert overall["rows"] == len(_rows()) and len(per_group) == 2
    assert len(starts) == 2 and all(s == prior_calibration() for s in starts)


def test_leave_one_gpu_out_starts_every_refit_from_the_prior(
    accuracy: ModuleType, starts: list[Calibration]
) -> None:
    accuracy.leave_one_gpu_out(_rows(), CONFIGS, rounds=1)
    assert len(starts) == 2 and all(s == prior_calibration() for s in starts)


def test_in_sample_from_prior_uses_the_same_start(
    accuracy: ModuleType, starts: list[Calibration]
) -> None:
    summary, cal = accuracy.in_sample_from_prior(_rows(), CONFIGS, rounds=1)
    assert summary["rows"] == len(_rows())
    assert starts == [prior_calibration()] and cal == prior_calibration()


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
