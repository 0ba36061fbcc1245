"""The fit's search (`validation.fit`): restarts, log coordinates that reach a zero bound,
and the per-campaign loss, on synthetic objectives whose optimum is known."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from gpufleet.perf.calibration import Calibration, prior_calibration
from gpufleet.validation import fit as fit_module

Errors = Callable[[Calibration, Any, bool], "tuple[float, float] | None"]


def _rows(*campaigns: tuple[str, int]) -> list[Any]:
    return [
        SimpleNamespace(backend="sglang", model_path=name)
        for name, count in campaigns
        for _ in range(count)
    ]


def _use(monkeypatch: pytest.MonkeyPatch, errors: Errors) -> None:
    monkeypatch.setattr(fit_module, "_errors", errors)


def test_the_midpoint_restart_leaves_a_local_optimum_at_the_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """moe_first_token_s starts at 0 (its prior) in a shallow basin (loss 0.1 / 0.2 = 0.5);
    the global optimum (0.08 s, loss 0) lies past a ridge no single step crosses. One
    search from the start stays there; the restart from the middle of the bounds finds it."""
    u0, u1 = math.log(0.005), math.log(0.08)  # log(v + 0.005): 0.005 = 1 % of the bound

    def errors(cal: Calibration, row: Any, recipes: bool) -> tuple[float, float]:
        u = math.log(cal.moe_first_token_s + 0.005)
        return min(0.1 + 2 * abs(u - u0), abs(u - u1)), 0.0

    _use(monkeypatch, errors)
    rows = _rows(("m", 1))
    assert prior_calibration().moe_first_token_s == 0.0
    stuck = fit_module.fit(rows, prior_calibration(), restarts=False)
    assert stuck.moe_first_token_s == 0.0
    got = fit_module.fit(rows, prior_calibration())
    assert got.moe_first_token_s == pytest.approx(0.08, rel=0.1)


def test_a_constant_reaches_a_zero_lower_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Multiplicative steps alone never reach 0; the search's log offset does."""

    def errors(cal: Calibration, row: Any, recipes: bool) -> tuple[float, float]:
        return 0.0, cal.backend("sglang").seq_overhead_s / 200e-6

    _use(monkeypatch, errors)
    got = fit_module.fit(_rows(("m", 1)), prior_calibration(), restarts=False)
    assert got.backend("sglang").seq_overhead_s == 0.0


def test_the_grouped_loss_counts_each_campaign_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Five rows of one campaign want sglang's per-step overhead at 1 ms, one row each of
    two other campaigns want 8 ms. Over all rows the median follows the large campaign;
    per campaign, two campaigns outvote one."""

    def errors(cal: Calibration, row: Any, recipes: bool) -> tuple[float, float]:
        want = 1e-3 if row.model_path == "big" else 8e-3
        return 0.0, abs(math.log(cal.backend("sglang").step_overhead_s / want))

    _use(monkeypatch, errors)
    rows = _rows(("big", 5), ("b", 1), ("c", 1))
    by_rows = fit_module.fit(rows, prior_calibration(), loss="median")
    by_campaign = fit_module.fit(rows, prior_calibration(), loss="grouped")
    assert by_rows.backend("sglang").step_overhead_s == pytest.approx(1e-3, rel=0.1)
    assert by_campaign.backend("sglang").step_overhead_s == pytest.approx(8e-3, rel=0.1)


def test_an_unknown_loss_is_a_user_error() -> None:
    from gpufleet.errors import UserError

    with pytest.raises(UserError):
        fit_module.fit([], prior_calibration(), loss="mean")


def test_the_log_midpoint_lies_inside_the_bounds() -> None:
    from gpufleet.perf.calibration import BOUNDS

    for key, (lo, hi) in BOUNDS.items():
        assert lo < fit_module.log_midpoint(key) < hi


def test_an_engine_s_moe_constants_stay_at_the_start_without_moe_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dense-only engine's MoE kernel constants touch no row: the midpoint restart must
    not carry them off to the middle of their bounds (a held-out MoE model would get
    them). The search is stubbed so that the restart's result is the one kept."""
    starts: list[Calibration] = []

    def descend(search: Any, cal: Calibration, steps: Any, **_: Any) -> tuple[Calibration, float]:
        starts.append(cal)
        return cal, 1.0 if len(starts) % 2 else 0.0  # the second (midpoint) start wins

    monkeypatch.setattr(fit_module, "descend", descend)
    start = prior_calibration()
    rows = [
        SimpleNamespace(backend="sglang", model_path="meta-llama/Llama-3.1-8B"),
        SimpleNamespace(backend="vllm", model_path="meta-llama/Llama-3.1-8B"),
        SimpleNamespace(backend="vllm", model_path="Qwen/Qwen3-235B-A22B"),
    ]
    got = fit_module.fit(rows, start)
    for key in fit_module.MOE_BACKEND_CONSTANTS:
        assert getattr(got.backend("sglang"), key) == getattr(start.backend("sglang"), key)
        assert getattr(got.backend("vllm"), key) == pytest.approx(fit_module.log_midpoint(key))
    # The dense-only engine's other constants still moved to the midpoint.
    assert got.backend("sglang").step_overhead_s == pytest.approx(
        fit_module.log_midpoint("step_overhead_s")
    )


def test_tpot_grouped_loss_lets_a_minority_campaign_set_a_constant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under the overall median a campaign with a minority of the rows can sit wholly
    above the median TPOT error and move nothing; "tpot_grouped" weighs each campaign's
    TPOT median once (TTFT stays the overall median)."""

    def errors(cal: Calibration, row: Any, recipes: bool) -> tuple[float, float]:
        if row.model_path == "minority":
            return 0.0, abs(math.log(cal.backend("sglang").step_overhead_s / 0.01))
        return 0.0, 0.0

    _use(monkeypatch, errors)
    rows = _rows(("majority", 3), ("minority", 1))
    start = prior_calibration()
    median = fit_module.fit(rows, start, restarts=False)
    assert median.backend("sglang").step_overhead_s == start.backend("sglang").step_overhead_s
    grouped = fit_module.fit(rows, start, restarts=False, loss="tpot_grouped")
    assert grouped.backend("sglang").step_overhead_s == pytest.approx(0.01, rel=0.05)


def test_engine_loss_lets_a_minority_engine_set_its_constants(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under the overall median an engine with a minority of the rows sets none of its
    constants; the "engine" loss (the metrics per engine, averaged) lets it."""

    def errors(cal: Calibration, row: Any, recipes: bool) -> tuple[float, float]:
        if row.backend == "sglang":
            return abs(math.log(cal.backend("sglang").ttft_overhead_s / 0.1)), 0.0
        return 0.0, 0.0

    _use(monkeypatch, errors)
    rows = [SimpleNamespace(backend="sglang", model_path="m")] + [
        SimpleNamespace(backend="trtllm", model_path="m") for _ in range(3)
    ]
    start = prior_calibration()
    median = fit_module.fit(rows, start, restarts=False)
    assert median.backend("sglang").ttft_overhead_s == start.backend("sglang").ttft_overhead_s
    by_engine = fit_module.fit(rows, start, restarts=False, loss="engine")
    assert by_engine.backend("sglang").ttft_overhead_s == pytest.approx(0.1, rel=0.05)


def test_the_search_scores_no_point_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """A point scored once can never be accepted later (the best only falls): the reverse
    of an accepted step is skipped, not predicted again."""
    seen: list[tuple[float, ...]] = []

    def errors(cal: Calibration, row: Any, recipes: bool) -> tuple[float, float]:
        b = cal.backend("sglang")
        seen.append(tuple(float(f"{v:.9g}") for v in dataclasses.astuple(b)))
        return 0.0, abs(math.log(b.step_overhead_s / 8e-3)) + abs(
            math.log(b.seq_overhead_s / 50e-6)
        )

    _use(monkeypatch, errors)
    monkeypatch.setattr(fit_module, "FITTED_SCALARS", ())
    got = fit_module.fit(_rows(("m", 1)), prior_calibration(), restarts=False)
    assert got.backend("sglang").step_overhead_s == pytest.approx(8e-3, rel=0.1)
    assert len(seen) > 10 and len(set(seen)) == len(seen), "a point was scored twice"
