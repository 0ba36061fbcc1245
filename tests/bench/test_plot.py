from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpufleet.bench.metrics import summarize
from gpufleet.bench.overhead import ClientOverhead
from gpufleet.bench.records import RequestRecord
from gpufleet.bench.report import BenchReport, SweepReport
from gpufleet.errors import UserError


def _report(scale: float) -> BenchReport:
    recs = [
        RequestRecord(
            start_s=i,
            token_times_s=[i + 0.1 * scale, i + 0.2 * scale],
            usage_completion_tokens=2,
            ok=True,
        )
        for i in range(5)
    ]
    return BenchReport(
        config={},
        metrics=summarize(recs, 5.0),
        client=ClientOverhead(0.1, 0.2, 0.3, 0.1, None, None),
        ttfts_s=[0.1 * scale] * 5,
        tpots_s=[0.1 * scale] * 5,
        e2els_s=[0.2 * scale] * 5,
    )


def test_plots_are_written(tmp_path: Path) -> None:
    from gpufleet.bench.plot import plot_report, plot_sweep

    plot_report(_report(1.0), tmp_path / "one.png")
    sweep = SweepReport("rate", [1.0, 2.0], [_report(1.0), _report(3.0)], 0, "test")
    plot_sweep(sweep, tmp_path / "sweep.png")
    assert (tmp_path / "one.png").stat().st_size > 1000
    assert (tmp_path / "sweep.png").stat().st_size > 1000


def test_missing_matplotlib_is_a_clear_user_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from gpufleet.bench import plot

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    with pytest.raises(UserError) as e:
        plot.plot_report(_report(1.0), tmp_path / "x.png")
    assert e.value.field == "--plot" and "gpufleet[plot]" in str(e.value)
