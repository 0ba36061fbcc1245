"""The autoscale study's two static baselines: the smallest fixed fleet meeting 99 % of all
requests, and the one sized for the peak (99 % in every minute), found by the same search."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
pytestmark = pytest.mark.process  # (importing the study's modules asks git for the commit)


@pytest.fixture()
def study(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import autoscale_study

    return autoscale_study


def _row(n: int, overall: float, worst: float) -> dict[str, Any]:
    return {"name": f"static {n}", "attainment_requests": overall, "attainment_windows": 1.0,
            "attainment_worst_minute": worst, "worst_minute": 31}  # fmt: skip


# overall attainment meets 99 % from 12 replicas; every minute only from 15
FLEETS = {n: _row(n, 0.97 + 0.01 * (n - 10), 0.90 + 0.03 * (n - 12)) for n in range(8, 20)}


def test_the_peak_fleet_is_the_smallest_meeting_every_minute_not_the_overall_target(
    study: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[int] = []

    def run_jobs(jobs: list[dict[str, Any]], workers: int) -> list[dict[str, Any]]:
        sizes = [int(j["name"].split()[1]) for j in jobs]
        ran.extend(sizes)
        return [FLEETS[n] for n in sizes]

    class Base:
        def with_field(self, name: str, value: int) -> int:
            return value

    monkeypatch.setattr(study, "run_jobs", run_jobs)
    static, tried = study.static_fleet(Base(), 10, 2)
    assert static["name"] == "static 12"
    peak, tried = study.static_fleet(Base(), 12, 2, study.meets_every_minute, dict(tried))
    assert peak["name"] == "static 15"
    assert [n for n, _ in tried] == [9, 10, 11, 12, 13, 14, 15]
    assert sorted(ran) == [9, 10, 11, 12, 13, 14, 15]  # nothing run twice


def test_the_peak_search_starts_where_the_oracle_sweep_says(study: Any, tmp_path: Path) -> None:
    def sweep(worst_good: dict[int, int]) -> dict[str, Any]:
        return {"setup": {"copies": 10, "start_s": 0.0, "duration_s": None},
                "sweep": [{"replicas": n, "minutes": {"0": {"good": 100, "n": 100},
                                                      "31": {"good": g, "n": 100}}}
                          for n, g in worst_good.items()]}  # fmt: skip

    path = tmp_path / "oracle.json"
    args = argparse.Namespace(oracle=path, copies=10, start_s=0.0, duration_s=None)
    path.write_text(json.dumps(sweep({12: 92, 13: 96, 14: 97})))
    assert study.peak_start(args, 12) == 15  # none holds every minute: one above the sweep
    path.write_text(json.dumps(sweep({12: 92, 13: 99, 14: 100})))
    assert study.peak_start(args, 12) == 13
    args.copies = 3  # another slice: the sweep says nothing
    assert study.peak_start(args, 12) == 12


def test_the_study_passes_an_explicit_off_and_leaves_the_defaults_to_the_policies(
    study: Any,
) -> None:
    """With routing's prefill weight 4 and `default`'s 60 s join quiet now the defaults,
    `--prefill-weight 1` / `--join-quiet-s 0` must reach the policies (an option equal to
    the old default was dropped, which would now run the new default), and no flag must
    pass nothing, so that the policies' own defaults apply."""
    assert study.routing_options(None) == ()
    assert study.routing_options(1.0) == (("prefill_weight", 1.0),)
    assert "capacity_join_quiet_s" not in study.policy_params("default", 100)
    assert study.policy_params("default", 100, join_quiet_s=0.0)["capacity_join_quiet_s"] == 0.0
    args = argparse.Namespace(prefill_weight=None, join_quiet_s=None)
    assert study.effective_options(args) == {"prefill_weight": 4.0, "join_quiet_s": 60.0}
    # and the old defaults, all off (the forecast's None written as none):
    assert study.default_params(["forecast_rise_z=none", "headroom_fraction=0.2"]) == {
        "forecast_rise_z": None,
        "headroom_fraction": 0.2,
    }
