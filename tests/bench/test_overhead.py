import pytest

from gpufleet.bench.overhead import ClientOverhead


def test_overhead_tells_a_busy_client_from_a_busy_machine() -> None:
    busy = ClientOverhead(5.0, 30.0, 40.0, 0.97, None, None)
    assert busy.saturated and not busy.starved
    starved = ClientOverhead(5.0, 30.0, 40.0, 0.2, None, None)
    assert starved.starved and not starved.saturated
    fine = ClientOverhead(0.2, 1.0, 2.0, 0.3, 0.1, 0.5)
    assert not fine.saturated and not fine.starved
    assert fine.to_dict()["schedule_lag_p99_ms"] == 0.5


def test_loop_lag_report_from_recorded_lags() -> None:
    from gpufleet.bench.overhead import LoopLagMonitor

    mon = LoopLagMonitor()
    mon.lags_s = [0.001, 0.002, 0.003, 0.010]
    mon.cpu_s, mon.wall_s = 0.5, 2.0
    rep = mon.report([0.0, 0.004])
    assert rep.loop_lag_mean_ms == pytest.approx(4.0)
    assert rep.loop_lag_max_ms == pytest.approx(10.0)
    assert rep.cpu_util == 0.25
    assert rep.schedule_lag_mean_ms == pytest.approx(2.0)
    assert mon.report(None).schedule_lag_mean_ms is None
